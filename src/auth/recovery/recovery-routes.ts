import Type from 'typebox'
import type { AuthServices } from '../services.js'
import { HttpError } from '../../core/http/problem.js'
import { defineRoute } from '../../core/http/route.js'
import { compileValidator } from '../../core/http/validate.js'
import { publicAccess } from '../access.js'
import { userGone } from '../credentials.js'
import { normalizeEmail } from '../login/login-throttle.js'
import { oneTimeTokenHash } from './one-time-tokens.js'
import {
  liveTokenUser,
  mayResendVerification,
  MESSAGES_PER_HOUR,
  queueVerification,
  requestPasswordReset,
  resetPassword,
  restoreEmail,
  verifyEmail,
} from './recovery.js'

// Account recovery's endpoints (the rules: docs/auth.md, "Account
// recovery: rules"). Anonymous but the resend; each anonymous one counts
// against its client address as logins do (LOGIN_RATE_LIMIT a minute, a
// count of its own). A flow whose link template is not configured is off
// (404); with it configured but no way to send mail (production without
// SMTP_URL or MAIL_HOOK_URL), 503 mail_not_configured.

const TokenMember = Type.String({ minLength: 1, maxLength: 200, description: 'the token from the link' })
const ResetRequestBody = Type.Object(
  { email: Type.String({ minLength: 1, maxLength: 254 }) },
  { additionalProperties: false },
)
const ResetConfirmBody = Type.Object(
  {
    token: TokenMember,
    // The rules of every password (POST /users): the same schema.
    password: Type.String({ minLength: 8, maxLength: 256, description: 'a password of 8 to 256 characters' }),
  },
  { additionalProperties: false },
)
const TokenBody = Type.Object({ token: TokenMember }, { additionalProperties: false })

/**
 * Password-reset requests are worked on after their 202 (src/core/background-work.ts): two at a
 * time, 256 held at most, so that the answer and its time are the same whether or not an account
 * has the address, however busy the database is with the accounts that do.
 */
export const defaultRecoveryRequestSettings = { concurrency: 2, capacity: 256 }

const recoveryBusy = () =>
  new HttpError('rate_limited', 'Too many password-reset requests are being worked on; retry shortly.', {
    headers: { 'retry-after': '1' },
  })

const invalidToken = () =>
  new HttpError('invalid_one_time_token', 'The link is invalid, expired or used already; ask for a new one.')

/** The flow's link template; 404 when the flow is off. */
function templateOf(template: string | undefined, variable: string, flow = 'Account recovery'): string {
  if (template === undefined)
    throw new HttpError('not_found', `${flow} is off on this service (${variable} is not set).`)
  return template
}

/** The flow's link template; 404 when the flow is off, 503 when there is no way to send its message. */
function flowOn(services: Pick<AuthServices, 'mail'>, template: string | undefined, variable: string): string {
  const on = templateOf(template, variable)
  if (!services.mail.transport)
    throw new HttpError(
      'mail_not_configured',
      'This service cannot send mail yet (neither SMTP_URL nor MAIL_HOOK_URL is set).',
    )
  return on
}

export const recoveryRoutes = [
  defineRoute({
    method: 'POST',
    path: '/auth/password-reset',
    operationId: 'requestPasswordReset',
    errorStatuses: [404, 429, 503],
    noStore: true,
    summary: "Send a password-reset link to an account's address (202 whether or not an account has it)",
    responses: {
      202: {
        description: 'Accepted: if an account has this address and is under its hourly limit, a message is on its way',
      },
    },
    access: publicAccess,
    body: { kind: 'json', validator: compileValidator(ResetRequestBody) },
    async handle({ body, client, requestId, services }) {
      const template = flowOn(services, services.config.passwordResetUrl, 'PASSWORD_RESET_URL')
      services.logins.admitRecovery(client)
      // A database that is down is said so (503, as to any request that needs it, and to every address
      // alike: the check's answer is shared for a second), rather than a 202 for work that would be lost.
      await services.readiness.database()
      const email = normalizeEmail(body.email)
      const origin = { actorId: null, credential: null, requestId }
      const taken = services.recoveryRequests.submit('password reset', () =>
        requestPasswordReset(
          services.sql,
          email,
          template,
          services.config.passwordResetTtl,
          origin,
          services.config.oidcLocalPasswords,
        ),
      )
      if (!taken) throw recoveryBusy()
      return { status: 202 }
    },
  }),

  defineRoute({
    method: 'POST',
    path: '/auth/password-reset/confirm',
    operationId: 'confirmPasswordReset',
    errorStatuses: [400, 404, 429, 503],
    noStore: true,
    summary: 'Set a new password with the token of a reset link; ends every session, JWT and API key of the account',
    responses: { 204: { description: 'The password is set' } },
    access: publicAccess,
    body: { kind: 'json', validator: compileValidator(ResetConfirmBody) },
    // It waits for a password-hash slot, which must not hold a place under database admission.
    database: 'statements',
    async handle({ body, client, requestId, bounded, services }) {
      flowOn(services, services.config.passwordResetUrl, 'PASSWORD_RESET_URL')
      services.logins.admitRecovery(client)
      const hash = oneTimeTokenHash(body.token)
      // A guess costs a hash and an index lookup, never scrypt: the password is hashed only for a live token.
      if (!hash || (await bounded(() => liveTokenUser(services.sql, hash, 'password_reset'))) === undefined)
        throw invalidToken()
      const passwordHash = await services.passwords.hash(body.password)
      const { oidcLocalPasswords } = services.config
      if (!(await bounded(() => resetPassword(services.sql, hash, passwordHash, requestId, oidcLocalPasswords))))
        throw invalidToken()
      // Its JWTs, sessions and keys were revoked: answer once this instance
      // has heard it (src/auth/revocation/credential-changes.ts).
      await services.credentialChanges.caughtUp()
      return { status: 204 }
    },
  }),

  defineRoute({
    method: 'POST',
    path: '/auth/verify-email',
    operationId: 'verifyEmail',
    errorStatuses: [400, 404, 429],
    noStore: true,
    summary: 'Confirm an address with the token of a verification link',
    responses: { 204: { description: 'The address is verified' } },
    access: publicAccess,
    body: { kind: 'json', validator: compileValidator(TokenBody) },
    async handle({ body, client, requestId, services }) {
      // No mail is sent here: it works without a transport, for links sent before one went away.
      templateOf(services.config.verifyEmailUrl, 'VERIFY_EMAIL_URL', 'Address verification')
      services.logins.admitRecovery(client)
      const hash = oneTimeTokenHash(body.token)
      if (!hash || !(await verifyEmail(services.sql, hash, requestId))) throw invalidToken()
      return { status: 204 }
    },
  }),

  defineRoute({
    method: 'POST',
    path: '/auth/email-restore',
    operationId: 'restoreEmail',
    errorStatuses: [400, 404, 409, 429],
    noStore: true,
    summary:
      'Put back the address an e-mail change replaced, with the token of the link the change sent to it; ends every ' +
      'session, JWT and API key of the account',
    responses: { 204: { description: 'The address is back, verified, and every credential of the account has ended' } },
    access: publicAccess,
    body: { kind: 'json', validator: compileValidator(TokenBody) },
    async handle({ body, client, requestId, services }) {
      // No mail is sent here: it works without a transport, for links sent before one went away.
      templateOf(services.config.emailRestoreUrl, 'EMAIL_RESTORE_URL', 'Restoring an address')
      services.logins.admitRecovery(client)
      const hash = oneTimeTokenHash(body.token)
      const outcome = hash ? await restoreEmail(services.sql, hash, requestId) : 'invalid'
      if (outcome === 'invalid') throw invalidToken()
      if (outcome === 'address_taken') {
        throw new HttpError(
          'restore_address_taken',
          'Another account has this address now, so it cannot be put back; nothing was changed, and the link works ' +
            'again once the address is free.',
        )
      }
      // Its JWTs, sessions and keys were revoked: answer once this instance has heard it.
      await services.credentialChanges.caughtUp()
      return { status: 204 }
    },
  }),

  defineRoute({
    method: 'POST',
    path: '/auth/verify-email/resend',
    operationId: 'resendVerification',
    errorStatuses: [404, 409, 429, 503],
    noStore: true,
    summary: 'Send the caller a new verification link (the older ones stop working)',
    responses: { 204: { description: 'A message is on its way' } },
    access: { kind: 'protected', scope: null, who: 'any' },
    async handle({ principal, services }) {
      flowOn(services, services.config.verifyEmailUrl, 'VERIFY_EMAIL_URL')
      if (principal.kind !== 'user') throw new Error('unreachable: the resend is protected')
      await services.sql.begin(async (tx) => {
        const [user] = await tx<Array<{ id: number; email: string; email_verified_at: string | null }>>`
          SELECT id, email, email_verified_at FROM users WHERE id = ${principal.userId} AND deleted_at IS NULL
          FOR UPDATE`
        if (!user) throw userGone()
        if (user.email_verified_at !== null)
          throw new HttpError('email_already_verified', 'This address is verified already.')
        if (!(await mayResendVerification(tx, user.id))) {
          throw new HttpError(
            'rate_limited',
            `At most ${MESSAGES_PER_HOUR} verification messages an hour; retry later.`,
            { headers: { 'retry-after': '3600' } },
          )
        }
        await queueVerification(tx, services, user)
      })
      return { status: 204 }
    },
  }),
]
