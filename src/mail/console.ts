import type { MailMessage, MailTransport } from './message.js'

// Development's transport when no mail is configured: each message is
// written whole to standard error, as Django's console e-mail backend
// does, so that a developer can follow a reset link without a mail server.
// Standard error, not the log (standard output): the link is a secret, and
// the log is what a deployment keeps. Never chosen
// in production (src/mail/transport.ts).

const RULE = '-'.repeat(72)

/** The message as the console shows it: headers, a blank line, the text. */
export function consoleText(message: MailMessage): string {
  return [
    RULE,
    `Message-ID: ${message.id}`,
    `Type: ${message.type}`,
    `To: ${message.to}`,
    `Subject: ${message.subject}`,
    '',
    message.text,
    RULE,
    '',
  ].join('\n')
}

export function createConsoleTransport(
  write: (text: string) => void = (text) => void process.stderr.write(text),
): MailTransport {
  return {
    name: 'console',
    async send(message) {
      write(consoleText(message))
    },
  }
}
