import Type from 'typebox'
import { HttpError } from '../core/http/problem.js'
import { defineRoute } from '../core/http/route.js'
import { compileValidator } from '../core/http/validate.js'
import { findUserByEmail, localPasswordHash } from '../accounts/queries.js'
import { challenge } from './credentials.js'
import { countAttempt, normalizeEmail, passwordProven, recordFailedLogin } from './login/login-throttle.js'
import { originOf } from './origin.js'
import { sessionOf } from './principal.js'
import { publicAccess } from './access.js'
import { endSession } from './sessions/session-routes.js'
import { mayResendVerification, queueVerification } from './recovery/recovery.js'
import { openSession, rotate, sessionOfRefreshToken, type TokenResponse } from './sessions/sessions.js'
import { findChallenge, MFA_TOKEN_TTL_SECONDS, openChallenge, spendChallenge } from './mfa/challenges.js'
import { hasFactor, RECOVERY_CODE } from './mfa/factors.js'
import { proveSecondFactor } from './mfa/second-factor.js'
import { TOTP_CODE } from './mfa/totp.js'
import type { AuthServices } from './services.js'

// Logging in (with its second step when the user has a second factor),
// refreshing and logging out: the routes that open and end sessions. They
// stand here, above the folders they join, because a login uses all of them:
// the throttle on guesses (login/), the second factor (mfa/), a new session
// (sessions/), and, where REQUIRE_VERIFIED_EMAIL holds, a fresh verification
// link (recovery/); and recovery ends sessions, so in sessions/ they would
// make the two folders import each other.

const LoginBody = Type.Object(
  {
    email: Type.String({ minLength: 1, maxLength: 254 }),
    password: Type.String({ minLength: 1, maxLength: 256 }),
    token_format: Type.Optional(Type.Union([Type.Literal('jwt'), Type.Literal('opaque')])),
    scope: Type.Optional(Type.String({ maxLength: 500, description: 'space-separated scopes' })),
    code: Type.Optional(
      Type.String({ pattern: TOTP_CODE.source, description: 'with a second factor: its current code, in one step' }),
    ),
    recovery_code: Type.Optional(
      Type.String({ pattern: RECOVERY_CODE.source, description: 'with a second factor: a recovery code instead' }),
    ),
  },
  { additionalProperties: false },
)
const MfaLoginBody = Type.Object(
  {
    mfa_token: Type.String({
      minLength: 1,
      maxLength: 128,
      description: 'from the 401 mfa_required of POST /auth/login',
    }),
    code: Type.Optional(Type.String({ pattern: TOTP_CODE.source, description: 'the current code of the factor' })),
    recovery_code: Type.Optional(
      Type.String({ pattern: RECOVERY_CODE.source, description: 'a recovery code, spent by this login' }),
    ),
  },
  { additionalProperties: false },
)
const Tokens = Type.Object(
  {
    access_token: Type.String(),
    token_type: Type.Literal('Bearer'),
    expires_in: Type.Integer({ description: 'seconds' }),
    refresh_token: Type.String(),
    scope: Type.String({ description: 'space-separated scopes' }),
  },
  { additionalProperties: false },
)
const RefreshBody = Type.Object(
  { refresh_token: Type.String({ minLength: 1, maxLength: 512 }) },
  { additionalProperties: false },
)
const LogoutBody = Type.Object(
  { refresh_token: Type.Optional(Type.String({ minLength: 1, maxLength: 512 })) },
  { additionalProperties: false },
)

// RFC 9110 §15.5.2: every 401 carries a challenge.
const invalidCredentials = () =>
  new HttpError('invalid_credentials', 'The e-mail address or the password is wrong.', {
    headers: { 'www-authenticate': challenge.missing },
  })
/** The password was right and a code is due: the second step takes this token (RFC 9457 extension members). */
const mfaRequired = (mfaToken: string) =>
  new HttpError('mfa_required', 'This account has a second factor: POST /auth/login/mfa with mfa_token and a code.', {
    headers: { 'www-authenticate': challenge.missing },
    extensions: { mfa_token: mfaToken, expires_in: MFA_TOKEN_TTL_SECONDS },
  })
const invalidMfaToken = () =>
  new HttpError('invalid_token', 'The mfa_token is invalid, expired or spent: log in again.', {
    headers: { 'www-authenticate': challenge.invalid },
  })
/** One code or one recovery code, never both (a schema cannot say "at most one of" clearly). */
function assertOneFactor(body: { code?: string | undefined; recovery_code?: string | undefined }): void {
  if (body.code !== undefined && body.recovery_code !== undefined)
    throw new HttpError('invalid_request', 'Send code or recovery_code, not both.')
}

/** A session's first tokens, or a 401 when the user's credentials changed while the login was checked. */
async function issueTokens(
  services: AuthServices,
  user: { id: number; role: 'admin' | 'user'; credential_epoch: number },
  scopes: string[],
  format: 'jwt' | 'opaque',
  request: { headers: Record<string, string | string[] | undefined>; client: string; requestId: string },
  amr: readonly string[],
): Promise<TokenResponse> {
  const userAgent = request.headers['user-agent']
  const tokens = await openSession(
    services.sql,
    services,
    user,
    scopes,
    format,
    { userAgent: typeof userAgent === 'string' ? userAgent : undefined, address: request.client },
    request.requestId,
    amr,
  )
  // The password or role changed while this login was checked: its tokens would be void already.
  if (!tokens) throw invalidCredentials()
  return tokens
}

const invalidRefresh = () =>
  new HttpError('invalid_token', 'The refresh token is invalid, expired or revoked.', {
    headers: { 'www-authenticate': challenge.invalid },
  })

export const authRoutes = [
  defineRoute({
    method: 'POST',
    path: '/auth/login',
    operationId: 'login',
    errorStatuses: [401, 403, 429],
    noStore: true,
    summary:
      'Log in with e-mail and password (and, with a second factor, its code, or a 401 mfa_required with an ' +
      'mfa_token for POST /auth/login/mfa); returns an access and a refresh token',
    responses: { 200: { description: 'Tokens', schema: Tokens } },
    access: publicAccess,
    body: { kind: 'json', validator: compileValidator(LoginBody) },
    // It waits for a password-hash slot too, which must not hold a place under database admission.
    database: 'statements',
    async handle({ body, headers, client, requestId, bounded, services }) {
      const { sql, logins, passwords } = services
      const from = logins.address(client)
      logins.admit(from.bucket)
      const email = normalizeEmail(body.email)
      // Counted once a hash slot is held (an attempt turned away is no failure), and before the password is checked, so
      // concurrent guesses cannot outrun the lock. A user without a password it may use (none, or one made from the
      // identity provider's tokens: OIDC_LOCAL_PASSWORDS) costs the hash an unknown address does, and fails as a wrong
      // password does.
      const { user, hash, ok } = await passwords.withSlot(from.bucket, async () => {
        const user = await bounded(async () => {
          await countAttempt(sql, email, from)
          return findUserByEmail(sql, email)
        })
        const hash = user && localPasswordHash(user, services.config.oidcLocalPasswords)
        return { user, hash, ok: await passwords.verifyInSlot(body.password, hash ?? passwords.decoy) }
      })
      if (!user || !hash || !ok) {
        await bounded(() =>
          recordFailedLogin(sql, { email, userId: user?.id, client }, { actorId: null, credential: null, requestId }),
        )
        throw invalidCredentials()
      }
      assertOneFactor(body)
      const factor = await bounded(() => hasFactor(sql, user.id))
      // With a second factor the password alone clears no failure: whoever has it must still get past the code's count.
      if (!factor) await bounded(() => passwordProven(sql, email, user.id, from))
      if (services.config.requireVerifiedEmail && user.email_verified_at === null) {
        // Only once the password is proven, so the answer tells nothing to anyone without it. The way out is a link: a
        // fresh one, within the hourly limit.
        await bounded(() =>
          services.sql.begin(async (tx) => {
            if (await mayResendVerification(tx, user.id)) await queueVerification(tx, services, user)
          }),
        )
        throw new HttpError('email_not_verified', 'Verify your e-mail address first: a link was sent to it.')
      }
      const allowed = services.registry.scopes.byRole[user.role]
      const requested = body.scope === undefined ? [...allowed] : body.scope.split(' ').filter(Boolean)
      const refused = requested.filter((s) => !allowed.includes(s))
      if (refused.length || requested.length === 0) {
        throw new HttpError(
          'insufficient_scope',
          `Scope not available to this account: ${refused.join(' ') || '(empty)'}.`,
        )
      }
      const format = body.token_format ?? 'jwt'
      if (factor) {
        if (body.code === undefined && body.recovery_code === undefined)
          throw mfaRequired(await bounded(() => openChallenge(sql, user, requested, format)))
        const origin = { actorId: null, credential: null, requestId }
        if (!(await bounded(() => proveSecondFactor(services, user, body, { client, origin }))))
          throw invalidCredentials()
      }
      const amr = factor ? ['pwd', 'otp'] : ['pwd']
      const tokens = await bounded(() =>
        issueTokens(services, user, requested, format, { headers, client, requestId }, amr),
      )
      return { status: 200, body: tokens }
    },
  }),

  defineRoute({
    method: 'POST',
    path: '/auth/login/mfa',
    operationId: 'loginSecondFactor',
    errorStatuses: [401, 429],
    noStore: true,
    summary: "A login's second step: the mfa_token of POST /auth/login's 401 mfa_required with a code",
    responses: { 200: { description: 'Tokens', schema: Tokens } },
    access: publicAccess,
    body: { kind: 'json', validator: compileValidator(MfaLoginBody) },
    async handle({ body, headers, client, requestId, bounded, services }) {
      const { sql, logins } = services
      logins.admit(logins.address(client).bucket)
      assertOneFactor(body)
      if (body.code === undefined && body.recovery_code === undefined)
        throw new HttpError('invalid_request', 'Send code (or recovery_code) with the mfa_token.')
      const challenge = await bounded(() => findChallenge(sql, body.mfa_token))
      if (!challenge) throw invalidMfaToken()
      const user = { id: challenge.user_id, email: challenge.email }
      const origin = { actorId: null, credential: null, requestId }
      // A wrong code leaves the token open; the count on the account bounds the guesses.
      if (!(await bounded(() => proveSecondFactor(services, user, body, { client, origin }))))
        throw invalidCredentials()
      if (!(await bounded(() => spendChallenge(sql, body.mfa_token)))) throw invalidMfaToken()
      const account = { id: challenge.user_id, role: challenge.role, credential_epoch: challenge.credential_epoch }
      const tokens = await bounded(() =>
        issueTokens(services, account, challenge.scopes, challenge.token_format, { headers, client, requestId }, [
          'pwd',
          'otp',
        ]),
      )
      return { status: 200, body: tokens }
    },
  }),

  defineRoute({
    method: 'POST',
    path: '/auth/refresh',
    operationId: 'refreshTokens',
    errorStatuses: [401],
    noStore: true,
    summary: 'Trade a refresh token for a new pair (the old one is retired)',
    responses: { 200: { description: 'Tokens', schema: Tokens } },
    access: publicAccess,
    body: { kind: 'json', validator: compileValidator(RefreshBody) },
    async handle({ body, requestId, services }) {
      const tokens = await rotate(services.sql, services, body.refresh_token, requestId)
      // A retired token presented again ended its session: its JWTs stop here before the answer.
      if (tokens === 'reused') await services.credentialChanges.caughtUp()
      if (tokens === undefined || tokens === 'reused') throw invalidRefresh()
      return { status: 200, body: tokens }
    },
  }),

  // Ends the session of the refresh token in the body, or of the credential
  // that authenticates the call (an opaque access token or a JWT).
  defineRoute({
    method: 'POST',
    path: '/auth/logout',
    operationId: 'logout',
    noStore: true,
    summary: 'End the session of a refresh token, or of the access token used',
    responses: { 204: { description: 'Session ended' } },
    access: { kind: 'optional' },
    body: { kind: 'json', validator: compileValidator(LogoutBody), optional: true },
    async handle({ body, principal, requestId, services }) {
      if (body?.refresh_token) {
        const owner = await sessionOfRefreshToken(services.sql, body.refresh_token)
        if (owner === undefined) throw invalidRefresh()
        return endSession(services, owner.sessionId, { actorId: owner.userId, credential: 'refresh_token', requestId })
      }
      const session = principal.kind === 'user' ? sessionOf(principal.credential) : undefined
      if (session !== undefined) return endSession(services, session, originOf(principal, requestId))
      if (principal.kind === 'user' && principal.credential.type === 'oidc') {
        throw new HttpError(
          'invalid_request',
          'A token of the identity provider has no session here: log out at the provider, or POST /auth/logout-all ' +
            'to refuse every token issued until now.',
        )
      }
      throw new HttpError(
        'invalid_request',
        'Send {"refresh_token": …}, or call with an access token of the session to end.',
      )
    },
  }),
]
