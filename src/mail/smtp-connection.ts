import { connect as connectTcp, type Socket } from 'node:net'
import { connect as connectTls, rootCertificates } from 'node:tls'
import { isIP } from 'node:net'
import { withDeadline } from '../core/lib/settled-by.js'
import { MailSendError } from './message.js'
import type { SmtpServer } from './smtp-url.js'

// One SMTP connection: a socket, the replies read from it (RFC 5321 4.2: a
// three-digit code, "-" on every line but the last of a multi-line reply),
// a time limit on every step, and the switch to TLS. It knows nothing of
// the dialogue (src/mail/smtp.ts). Every failure is a MailSendError whose
// text names the server and the step; 4xx and connection failures are
// transient, 5xx permanent.

export interface Reply {
  code: number
  /** The text of each line, without the code (an enhanced status code, RFC 3463, stays in it). */
  lines: string[]
}

/** A hostile or broken server cannot make the client hold a reply of any size. */
const MAX_LINE = 4096
const MAX_LINES = 200
/** A server's text in an error is shortened and stripped of control characters: it goes to a log. */
/**
 * A server's words as an error may carry them into the log and the outbox
 * row: without control characters, bounded, and without the addresses they
 * name (a refusal often repeats the recipient's).
 */
const quoted = (text: string) =>
  text
    .replace(/[\p{Cc}]/gu, ' ')
    .replace(/[^\s<>"'(),;:@]+@[^\s<>"'(),;:]+/g, 'address')
    .slice(0, 300)

export interface ConnectionOptions {
  /** Each step's limit, in milliseconds. */
  timeoutMs: number
  /** Certificates trusted besides Node's (its bundled CAs and NODE_EXTRA_CA_CERTS): for tests. */
  trustedCertificates?: readonly string[]
}

export class SmtpConnection {
  private socket: Socket
  private buffer = ''
  private lines: string[] = []
  private replies: Reply[] = []
  private waiting?: { resolve: (reply: Reply) => void; reject: (error: Error) => void }
  private failure?: Error
  /** The steps under way, failed at once when the connection breaks. */
  private readonly aborts = new Set<(error: Error) => void>()

  private constructor(
    readonly server: SmtpServer,
    private readonly options: ConnectionOptions,
    socket: Socket,
  ) {
    this.socket = socket
    this.listen(socket)
  }

  /** A connection whose socket is up (TCP, or TLS for smtps://), within the time limit. */
  static async open(server: SmtpServer, options: ConnectionOptions): Promise<SmtpConnection> {
    const socket =
      server.security === 'tls' ? connectTls(tlsOptions(server, options)) : connectTcp(server.port, server.host)
    const connection = new SmtpConnection(server, options, socket)
    await connection.within(
      server.security === 'tls' ? 'connecting (TLS)' : 'connecting',
      new Promise<void>((resolve) =>
        socket.once(server.security === 'tls' ? 'secureConnect' : 'connect', () => resolve()),
      ),
    )
    return connection
  }

  /** This end's address (for EHLO's address literal). */
  get localAddress(): string | undefined {
    return this.socket.localAddress
  }

  /** Sends one command line and reads its reply; `shown` stands for the line in errors (AUTH's carries a secret). */
  async command(line: string, shown = line): Promise<Reply> {
    this.write(`${line}\r\n`)
    return this.reply(shown)
  }

  /** Writes without waiting (the message's data). */
  write(data: string): void {
    if (!this.failure) this.socket.write(data)
  }

  /** The next reply, within the time limit; `step` names what it answers in errors. */
  reply(step: string, timeoutMs = this.options.timeoutMs): Promise<Reply> {
    const next = this.replies.shift()
    if (next) return Promise.resolve(next)
    if (this.failure) return Promise.reject(this.failure)
    return this.within(step, new Promise<Reply>((resolve, reject) => (this.waiting = { resolve, reject })), timeoutMs)
  }

  /**
   * `reply` must have one of the codes `expected` (e.g. [250]); else the error says the step and the server's words.
   */
  expect(reply: Reply, step: string, expected: readonly number[]): Reply {
    if (expected.includes(reply.code)) return reply
    throw this.refusal(reply, step)
  }

  /**
   * The error for a reply that refuses a step: permanent for 5xx (trying again gets the same answer), else transient.
   */
  refusal(reply: Reply, step: string): MailSendError {
    const text = `${reply.code} ${reply.lines.map(quoted).join(' / ')}`.trim()
    return new MailSendError(`SMTP ${this.where()}: ${step} refused: ${text}`, reply.code >= 500 && reply.code < 600)
  }

  /** Fails with a reason that no reply gives (a missing extension): permanent unless said otherwise. */
  fail(reason: string, permanent = true): MailSendError {
    return new MailSendError(`SMTP ${this.where()}: ${reason}`, permanent)
  }

  /** STARTTLS accepted: the same socket goes on inside TLS, the server's certificate checked. */
  async startTls(): Promise<void> {
    // RFC 3207 6: what the server sent after its 220 came in clear, and could be a man in the middle's; it is an error,
    // never a reply.
    if (this.buffer || this.replies.length) {
      const error = this.fail('the server sent data after its STARTTLS reply, before TLS began', false)
      this.broken(error)
      throw error
    }
    const plain = this.socket
    plain.removeAllListeners('data')
    const secured = connectTls({ ...tlsOptions(this.server, this.options), socket: plain })
    this.socket = secured
    this.listen(secured)
    await this.within('TLS handshake', new Promise<void>((resolve) => secured.once('secureConnect', () => resolve())))
  }

  /**
   * Ends the session: QUIT and its reply while the connection is whole (a
   * server logs a session cut short as an error), then TLS's close_notify
   * and the end of the socket.
   */
  async quit(): Promise<void> {
    if (!this.failure) await this.command('QUIT').catch(() => undefined)
    this.socket.end()
    setTimeout(() => this.socket.destroy(), 1000).unref()
  }

  /** Cuts the connection at once. */
  close(): void {
    this.socket.destroy()
  }

  private where(): string {
    return `${this.server.host}:${this.server.port}`
  }

  private listen(socket: Socket): void {
    socket.setEncoding('latin1')
    socket.on('data', (chunk: string) => this.received(chunk))
    socket.on('error', (error: NodeJS.ErrnoException) => this.broken(this.connectionError(error)))
    socket.on('close', () => this.broken(this.fail('the server closed the connection', false)))
  }

  private connectionError(error: NodeJS.ErrnoException): MailSendError {
    const code = error.code ?? ''
    if (/CERT|SELF_SIGNED|HOSTNAME|ERR_TLS|UNABLE_TO/.test(code)) {
      // Transient: the mail waits in the outbox until the server's certificate, or the trust of it, is put right.
      return this.fail(
        `the server's TLS certificate is not trusted ` +
          `(${code}: ${quoted(error.message)}); nothing was sent. Trust its CA with NODE_EXTRA_CA_CERTS, or fix the ` +
          `certificate`,
        false,
      )
    }
    return this.fail(`connection failed (${code || quoted(error.message)})`, false)
  }

  private received(chunk: string): void {
    this.buffer += chunk
    for (let end = this.buffer.indexOf('\n'); end >= 0; end = this.buffer.indexOf('\n')) {
      const line = this.buffer.slice(0, end).replace(/\r$/, '')
      this.buffer = this.buffer.slice(end + 1)
      this.line(line)
    }
    if (this.buffer.length > MAX_LINE) this.broken(this.fail('the server sent a line longer than any reply', false))
  }

  private line(line: string): void {
    const match = /^([2-5][0-9][0-9])([ -]|$)(.*)$/.exec(line)
    if (!match || this.lines.length >= MAX_LINES)
      return this.broken(this.fail(`the server's answer is not an SMTP reply: ${quoted(line.slice(0, 80))}`, false))
    this.lines.push(match[3]!)
    if (match[2] === '-') return
    const reply = { code: Number(match[1]), lines: this.lines }
    this.lines = []
    if (this.waiting) {
      this.waiting.resolve(reply)
      this.waiting = undefined
    } else this.replies.push(reply)
  }

  private broken(error: Error): void {
    if (this.failure) return
    this.failure = error
    this.waiting?.reject(error)
    this.waiting = undefined
    for (const abort of this.aborts) abort(error)
    this.socket.destroy()
  }

  private async within<T>(step: string, work: Promise<T>, timeoutMs = this.options.timeoutMs): Promise<T> {
    if (this.failure) throw this.failure
    // A connection that breaks meanwhile (another step's time-out, a reset) ends this step with its error.
    let abort!: (error: Error) => void
    const broke = new Promise<never>((_, reject) => (abort = reject))
    this.aborts.add(abort)
    try {
      return await withDeadline(Promise.race([work, broke]), timeoutMs, () => {
        this.broken(this.fail(`no answer to ${step} within ${timeoutMs / 1000} s`, false))
        throw this.failure
      })
    } finally {
      this.aborts.delete(abort)
    }
  }
}

function tlsOptions(server: SmtpServer, options: ConnectionOptions) {
  return {
    host: server.host,
    port: server.port,
    // RFC 6066 3: the server name indication carries a host name, never
    // an address; the certificate is checked against either.
    ...(isIP(server.host) ? {} : { servername: server.host }),
    ...(options.trustedCertificates ? { ca: [...rootCertificates, ...options.trustedCertificates] } : {}),
    minVersion: 'TLSv1.2' as const,
  }
}
