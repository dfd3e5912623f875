import { readFileSync, statSync } from 'node:fs'

// `<NAME>_FILE`: a secret read from the file it names instead of from the
// environment, as Docker and Kubernetes mount secrets (and as the official
// postgres image reads POSTGRES_PASSWORD_FILE). A variable's value shows in
// `docker inspect`, in the pod's spec and in /proc/<pid>/environ; a mounted
// file shows to whoever may read that file.

/** A secret is a line or a few; a path to something large by mistake is not read into memory. */
const MAX_BYTES = 64 * 1024

const reasons: Record<string, string> = {
  ENOENT: 'no such file',
  ENOTDIR: 'no such file',
  EACCES: 'permission denied',
  EPERM: 'permission denied',
  EISDIR: 'a directory, not a file',
  ELOOP: 'a loop of symbolic links',
}

export interface SecretValue {
  /** The secret; undefined when neither `name` nor `name_FILE` is set, or on a problem. */
  value: string | undefined
  /** The file it was read from. */
  file?: string
  /** What is wrong, one line naming the variable to change; never the secret itself. */
  problem?: string
}

/** A line break left once the final newline is taken off. */
const NOT_ONE_LINE = /[\r\n]/

/**
 * Secret `name` from `env`: the variable itself, or the content of the file
 * `<name>_FILE` names, less one trailing newline (what `echo` and most
 * editors leave). Both set is a problem (which one would win is a guess), as
 * is a file that cannot be read or is empty. So is a file of more than one
 * line, or one that is not UTF-8 text: every secret is one line, and a path
 * to the wrong file (JWT_SECRETS_FILE=/etc/shadow, a key in DER) must not
 * start the service on whatever that file holds. An empty variable counts
 * as unset.
 */
export function readSecret(env: Record<string, string | undefined>, name: string): SecretValue {
  const direct = env[name] || undefined
  const file = env[`${name}_FILE`] || undefined
  if (file === undefined) return { value: direct }
  if (direct !== undefined)
    return { value: undefined, file, problem: `${name} and ${name}_FILE: both are set; set one or the other` }
  const unreadable = (why: string): SecretValue => ({
    value: undefined,
    file,
    problem: `${name}_FILE: cannot read ${file} (${why})`,
  })
  let bytes: Buffer
  try {
    // statSync follows symbolic links, which is how Kubernetes mounts each key of a secret.
    if (statSync(file).size > MAX_BYTES) return unreadable(`larger than ${MAX_BYTES / 1024} KiB: not a secret`)
    bytes = readFileSync(file)
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? 'error'
    return unreadable(reasons[code] ?? code)
  }
  // Never a word of the content in a problem: it is what the file holds, the secret or not.
  const refused = (why: string): SecretValue => ({ value: undefined, file, problem: `${name}_FILE: ${file} ${why}` })
  let text: string
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes)
  } catch {
    return refused('is not UTF-8 text: a secret file holds one line of text')
  }
  const value = text.replace(/\r?\n$/, '')
  if (NOT_ONE_LINE.test(value))
    return refused('holds more than one line: a secret file holds one line (and at most a final newline)')
  if (value.includes('\0')) return refused('holds a NUL byte: a secret file holds one line of text')
  if (value === '') return refused('is empty')
  return { value, file }
}
