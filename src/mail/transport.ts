import type { Logger } from '../core/log.js'
import type { MailFrom } from './address.js'
import { createConsoleTransport } from './console.js'
import { createHookTransport } from './hook.js'
import type { MailTransport } from './message.js'
import { createSmtpTransport } from './smtp.js'
import type { SmtpServer } from './smtp-url.js'

// Which transport sends the service's mail, from the configuration alone:
// SMTP_URL → SMTP (src/mail/smtp.ts); MAIL_HOOK_URL → the signed hook
// (src/mail/hook.ts); neither → the console in development, and nothing in
// production, where the recovery endpoints then answer 503
// mail_not_configured (readConfig refuses both at once).

/**
 * How mail goes out, parsed once by src/config.ts: SMTP_URL with
 * MAIL_FROM, MAIL_HOOK_URL with MAIL_HOOK_SECRET, or neither.
 */
export type MailSettings =
  /** The server holds the credentials of SMTP_URL (a secret). */
  | { via: 'smtp'; server: SmtpServer; from: MailFrom }
  /** `secret`: whsec_… (a secret). */
  | { via: 'hook'; url: string; secret: string }
  | { via: 'none' }

export const MAIL_NOT_CONFIGURED =
  'no mail transport: set SMTP_URL (with MAIL_FROM) or MAIL_HOOK_URL (with MAIL_HOOK_SECRET); until then password ' +
  'resets and address verification answer 503 mail_not_configured'

/** The transport of `config`, or undefined in production with none configured (start-up logs MAIL_NOT_CONFIGURED). */
export function mailTransportFor(
  config: { mail: MailSettings; production: boolean },
  log: Logger,
): MailTransport | undefined {
  const { mail } = config
  if (mail.via === 'smtp') {
    log.info('mail goes out by SMTP', {
      host: mail.server.host,
      port: mail.server.port,
      security: mail.server.security,
    })
    return createSmtpTransport({ server: mail.server, from: mail.from })
  }
  if (mail.via === 'hook') {
    log.info('mail goes out through the signed hook', { origin: new URL(mail.url).origin })
    return createHookTransport({ url: mail.url, secret: mail.secret })
  }
  if (config.production) {
    log.warn(MAIL_NOT_CONFIGURED)
    return undefined
  }
  log.info('mail goes to standard error (development, neither SMTP_URL nor MAIL_HOOK_URL set)')
  return createConsoleTransport()
}
