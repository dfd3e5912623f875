import Type from 'typebox'
import type { HandlerContext } from '../core/http/route.js'
import { HttpError } from '../core/http/problem.js'
import { originOf } from './origin.js'
import { findUser, localPasswordHash } from '../accounts/queries.js'
import { requireInteractive } from './access.js'
import { countAttempt, normalizeEmail, passwordProven, recordFailedLogin } from './login/login-throttle.js'
import type { UserPrincipal } from './principal.js'

// Proof that the person at the keyboard is the account's owner, for the
// actions a stolen access token must not be enough for: changing one's own
// e-mail or password, deleting one's own account, creating an API key.

type ProofContext = Pick<HandlerContext<unknown, unknown>, 'services' | 'client' | 'requestId'>

export const currentPasswordRequired = (detail: string) => new HttpError('current_password_required', detail)

/** The body member carrying the proof: not a member of any resource, the same wherever it is asked for. */
export const currentPasswordMember = (description: string) =>
  Type.Optional(Type.String({ minLength: 1, maxLength: 256, description }))

/**
 * Checks `currentPassword` against the caller's stored hash; undefined when
 * none was given. Guesses are throttled like logins, against the account and
 * the client address, and a wrong one is a failed login. Run it before any
 * transaction (scrypt is slow and a row lock must not wait on it); it returns
 * the hash the password matched, which a transaction may compare with the
 * locked row (the password changed in between: the proof no longer holds).
 */
export async function proveCurrentPassword(
  caller: UserPrincipal,
  currentPassword: string | undefined,
  ctx: ProofContext,
): Promise<string | undefined> {
  if (currentPassword === undefined) return undefined
  // A program's key is never the person at the keyboard; nor may it test guesses of the password.
  requireInteractive(caller)
  const { sql, passwords, logins } = ctx.services
  const user = await findUser(sql, caller.userId)
  // A user made from the identity provider's tokens proves itself there (OIDC_LOCAL_PASSWORDS).
  const hash = user && localPasswordHash(user, ctx.services.config.oidcLocalPasswords)
  if (!user || !hash) throw currentPasswordRequired('current_password is wrong.')
  const email = normalizeEmail(user.email)
  const from = logins.address(ctx.client)
  const ok = await passwords.withSlot(from.bucket, async () => {
    await countAttempt(sql, email, from)
    return passwords.verifyInSlot(currentPassword, hash)
  })
  if (!ok) {
    await recordFailedLogin(sql, { email, userId: user.id, client: ctx.client }, originOf(caller, ctx.requestId))
    throw currentPasswordRequired('current_password is wrong.')
  }
  await passwordProven(sql, email, user.id, from)
  return hash
}

/**
 * Whether the caller's session was opened by a password login less than
 * `windowSeconds` ago. Sessions are opened only by POST /auth/login, so a
 * session's created_at is the time of its password login; a refresh moves
 * last_used_at, never created_at, so refreshing does not keep a stolen
 * session fresh. An API key has no session: never.
 */
async function loggedInWithin(caller: UserPrincipal, windowSeconds: number, ctx: ProofContext): Promise<boolean> {
  const { credential } = caller
  if (credential.type === 'api_key') return false
  // The provider says when the person last signed in there (auth_time); without it, the token proves nothing recent.
  if (credential.type === 'oidc')
    return (
      credential.authenticatedAt !== undefined &&
      ctx.services.clock.now() / 1000 - credential.authenticatedAt < windowSeconds
    )
  const [fresh] = await ctx.services.sql`
    SELECT 1 FROM sessions
    WHERE id = ${credential.sessionId} AND user_id = ${caller.userId} AND revoked_at IS NULL
      AND created_at > now() - ${windowSeconds} * interval '1 second'`
  return fresh !== undefined
}

/**
 * A sensitive action: the caller proves its password in the body, or its
 * session logged in with the password within REAUTH_WINDOW seconds. A
 * password given is always checked, even within the window.
 */
export async function requireRecentPassword(
  caller: UserPrincipal,
  currentPassword: string | undefined,
  ctx: ProofContext,
): Promise<void> {
  if (currentPassword !== undefined) {
    await proveCurrentPassword(caller, currentPassword, ctx)
    return
  }
  const window = ctx.services.config.reauthWindow
  if (await loggedInWithin(caller, window, ctx)) return
  throw currentPasswordRequired(
    `This needs current_password: this session did not log in with its password within the ` +
      `last ${window} seconds (REAUTH_WINDOW).`,
  )
}
