import { spawn, spawnSync } from 'node:child_process'
import {
  chmodSync,
  chownSync,
  closeSync,
  existsSync,
  openSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { selfSignedCertificate } from './certificates.js'
import { superviseChild } from './child-process.js'
import { onFreePorts, PortTaken } from './ports.js'
import { installedProgram } from './programs.js'
import { waitUntil } from './wait.js'

// A real mail server for the SMTP transport's tests: Debian's exim4
// (package exim4-daemon-light; `make test` installs it when missing) as a
// daemon of its own on a free loopback port, with a configuration written
// here: a certificate made for the test, STARTTLS (or TLS from the first
// byte, or none), AUTH PLAIN and LOGIN checked against a password file and
// offered only inside TLS (as a submission server does), and every accepted
// message delivered into a maildir the test reads back. Two recipient
// domains make it refuse: defer.test for now (451), bounce.test for good
// (550). What it did is read from its main log. Exim takes a configuration
// of its own (-C) only from a file root owns, so the tests that use it run
// as root, as `make test` does in CI. Stopped in `after`.

export interface EximOptions {
  /**
   * `starttls` (offered, the default), `implicit` (TLS from the first byte: smtps://) or `none` (no TLS; AUTH offered
   * in clear).
   */
  tls?: 'starttls' | 'implicit' | 'none'
  /** The AUTH mechanisms offered (default PLAIN and LOGIN). */
  authMethods?: Array<'PLAIN' | 'LOGIN'>
}

export interface ReceivedMail {
  /** The message as delivered, exim's trace fields (Return-path, Envelope-to, Received) first. */
  raw: Buffer
  /** The message as the client sent it: from its first own field (Date) on. */
  sent: Buffer
}

/** A message exim accepted (its `<=` log line). */
export interface Acceptance {
  from: string
  /** Whether it came inside TLS. */
  tls: boolean
  /** The AUTH mechanism the client used, lower-case ("plain", "login"). */
  auth?: string
}

export interface Exim {
  port: number
  /** The server's certificate (self-signed, for 127.0.0.1): what a client must trust. */
  ca: string
  user: string
  password: string
  /** The messages in the maildir, once `count` have arrived (delivery follows acceptance by a moment). */
  received(count: number): Promise<ReceivedMail[]>
  accepted(): Acceptance[]
  /** AUTH attempts refused. */
  authFailures(): number
  /** For each connection that ended without a message: the commands the client sent (exim's C= list). */
  withoutMail(): Promise<string[][]>
  /** Connections accepted. */
  connections(): number
  log(): string
}

/** The one account the server knows; the password has characters a URL must percent-encode. */
const USER = 'mailer@example.com'
const PASSWORD = 'p@ss:wörd/%#?'
const EXIM_USER = 'Debian-exim'

const authenticators = {
  PLAIN: `plain:
  driver = plaintext
  public_name = PLAIN
  server_prompts = :
  server_condition = \${if eq{$auth3}{\${lookup{$auth2}lsearch{DIR/passwd}{$value}fail}}}
  server_set_id = $auth2`,
  LOGIN: `login:
  driver = plaintext
  public_name = LOGIN
  server_prompts = Username:: : Password::
  server_condition = \${if eq{$auth2}{\${lookup{$auth1}lsearch{DIR/passwd}{$value}fail}}}
  server_set_id = $auth1`,
}

function configuration(
  dir: string,
  port: number,
  { tls = 'starttls', authMethods = ['PLAIN', 'LOGIN'] }: EximOptions,
): string {
  return `
primary_hostname = mx.test
local_interfaces = 127.0.0.1
daemon_smtp_ports = ${port}
spool_directory = ${dir}/spool
log_file_path = ${dir}/log/%slog
pid_file_path = ${dir}/exim.pid
keep_environment =
host_lookup =
log_selector = +smtp_connection +smtp_no_mail
tls_certificate = ${dir}/smtp.cert.pem
tls_privatekey = ${dir}/smtp.key.pem
tls_advertise_hosts = ${tls === 'none' ? '' : '*'}
${tls === 'implicit' ? `tls_on_connect_ports = ${port}` : ''}
auth_advertise_hosts = ${tls === 'none' ? '*' : '${if eq{$tls_in_cipher}{}{}{*}}'}
acl_smtp_rcpt = check_recipient

begin acl
check_recipient:
  defer   domains = defer.test
          message = 4.3.0 Try again later
  deny    domains = bounce.test
          message = 5.1.1 <$local_part@$domain>: No such user
  accept  authenticated = *
  deny    message = 5.7.1 Authentication required

begin routers
everyone:
  driver = accept
  transport = maildir

begin transports
maildir:
  driver = appendfile
  directory = ${dir}/mail
  maildir_format
  create_directory
  user = ${EXIM_USER}
  return_path_add
  envelope_to_add

begin authenticators
${authMethods.map((m) => authenticators[m].replaceAll('DIR', dir)).join('\n')}
`
}

export async function startExim(options: EximOptions = {}): Promise<Exim> {
  const binary = installedProgram('exim4', 'exim4-daemon-light')
  if (process.getuid?.() !== 0)
    throw new Error(
      'the SMTP tests run exim4 with a configuration of their own, which it accepts only from a file root owns: run ' +
        'them as root (as `make test` in CI does)',
    )
  const owner = spawnSync('id', ['-u', EXIM_USER], { encoding: 'utf8' })
  if (owner.status !== 0) throw new Error(`no ${EXIM_USER} account: is exim4-daemon-light installed?`)
  const uid = Number(owner.stdout)
  const gid = Number(spawnSync('id', ['-g', EXIM_USER], { encoding: 'utf8' }).stdout)

  const dir = mkdtempSync(join(tmpdir(), 'upa-exim-'))
  chmodSync(dir, 0o755)
  const certificate = selfSignedCertificate(dir, 'smtp')
  writeFileSync(join(dir, 'passwd'), `${USER}: ${PASSWORD}\n`)
  for (const sub of ['spool', 'log', 'mail']) mkdirSync(join(dir, sub))
  // The daemon gives up root for the exim account: what it reads and writes is that account's.
  for (const file of ['spool', 'log', 'mail', 'smtp.key.pem', 'smtp.cert.pem', 'passwd'])
    chownSync(join(dir, file), uid, gid)
  // Exim logs that it listens once it does (a probe connection would be logged as one more connection).
  const log = () => (existsSync(join(dir, 'log', 'mainlog')) ? readFileSync(join(dir, 'log', 'mainlog'), 'utf8') : '')
  const { port, child, supervised } = await onFreePorts(1, async ([port]) => {
    writeFileSync(join(dir, 'exim.conf'), configuration(dir, port!, options), { mode: 0o644 })
    // Standard error into a file: a pipe would be inherited by the processes exim forks and hold the test's event loop.
    const stderr = openSync(join(dir, 'stderr.txt'), 'w')
    // A process group of its own: the processes it forks for each connection go with it.
    const child = spawn(binary, ['-C', join(dir, 'exim.conf'), '-bdf'], {
      stdio: ['ignore', 'ignore', stderr],
      detached: true,
    })
    closeSync(stderr)
    const supervised = superviseChild(child)
    for (const deadline = Date.now() + 30_000; !log().includes('daemon started');) {
      const said = readFileSync(join(dir, 'stderr.txt'), 'utf8')
      if (!supervised.running() && /Address already in use/.test(said)) throw new PortTaken(said)
      if (!supervised.running() || Date.now() > deadline) {
        child.kill('SIGKILL')
        throw new Error(`exim did not start on port ${port}:\n${said}`)
      }
      await sleep(20)
    }
    return { port: port!, child, supervised }
  })
  after(async () => {
    // The daemon and what it forked (a connection the client cut may still be logging): all of it at once, nothing
    // there is worth a clean shutdown; the folder goes once none of them runs (the killed linger as zombies
    // where nothing reaps orphans, as in a container: they write nothing).
    try {
      process.kill(-child.pid!, 'SIGKILL')
    } catch {}
    await supervised.stop()
    await waitUntil("exim's processes to end", () => !groupRuns(child.pid!), 5000)
    rmSync(dir, { recursive: true, force: true })
  })
  const skip = log().split('\n').length - 1
  const lines = () => log().split('\n').slice(skip)

  const mailFiles = () => {
    const folder = join(dir, 'mail', 'new')
    return existsSync(folder)
      ? readdirSync(folder)
          .map((f) => join(folder, f))
          .sort((a, b) => statSync(a).mtimeMs - statSync(b).mtimeMs || a.localeCompare(b))
      : []
  }
  return {
    port,
    ca: certificate.pem,
    user: USER,
    password: PASSWORD,
    async received(count) {
      await waitUntil(`${count} message(s) in the maildir`, () => mailFiles().length >= count)
      return mailFiles().map((file) => {
        const raw = readFileSync(file)
        return { raw, sent: raw.subarray(raw.indexOf('\nDate: ') + 1) }
      })
    },
    accepted: () =>
      lines().flatMap((line) => {
        const m = / <= (\S+) /.exec(line)
        if (!m) return []
        const auth = / A=(\w+):/.exec(line)?.[1]
        return [{ from: m[1]!, tls: / X=TLS/.test(line), ...(auth ? { auth } : {}) }]
      }),
    authFailures: () => lines().filter((line) => /authenticator failed/.test(line)).length,
    async withoutMail() {
      // Exim writes the line once the connection has ended, a moment after the client is gone.
      const ended = () => lines().filter((line) => line.includes('no MAIL in SMTP connection'))
      await waitUntil('exim to log the connection without mail', () => ended().length > 0)
      return ended().map((line) => /C=(\S+)/.exec(line)?.[1]?.split(',') ?? [])
    },
    connections: () => lines().filter((line) => /SMTP connection from .*\(TCP\/IP connection count/.test(line)).length,
    log: () => lines().join('\n'),
  }
}

/**
 * Whether a process of process group `group` still runs (Linux: /proc/<pid>/stat, whose fields after the name are
 * state, ppid, pgrp).
 */
function groupRuns(group: number): boolean {
  return readdirSync('/proc').some((pid) => {
    if (!/^\d+$/.test(pid)) return false
    try {
      const [state, , pgrp] = readFileSync(`/proc/${pid}/stat`, 'utf8')
        .replace(/^.*\) /s, '')
        .split(' ')
      return Number(pgrp) === group && state !== 'Z'
    } catch {
      return false
    }
  })
}
