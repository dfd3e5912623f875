// A message the service sends to a person (account recovery, docs/auth.md):
// what the mail outbox holds, and what every transport (SMTP, the signed
// hook, the development console) is given to send. The link carries a
// one-time token, a secret: a message is never logged, never put in an
// event or an error, and its outbox row goes once it has been sent.

export const mailTypes = ['mail.password_reset', 'mail.verify_email', 'mail.email_changed'] as const
export type MailType = (typeof mailTypes)[number]

export interface MailMessage {
  /**
   * The outbox row's id: the same on every attempt, so a receiver can
   * drop a duplicate (the hook's `webhook-id`, SMTP's Message-ID).
   */
  readonly id: string
  readonly type: MailType
  /** One address. */
  readonly to: string
  readonly subject: string
  /** Plain text, UTF-8, lines separated by \n. */
  readonly text: string
  /** The link the text holds (null when the message has none: mail.email_changed without EMAIL_RESTORE_URL). */
  readonly link: string | null
}

/**
 * Why a send failed: `permanent` when trying again cannot help (a 5xx reply, a refused recipient), else it is retried.
 */
export class MailSendError extends Error {
  constructor(
    message: string,
    readonly permanent: boolean,
  ) {
    super(message)
  }
}

/** Sends one message; resolves once the receiving side has taken it, rejects with MailSendError otherwise. */
export interface MailTransport {
  readonly name: 'smtp' | 'hook' | 'console'
  /**
   * `giveUp` aborts when the sender stops waiting (its time for the attempt is
   * out): the transport ends the attempt at once, so that it cannot complete
   * behind the retry that follows (the message would arrive twice).
   */
  send(message: MailMessage, giveUp?: AbortSignal): Promise<void>
  /** Releases what it holds (a kept-open connection), within the deadline (performance.now() milliseconds). */
  close?(deadline: number): Promise<void>
}
