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

/**
 * The notice to the old address of an address change. With a link that puts the address back (EMAIL_RESTORE_URL), it
 * says what the link does, and what to do next: a password reset once the address is back (`passwordReset`: the flow
 * is on), or a new password. Without, it points to the administrators. Never "reset your password" first: a reset
 * link goes to the account's address, the new one.
 */
export function emailChangedMail(
  restore: { link: string; ttlSeconds: number; passwordReset: boolean } | undefined,
): MailDraft {
  const changed = [
    'The e-mail address of your account was just changed from this address to another one.',
    'If you did this, there is nothing to do.',
  ]
  if (restore === undefined) {
    return {
      type: 'mail.email_changed',
      subject: 'Your e-mail address was changed',
      text: [
        ...changed,
        "If you did not, your account may be in someone else's hands: tell the service's administrators, who can " +
          'put this address back.',
      ].join('\n'),
      link: null,
    }
  }
  const days = Math.round(restore.ttlSeconds / 86400)
  return {
    type: 'mail.email_changed',
    subject: 'Your e-mail address was changed',
    text: [
      ...changed,
      "If you did not, your account may be in someone else's hands. To put this address back on it and sign out " +
        `every session, access token and API key of the account, open this link within ${days} days:`,
      '',
      restore.link,
      '',
      restore.passwordReset
        ? 'Then ask for a password reset: with this address back, its link comes here, and whoever changed the ' +
          'address may know your password.'
        : "Then choose a new password (if you cannot log in, ask the service's administrators for one): whoever " +
          'changed the address may know your password.',
    ].join('\n'),
    link: restore.link,
  }
}
