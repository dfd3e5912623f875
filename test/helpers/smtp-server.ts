import { spawn } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { selfSignedCertificate } from './certificates.js'
import { superviseChild } from './child-process.js'
import type { ServerOptions } from './smtp-server-process.js'

// A real SMTP server process for the SMTP transport's tests: Nodemailer's
// `smtp-server` (a pinned dev dependency: a complete server side of RFC 5321
// with STARTTLS, implicit TLS and AUTH PLAIN and LOGIN) run by
// test/helpers/smtp-server-process.ts on a free loopback port, with a
// certificate made for the test. Debian's exim4 or postfix would be a system
// MTA installed as root for one test file (postfix's AUTH also needs Cyrus
// SASL or Dovecot). The test reads back what the server delivered into its
// maildir, and what it saw (every AUTH and MAIL FROM with whether the session
// was encrypted at that moment), so that a test can show that nothing was
// said in clear. Stopped in `after`.

export interface ReceivedMail {
  from: string
  to: string[]
  /** The message as delivered into the maildir. */
  raw: Buffer
  /** Whether the session was encrypted when the message came. */
  secure: boolean
}

export interface SmtpServerOptions {
  /** `starttls` (offered, the default), `implicit` (TLS from the first byte: smtps://) or `none` (STARTTLS not offered). */
  tls?: ServerOptions['tls']
  /** The AUTH mechanisms offered (default PLAIN and LOGIN). */
  authMethods?: Array<'PLAIN' | 'LOGIN'>
  /** The reply to RCPT TO instead of accepting it (a 4xx or 5xx code and its text). */
  refuseRecipient?: { code: number; text: string }
}

export interface TestSmtpServer {
  port: number
  /** The server's certificate (self-signed, for 127.0.0.1): what a client must trust. */
  ca: string
  user: string
  password: string
  /** The messages in the maildir, in the order they came. */
  received(): ReceivedMail[]
  /** Every AUTH attempt: its mechanism, whether the session was encrypted, whether the credentials were right. */
  auths(): Array<{ method: string; secure: boolean; accepted: boolean }>
  /** Every MAIL FROM, with whether the session was encrypted. */
  mailFroms(): Array<{ address: string; secure: boolean }>
  /** Connections accepted. */
  connections(): number
}

/** The one account the server knows; the password has characters a URL must percent-encode. */
const USER = 'mailer@example.com'
const PASSWORD = 'p@ss:wörd/%#?'
const SCRIPT = new URL('./smtp-server-process.ts', import.meta.url).pathname

export async function startSmtpServer(options: SmtpServerOptions = {}): Promise<TestSmtpServer> {
  const dir = mkdtempSync(join(tmpdir(), 'upa-smtp-'))
  const certificate = selfSignedCertificate(dir, 'smtp')
  const settings: ServerOptions = { tls: options.tls ?? 'starttls', authMethods: options.authMethods ?? ['PLAIN', 'LOGIN'], refuseRecipient: options.refuseRecipient, user: USER, password: PASSWORD }
  const child = spawn(process.execPath, ['--import', 'tsx', SCRIPT, JSON.stringify(settings), dir], { stdio: ['ignore', 'pipe', 'pipe'] })
  let output = ''
  child.stdout.setEncoding('utf8').on('data', (text: string) => (output += text))
  child.stderr.setEncoding('utf8').on('data', (text: string) => (output += text))
  const supervised = superviseChild(child)
  after(async () => {
    await supervised.stop()
    rmSync(dir, { recursive: true, force: true })
  })
  for (const deadline = Date.now() + 15_000; !/^listening \d+$/m.test(output);) {
    if (!supervised.running() || Date.now() > deadline) throw new Error(`the SMTP server did not start:\n${output}`)
    await sleep(20)
  }
  const port = Number(/^listening (\d+)$/m.exec(output)![1])

  const events = (): Array<Record<string, unknown>> => {
    const file = join(dir, 'events.jsonl')
    return existsSync(file) ? readFileSync(file, 'utf8').split('\n').filter(Boolean).map((line) => JSON.parse(line) as Record<string, unknown>) : []
  }
  const ofType = <T>(type: string): T[] => events().filter((e) => e.type === type).map(({ type: _, ...rest }) => rest as T)
  return {
    port,
    ca: certificate.pem,
    user: USER,
    password: PASSWORD,
    received: () => ofType<{ file: string; from: string; to: string[]; secure: boolean }>('data')
      .map(({ file, ...envelope }) => ({ ...envelope, raw: readFileSync(join(dir, 'mail', 'new', file)) })),
    auths: () => ofType('auth'),
    mailFroms: () => ofType('mail'),
    connections: () => ofType('connect').length,
  }
}
