import type { MailDraft } from '../../mail/outbox.js'

// The words of the recovery messages. Plain text; the link on a line of its
// own, so that every mail client makes it clickable.

export function passwordResetMail(link: string, ttlSeconds: number): MailDraft {
  const minutes = Math.round(ttlSeconds / 60)
  return {
    type: 'mail.password_reset',
    subject: 'Reset your password',
    text: [
      'Someone asked to reset the password of the account with this e-mail address.',
      `To choose a new password, open this link within ${minutes} minutes:`,
      '',
      link,
      '',
      'If it was not you, ignore this message: your password stays as it is.',
    ].join('\n'),
    link,
  }
}

export function verifyEmailMail(link: string): MailDraft {
  return {
    type: 'mail.verify_email',
    subject: 'Confirm your e-mail address',
    text: [
      'To confirm that this e-mail address is yours, open this link:',
      '',
      link,
      '',
      'If you did not ask for an account, ignore this message.',
    ].join('\n'),
    link,
  }
}

export function emailChangedMail(): MailDraft {
  return {
    type: 'mail.email_changed',
    subject: 'Your e-mail address was changed',
    text: [
      'The e-mail address of your account was just changed from this address to another one.',
      'If you did this, there is nothing to do.',
      "If you did not, your account may be in someone else's hands: reset your password and tell the service's " +
        'administrators.',
    ].join('\n'),
    link: null,
  }
}
