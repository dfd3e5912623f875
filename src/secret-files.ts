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

/**
 * Secret `name` from `env`: the variable itself, or the content of the file
 * `<name>_FILE` names, less one trailing newline (what `echo` and most
 * editors leave). Both set is a problem (which one would win is a guess), as
 * is a file that cannot be read or is empty. An empty variable counts as unset.
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
  let text: string
  try {
    // statSync follows symbolic links, which is how Kubernetes mounts each key of a secret.
    if (statSync(file).size > MAX_BYTES) return unreadable(`larger than ${MAX_BYTES / 1024} KiB: not a secret`)
    text = readFileSync(file, 'utf8')
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? 'error'
    return unreadable(reasons[code] ?? code)
  }
  const value = text.replace(/\r?\n$/, '')
  if (value === '') return { value: undefined, file, problem: `${name}_FILE: ${file} is empty` }
  return { value, file }
}
