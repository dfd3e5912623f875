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
import { openSession, rotate, sessionOfRefreshToken } from './sessions/sessions.js'

// Logging in, refreshing and logging out: the routes that open and end
// sessions. They stand here, above the folders they join, because a login
// uses all three: the throttle on guesses (login/), a new session
// (sessions/), and, where REQUIRE_VERIFIED_EMAIL holds, a fresh verification
// link (recovery/); and recovery ends sessions, so in sessions/ they would
// make the two folders import each other.

const LoginBody = Type.Object(
  {
    email: Type.String({ minLength: 1, maxLength: 254 }),
    password: Type.String({ minLength: 1, maxLength: 256 }),
    token_format: Type.Optional(Type.Union([Type.Literal('jwt'), Type.Literal('opaque')])),
    scope: Type.Optional(Type.String({ maxLength: 500, description: 'space-separated scopes' })),
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
    summary: 'Log in with e-mail and password; returns an access and a refresh token',
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
      await bounded(() => passwordProven(sql, email, user.id, from))
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
      const tokens = await bounded(() =>
        openSession(
          sql,
          services,
          user,
          requested,
          body.token_format ?? 'jwt',
          { userAgent: headers['user-agent'], address: client },
          requestId,
        ),
      )
      // The password or role changed while this login was checked: its tokens would be void already.
      if (!tokens) throw invalidCredentials()
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
