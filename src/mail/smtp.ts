import { hostname } from 'node:os'
import { settledBy } from '../core/lib/settled-by.js'
import { isMailAddress, type MailFrom } from './address.js'
import { MailSendError, type MailMessage, type MailTransport } from './message.js'
import { renderMessage } from './mime.js'
import { SmtpConnection, type Reply } from './smtp-connection.js'
import type { SmtpServer } from './smtp-url.js'

// Mail by SMTP (RFC 5321) with STARTTLS (RFC 3207) and AUTH PLAIN or LOGIN
// (RFC 4954, 4616), on node:net and node:tls. One connection per message:
// the outbox sends a few messages a minute, and a connection kept open
// would need its own keep-alive, reconnection and limits for no gain.

export interface SmtpSettings {
  /** SMTP_URL, parsed (parseSmtpUrl). */
  server: SmtpServer
  /** MAIL_FROM, parsed (parseMailFrom). */
  from: MailFrom
  /** The limit of each step (connecting, the greeting, each command, the end of the data), in milliseconds. */
  timeoutMs?: number
  /** Certificates trusted besides Node's own and NODE_EXTRA_CA_CERTS (tests). */
  trustedCertificates?: readonly string[]
  /** The Date header's clock. */
  now?: () => Date
}

const DEFAULT_TIMEOUT_MS = 30_000
/** RFC 5321 4.5.3.2.6 gives the end of the data the longest wait: the server may check the message before answering. */
const DATA_END_FACTOR = 2

/**
 * RFC 5321 4.1.1.1: EHLO names the client by its fully qualified name or an
 * address literal. A host name that is not a plain DNS name (a container's
 * may be anything) gives way to the literal of the connection's address.
 */
function heloName(server: SmtpServer, localAddress: string | undefined): string {
  const name = server.helo ?? hostname()
  if (/^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*$/.test(name))
    return name
  const address = localAddress?.replace(/^::ffff:/, '') ?? '127.0.0.1'
  return address.includes(':') ? `[IPv6:${address}]` : `[${address}]`
}

/** The extensions an EHLO reply names (every line after the first), upper-cased: keyword → its parameters. */
function extensions(reply: Reply): Map<string, string[]> {
  return new Map(
    reply.lines.slice(1).map((line) => {
      const [keyword = '', ...params] = line.toUpperCase().split(/[ =]/).filter(Boolean)
      return [keyword, params]
    }),
  )
}

/**
 * RFC 5321 4.5.2: a line of data that starts with "." gets another in front.
 * The data ends with "." CRLF after the last line's CRLF (4.1.1.4: that CRLF
 * is the message's own, not one more empty line).
 */
export function dotStuffed(text: string): string {
  const stuffed = text.replace(/^\./gm, '..')
  return `${stuffed}${stuffed.endsWith('\r\n') ? '' : '\r\n'}.\r\n`
}

/**
 * Refuses what would let the message's own fields rewrite the envelope
 * or the header (injection): permanent, nothing is sent.
 */
function checkFields(message: MailMessage): void {
  if (!isMailAddress(message.to))
    throw new MailSendError('SMTP: the recipient is not a plain ASCII address (local@domain); not sent', true)
  if (/[\r\n]/.test(message.subject)) throw new MailSendError('SMTP: the subject holds a line break; not sent', true)
}

export function createSmtpTransport(settings: SmtpSettings): MailTransport {
  const { server, from } = settings
  const timeoutMs = settings.timeoutMs ?? DEFAULT_TIMEOUT_MS
  const now = settings.now ?? (() => new Date())
  /** The connections of the messages under way, and the end of each one's send. */
  const open = new Map<SmtpConnection, Promise<void>>()

  /** EHLO, or HELO when the server refuses EHLO as a command it does not know (5xx): the extensions it offers. */
  async function greet(c: SmtpConnection, name: string): Promise<Map<string, string[]>> {
    const ehlo = await c.command(`EHLO ${name}`)
    if (ehlo.code === 250) return extensions(ehlo)
    if (ehlo.code < 500) throw c.refusal(ehlo, 'EHLO')
    c.expect(await c.command(`HELO ${name}`), 'HELO', [250])
    return new Map()
  }

  async function authenticate(c: SmtpConnection, offered: Map<string, string[]>): Promise<void> {
    if (!server.credentials) return
    const { user, password } = server.credentials
    const mechanisms = offered.get('AUTH') ?? []
    const b64 = (text: string) => Buffer.from(text, 'utf8').toString('base64')
    if (mechanisms.includes('PLAIN')) {
      c.expect(await c.command(`AUTH PLAIN ${b64(`\0${user}\0${password}`)}`, 'AUTH PLAIN'), 'AUTH PLAIN', [235])
    } else if (mechanisms.includes('LOGIN')) {
      c.expect(await c.command('AUTH LOGIN'), 'AUTH LOGIN', [334])
      c.expect(await c.command(b64(user), 'AUTH LOGIN (user)'), 'AUTH LOGIN (user)', [334])
      c.expect(await c.command(b64(password), 'AUTH LOGIN (password)'), 'AUTH LOGIN (password)', [235])
    } else {
      throw c.fail(
        `SMTP_URL has a user and a password, but the server offers no AUTH PLAIN or LOGIN (it ` +
          `offers: ${mechanisms.join(' ') || 'no AUTH'}); nothing was sent`,
      )
    }
  }

  async function deliver(c: SmtpConnection, message: MailMessage): Promise<void> {
    c.expect(await c.reply('the greeting'), 'the greeting', [220])
    const name = heloName(server, c.localAddress)
    let offered = await greet(c, name)
    if (server.security === 'starttls') {
      if (!offered.has('STARTTLS')) {
        throw c.fail(
          'the server does not offer STARTTLS, which SMTP_URL requires (smtp:// without ?starttls=off); nothing was ' +
            'sent in clear. Use smtps:// if the server speaks TLS from the start',
        )
      }
      c.expect(await c.command('STARTTLS'), 'STARTTLS', [220])
      await c.startTls()
      // RFC 3207 4.2: what the server said before TLS is forgotten; it is asked again.
      offered = await greet(c, name)
    }
    await authenticate(c, offered)
    c.expect(await c.command(`MAIL FROM:<${from.address}>`), 'MAIL FROM', [250])
    c.expect(await c.command(`RCPT TO:<${message.to}>`), 'RCPT TO', [250, 251])
    c.expect(await c.command('DATA'), 'DATA', [354])
    c.write(dotStuffed(renderMessage(message, from, now())))
    c.expect(await c.reply('the end of the data', timeoutMs * DATA_END_FACTOR), 'the message', [250])
  }

  return {
    name: 'smtp',
    async send(message, giveUp) {
      checkFields(message)
      const c = await SmtpConnection.open(server, { timeoutMs, trustedCertificates: settings.trustedCertificates })
      // The sender stopped waiting: the session ends now, failing
      // the step under way, so that no 250 can follow the retry.
      const cut = () => c.close()
      if (giveUp?.aborted) cut()
      giveUp?.addEventListener('abort', cut, { once: true })
      const sent = (async () => {
        try {
          await deliver(c, message)
        } finally {
          // After the message was taken, a QUIT that goes wrong changes
          // nothing; after a refusal, it only ends the session.
          await c.quit()
        }
      })()
      open.set(
        c,
        sent.catch(() => undefined),
      )
      try {
        await sent
      } catch (error) {
        if (error instanceof MailSendError) throw error
        // Not a refusal by the server: a fault here, so the message is kept and tried again.
        throw new MailSendError(
          `SMTP ${server.host}:${server.port}: ${error instanceof Error ? error.message : 'unexpected failure'}`,
          false,
        )
      } finally {
        open.delete(c)
        giveUp?.removeEventListener('abort', cut)
      }
    },
    /**
     * Waits for the messages under way until `deadline`, then cuts their connections (they fail as transient: the
     * outbox sends them again).
     */
    async close(deadline) {
      await settledBy(Promise.allSettled(open.values()), deadline)
      for (const c of open.keys()) c.close()
    },
  }
}
