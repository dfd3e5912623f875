import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after } from 'node:test'
import { SMTPServer } from 'smtp-server'
import { selfSignedCertificate } from './certificates.js'

// A real SMTP server for the SMTP transport's tests: Nodemailer's
// `smtp-server` (a pinned dev dependency), a complete server-side
// implementation of RFC 5321 with STARTTLS, implicit TLS and AUTH PLAIN and
// LOGIN, listening on a free loopback port with a certificate made for the
// test. Debian's exim4 or postfix would need a system MTA installed and
// configured as root (postfix's AUTH also needs Cyrus SASL or Dovecot); this
// runs in the test's own process. It keeps what reached it: the messages as
// received (dot-stuffing undone, as a mailbox would hold them), and every
// AUTH and MAIL FROM with whether the session was encrypted at that moment,
// so a test can show that nothing was said in clear. Stopped in `after`.

export interface ReceivedMail {
  from: string
  to: string[]
  /** The message as the server stored it. */
  raw: Buffer
  /** Whether the session was encrypted when the message came. */
  secure: boolean
}

export interface SmtpServerOptions {
  /** `starttls` (offered, the default), `implicit` (TLS from the first byte: smtps://) or `none` (STARTTLS not offered). */
  tls?: 'starttls' | 'implicit' | 'none'
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
  received: ReceivedMail[]
  /** Every AUTH attempt: its mechanism, whether the session was encrypted, whether the credentials were right. */
  auths: Array<{ method: string; secure: boolean; accepted: boolean }>
  /** Every MAIL FROM, with whether the session was encrypted. */
  mailFroms: Array<{ address: string; secure: boolean }>
  /** Connections accepted. */
  connections(): number
}

/** The one account the server knows; the password has characters a URL must percent-encode. */
const USER = 'mailer@example.com'
const PASSWORD = 'p@ss:wörd/%#?'

export async function startSmtpServer(options: SmtpServerOptions = {}): Promise<TestSmtpServer> {
  const mode = options.tls ?? 'starttls'
  const dir = mkdtempSync(join(tmpdir(), 'upa-smtp-'))
  const certificate = selfSignedCertificate(dir, 'smtp')
  const received: ReceivedMail[] = []
  const auths: TestSmtpServer['auths'] = []
  const mailFroms: TestSmtpServer['mailFroms'] = []
  let connections = 0
  const server = new SMTPServer({
    secure: mode === 'implicit',
    key: readFileSync(certificate.key),
    cert: certificate.pem,
    name: 'mx.test',
    authMethods: options.authMethods ?? ['PLAIN', 'LOGIN'],
    disabledCommands: mode === 'none' ? ['STARTTLS'] : [],
    // Without STARTTLS, AUTH in clear is what the client's ?starttls=off asks for (to this machine only).
    allowInsecureAuth: mode === 'none',
    hideENHANCEDSTATUSCODES: false,
    logger: false,
    onConnect(_session, callback) {
      connections += 1
      callback()
    },
    onAuth(auth, session, callback) {
      const accepted = auth.username === USER && auth.password === PASSWORD
      auths.push({ method: auth.method, secure: session.secure, accepted })
      if (accepted) callback(null, { user: auth.username })
      else callback(Object.assign(new Error('Authentication credentials invalid'), { responseCode: 535 }))
    },
    onMailFrom(address, session, callback) {
      mailFroms.push({ address: address.address, secure: session.secure })
      callback()
    },
    onRcptTo(_address, _session, callback) {
      const refusal = options.refuseRecipient
      callback(refusal ? Object.assign(new Error(refusal.text), { responseCode: refusal.code }) : undefined)
    },
    onData(stream, session, callback) {
      const chunks: Buffer[] = []
      stream.on('data', (chunk: Buffer) => chunks.push(chunk))
      stream.on('end', () => {
        received.push({ from: session.envelope.mailFrom ? session.envelope.mailFrom.address : '', to: session.envelope.rcptTo.map((r) => r.address), raw: Buffer.concat(chunks), secure: session.secure })
        callback()
      })
    },
  })
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => resolve())
  })
  const { port } = server.server.address() as { port: number }
  after(async () => {
    await new Promise<void>((resolve) => server.close(() => resolve()))
    rmSync(dir, { recursive: true, force: true })
  })
  return { port, ca: certificate.pem, user: USER, password: PASSWORD, received, auths, mailFroms, connections: () => connections }
}
