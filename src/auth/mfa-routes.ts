import Type from 'typebox'
import { findUser } from '../accounts/queries.js'
import { HttpError, notFound } from '../core/http/problem.js'
import { defineRoute } from '../core/http/route.js'
import { compileValidator } from '../core/http/validate.js'
import { recordEvents } from '../core/resources/change-events.js'
import type { Access } from './access.js'
import {
  freshProofMembers,
  currentPasswordRequired,
  mfaCodeRequired,
  proveCurrentPassword,
  requireFreshProof,
} from './current-password.js'
import {
  acceptCode,
  beginEnrolment,
  confirmFactor,
  factorState,
  hasFactor,
  newRecoveryCodes,
  RECOVERY_CODE,
  replaceRecoveryCodes,
} from './mfa/factors.js'
import { proveSecondFactor } from './mfa/second-factor.js'
import { otpauthUri, TOTP_CODE } from './mfa/totp.js'
import { originOf } from './origin.js'
import { mfaEvent, withdrawFactor } from './mfa/withdraw.js'
import { sessionOf, type Principal, type UserPrincipal } from './principal.js'
import { revokeSessionsOf } from './sessions/sessions.js'

// A user's own second factor: enrolment (a secret, then a first code turns it
// on and gives the recovery codes), new recovery codes, and turning it off;
// and an admin's removal of another user's factor. Logging in with it is
// src/auth/routes.ts's, and an admin's removal of another user's factor is the users
// module's (src/users/factor-removal.ts). A factor is a login's: a provider token's second
// factor is the provider's, and an API key is never the person.

/** The caller's own factor: any login of this service, even one MFA_REQUIRED holds back until it has one. */
const ownFactor: Access = { kind: 'protected', scope: null, who: 'any', interactive: true, enrolment: true }

const ProofBody = Type.Object(freshProofMembers("the caller's"), { additionalProperties: false })
const Enrolment = Type.Object(
  {
    secret: Type.String({ description: 'base32, for an authenticator app; shown only here' }),
    otpauth_uri: Type.String({ description: 'otpauth://totp/… for a QR code' }),
  },
  { additionalProperties: false },
)
const ConfirmBody = Type.Object(
  { code: Type.String({ pattern: TOTP_CODE.source, description: 'the first code the app shows' }) },
  { additionalProperties: false },
)
const RecoveryCodes = Type.Object(
  {
    recovery_codes: Type.Array(Type.String(), {
      description: 'single-use codes that stand for a code once each; shown only here',
    }),
  },
  { additionalProperties: false },
)
const DisableBody = Type.Object(
  {
    current_password: Type.String({ minLength: 1, maxLength: 256, description: 'the current password' }),
    code: Type.Optional(Type.String({ pattern: TOTP_CODE.source, description: 'a current code' })),
    recovery_code: Type.Optional(Type.String({ pattern: RECOVERY_CODE.source, description: 'or a recovery code' })),
  },
  { additionalProperties: false },
)

function loginOf(principal: Principal): UserPrincipal {
  if (principal.kind !== 'user') throw new Error('unreachable: a protected route')
  if (principal.credential.type === 'oidc')
    throw new HttpError('forbidden', "A token of the identity provider: its second factor is the provider's.")
  return principal
}

export const mfaRoutes = [
  defineRoute({
    method: 'POST',
    path: '/auth/mfa/totp',
    operationId: 'enrolTotp',
    errorStatuses: [403, 409],
    noStore: true,
    summary: 'Start enrolling a TOTP factor (fresh proof): a secret and its otpauth:// URI; a first code confirms it',
    responses: { 201: { description: 'The secret, shown only here', schema: Enrolment } },
    access: ownFactor,
    body: { kind: 'json', validator: compileValidator(ProofBody), optional: true },
    async handle({ body, principal, client, requestId, services }) {
      const caller = loginOf(principal)
      await requireFreshProof(caller, body ?? {}, { services, client, requestId })
      const user = await findUser(services.sql, caller.userId)
      if (!user) throw notFound()
      const secret = await beginEnrolment(services.sql, services.config.jwtSecrets, user.id)
      if (secret === undefined)
        throw new HttpError('mfa_already_enabled', 'A second factor is on already: turn it off first.')
      const uri = otpauthUri(secret, services.config.jwtIssuer, user.email)
      return { status: 201, body: { secret, otpauth_uri: uri } }
    },
  }),

  defineRoute({
    method: 'POST',
    path: '/auth/mfa/totp/confirm',
    operationId: 'confirmTotp',
    errorStatuses: [403, 409],
    noStore: true,
    summary:
      "Turn the factor on with its first code: answers the recovery codes (shown once) and ends the user's " +
      'other sessions',
    responses: { 200: { description: 'The recovery codes', schema: RecoveryCodes } },
    access: ownFactor,
    body: { kind: 'json', validator: compileValidator(ConfirmBody) },
    async handle({ body, principal, requestId, services }) {
      const caller = loginOf(principal)
      const { sql, config, clock } = services
      const userId = Number(caller.userId)
      const state = await factorState(sql, userId)
      if (state === 'on') throw new HttpError('mfa_already_enabled', 'The second factor is on already.')
      if (state === 'none')
        throw new HttpError('mfa_not_enabled', 'No enrolment is waiting: POST /auth/mfa/totp first.')
      if (!(await acceptCode(sql, config.jwtSecrets, userId, body.code, clock.now(), 'pending')))
        throw mfaCodeRequired('The code does not match the secret: check the time of the device, and try the next one.')
      const origin = originOf(principal, requestId)
      const session = sessionOf(caller.credential)
      const codes = await sql.begin(async (tx) => {
        if (!(await confirmFactor(tx, userId))) return undefined
        await recordEvents(tx, [mfaEvent('user.mfa_enabled', userId)], origin)
        // Whoever else was logged in proved only the password: they log in again, with the code.
        await revokeSessionsOf(tx, userId, origin, session)
        // This session has just proved the factor: its next tokens say so (a refresh, for a JWT).
        if (session !== undefined) await tx`UPDATE sessions SET amr = '{pwd,otp}' WHERE id = ${session}`
        return newRecoveryCodes(tx, userId)
      })
      if (!codes) throw new HttpError('mfa_already_enabled', 'The second factor is on already.')
      await services.credentialChanges.caughtUp()
      return { status: 200, body: { recovery_codes: codes } }
    },
  }),

  defineRoute({
    method: 'POST',
    path: '/auth/mfa/recovery-codes',
    operationId: 'newRecoveryCodes',
    errorStatuses: [403, 409],
    noStore: true,
    summary: 'New recovery codes (fresh proof), replacing the old ones, shown once',
    responses: { 200: { description: 'The recovery codes', schema: RecoveryCodes } },
    access: ownFactor,
    body: { kind: 'json', validator: compileValidator(ProofBody), optional: true },
    async handle({ body, principal, client, requestId, services }) {
      const caller = loginOf(principal)
      await requireFreshProof(caller, body ?? {}, { services, client, requestId })
      const userId = Number(caller.userId)
      const codes = await services.sql.begin((tx) => replaceRecoveryCodes(tx, userId))
      if (!codes) throw new HttpError('mfa_not_enabled', 'This account has no second factor.')
      return { status: 200, body: { recovery_codes: codes } }
    },
  }),

  defineRoute({
    method: 'DELETE',
    path: '/auth/mfa/totp',
    operationId: 'disableTotp',
    errorStatuses: [403, 409],
    noStore: true,
    summary: 'Turn the second factor off: the current password and a code (or a recovery code) in the body',
    responses: { 204: { description: 'Off' } },
    access: ownFactor,
    body: { kind: 'json', validator: compileValidator(DisableBody) },
    async handle({ body, principal, client, requestId, services }) {
      const caller = loginOf(principal)
      const user = await findUser(services.sql, caller.userId)
      if (!user) throw notFound()
      if (!(await hasFactor(services.sql, user.id)))
        throw new HttpError('mfa_not_enabled', 'This account has no second factor.')
      const proofContext = { services, client, requestId }
      if ((await proveCurrentPassword(caller, body.current_password, proofContext, true)) === undefined)
        throw currentPasswordRequired('Turning the second factor off needs current_password.')
      if (body.code === undefined && body.recovery_code === undefined)
        throw mfaCodeRequired('Turning the second factor off needs a code (or a recovery code) too.')
      const origin = originOf(principal, requestId)
      const proved = await proveSecondFactor(services, user, body, { client, origin })
      if (!proved) throw mfaCodeRequired('code is wrong.')
      await services.sql.begin((tx) => withdrawFactor(tx, user.id, origin, false))
      return { status: 204 }
    },
  }),
]
