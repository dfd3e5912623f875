import type { Config } from '../config.js'
import { ConfigError } from '../core/config-error.js'
import type { Logger } from '../core/log.js'
import { parseMailFrom } from './address.js'
import { createConsoleTransport } from './console.js'
import { createHookTransport } from './hook.js'
import type { MailTransport } from './message.js'
import { createSmtpTransport } from './smtp.js'
import { parseSmtpUrl } from './smtp-url.js'

// Which transport sends the service's mail, from the configuration alone:
// SMTP_URL → SMTP (src/mail/smtp.ts); MAIL_HOOK_URL → the signed hook
// (src/mail/hook.ts); neither → the console in development, and nothing in
// production, where the recovery endpoints then answer 503
// mail_not_configured (readConfig refuses both at once).

export const MAIL_NOT_CONFIGURED = 'no mail transport: set SMTP_URL (with MAIL_FROM) or MAIL_HOOK_URL (with MAIL_HOOK_SECRET); until then password resets and address verification answer 503 mail_not_configured'

/** The transport of `config`, or undefined in production with none configured (start-up logs MAIL_NOT_CONFIGURED). */
export function mailTransportFor(config: Config, log: Logger): MailTransport | undefined {
  const { mail } = config
  if (mail.smtpUrl !== undefined) {
    // readConfig checked both: they parse (and MAIL_FROM is set with SMTP_URL).
    const server = parseSmtpUrl(mail.smtpUrl)
    const from = parseMailFrom(mail.from ?? '')
    if (typeof server === 'string' || typeof from === 'string') throw new ConfigError(`SMTP_URL, MAIL_FROM: ${typeof server === 'string' ? server : from}`)
    log.info('mail goes out by SMTP', { host: server.host, port: server.port, security: server.security })
    return createSmtpTransport({ server, from })
  }
  if (mail.hookUrl !== undefined && mail.hookSecret !== undefined) {
    log.info('mail goes out through the signed hook', { origin: new URL(mail.hookUrl).origin })
    return createHookTransport({ url: mail.hookUrl, secret: mail.hookSecret })
  }
  if (config.production) {
    log.warn(MAIL_NOT_CONFIGURED)
    return undefined
  }
  log.info('mail goes to standard error (development, neither SMTP_URL nor MAIL_HOOK_URL set)')
  return createConsoleTransport()
}
