import Type from 'typebox'
import type { HandlerContext } from '../core/http/route.js'
import type { Db } from '../core/db/transaction.js'
import { HttpError } from '../core/http/problem.js'
import { originOf } from './origin.js'
import { findUser, localPasswordHash } from '../accounts/queries.js'
import { requireInteractive } from './access.js'
import { countAttempt, normalizeEmail, passwordProven, recordFailedLogin } from './login/login-throttle.js'
import type { UserPrincipal } from './principal.js'
import { hasFactor } from './mfa/factors.js'
import { proveSecondFactor } from './mfa/second-factor.js'
import { TOTP_CODE } from './mfa/totp.js'

// Proof that the person at the keyboard is the account's owner, for the
// actions a stolen access token must not be enough for: changing one's own
// e-mail or password, deleting one's own account, and the step-up acts that
// create lasting authority (an API key, an admin, another user's password).

/**
 * `db`: where the request's own reads run (a batch's transaction: a proof there sees what the batch did before it, a
 * user it moved to the trash included); the counts of guesses always go to the pool, and stand when a batch is undone.
 */
type ProofContext = Pick<HandlerContext<unknown, unknown>, 'services' | 'client' | 'requestId'> & { db?: Db }

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
 * With `secondFactorDue`, a right password clears no failure: the code that
 * must follow does, once it holds (else password-then-wrong-code, repeated,
 * would guess codes without ever meeting the lock).
 */
export async function proveCurrentPassword(
  caller: UserPrincipal,
  currentPassword: string | undefined,
  ctx: ProofContext,
  secondFactorDue = false,
): Promise<string | undefined> {
  if (currentPassword === undefined) return undefined
  // A program's key is never the person at the keyboard; nor may it test guesses of the password.
  requireInteractive(caller)
  const { sql, passwords, logins } = ctx.services
  const user = await findUser(ctx.db ?? sql, caller.userId)
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
  if (!secondFactorDue) await passwordProven(sql, email, user.id, from)
  return hash
}

/**
 * Whether the caller's login is fresh enough to stand for a proof: its
 * session's login (or the provider's `auth_time`) is less than `windowSeconds`
 * old, and, for a user with a second factor, that login proved it too. Read
 * from the session's row, which a refresh never makes younger: refreshing
 * does not keep a stolen session fresh. An API key has no login: never.
 */
async function loggedInWithin(
  caller: UserPrincipal,
  windowSeconds: number,
  factor: boolean,
  ctx: ProofContext,
): Promise<boolean> {
  const { credential } = caller
  if (credential.type === 'api_key') return false
  // The provider says when the person last signed in there (auth_time); without it, the token proves nothing recent.
  if (credential.type === 'oidc')
    return (
      credential.authenticatedAt !== undefined &&
      ctx.services.clock.now() / 1000 - credential.authenticatedAt < windowSeconds
    )
  const [fresh] = await (ctx.db ?? ctx.services.sql)<Array<{ amr: string[] }>>`
    SELECT amr FROM sessions
    WHERE id = ${credential.sessionId} AND user_id = ${caller.userId} AND revoked_at IS NULL
      AND created_at > now() - ${windowSeconds} * interval '1 second'`
  return fresh !== undefined && (!factor || fresh.amr.includes('otp'))
}

export const mfaCodeRequired = (detail: string) => new HttpError('mfa_code_required', detail)

/** The body member carrying a second-factor code beside current_password. */
export const codeMember = (description: string) =>
  Type.Optional(Type.String({ pattern: TOTP_CODE.source, description }))

/**
 * The members of a step-up body (docs/auth.md, "Step-up"), the same wherever one is asked for; `whose` names the
 * password ("the admin's", "the creator's"), `after` what a proof from the session's recent login implies.
 */
export const freshProofMembers = (whose: string, after = '') => ({
  current_password: currentPasswordMember(
    `${whose} current password; required unless this session logged in with every factor within REAUTH_WINDOW ` +
      `seconds${after}`,
  ),
  code: codeMember('with current_password, when the caller has a second factor: its current code'),
})

/** What a step-up body may carry. */
export interface FreshProof {
  current_password?: string | undefined
  code?: string | undefined
}

/**
 * A step-up act (docs/auth.md, "Step-up"): an interactive credential with a
 * fresh proof, either in the body (`current_password`, and `code` when the
 * caller has a second factor) or a login of this same session, with every
 * factor, within REAUTH_WINDOW seconds. What is given is always checked, even
 * within the window. Answers how the proof was made: 'request' (in this
 * body), or 'session' (a key made on its strength lives no longer than the
 * session).
 */
export async function requireFreshProof(
  caller: UserPrincipal,
  proof: FreshProof,
  ctx: ProofContext,
): Promise<'request' | 'session'> {
  requireInteractive(caller)
  const { services } = ctx
  const db = ctx.db ?? services.sql
  const factor = caller.credential.type !== 'oidc' && (await hasFactor(db, caller.userId))
  if (proof.current_password !== undefined) {
    await proveCurrentPassword(caller, proof.current_password, ctx, factor)
    if (!factor) return 'request'
    if (proof.code === undefined)
      throw mfaCodeRequired('This account has a second factor: send its code beside current_password.')
    const user = await findUser(db, caller.userId)
    const proved =
      user !== undefined &&
      (await proveSecondFactor(
        services,
        { id: user.id, email: user.email },
        { code: proof.code },
        { client: ctx.client, origin: originOf(caller, ctx.requestId) },
      ))
    if (!proved) throw mfaCodeRequired('code is wrong.')
    return 'request'
  }
  const window = services.config.reauthWindow
  if (await loggedInWithin(caller, window, factor, ctx)) return 'session'
  throw currentPasswordRequired(
    `This needs current_password${factor ? ' and code' : ''}: this session did not log in with ` +
      `${factor ? 'every factor' : 'its password'} within the last ${window} seconds (REAUTH_WINDOW).`,
  )
}
