import type { Config } from '../config.js'
import { ConfigError } from '../core/config-error.js'
import type { Logger } from '../core/log.js'
import { createConsoleTransport } from './console.js'
import type { MailTransport } from './message.js'

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
    // --- SMTP: createSmtpTransport from './smtp.js' plugs in here (settings: mail.smtpUrl, mail.from). ---
    throw new ConfigError('SMTP_URL: the SMTP transport is not built yet')
  }
  if (mail.hookUrl !== undefined) {
    // --- The hook: createHookTransport from './hook.js' plugs in here (settings: mail.hookUrl, mail.hookSecret). ---
    throw new ConfigError('MAIL_HOOK_URL: the mail hook transport is not built yet')
  }
  if (config.production) {
    log.warn(MAIL_NOT_CONFIGURED)
    return undefined
  }
  log.info('mail goes to standard error (development, neither SMTP_URL nor MAIL_HOOK_URL set)')
  return createConsoleTransport()
}
