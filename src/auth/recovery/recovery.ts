import type { Sql, TransactionSql } from 'postgres'
import { revokeApiKeysOf } from '../api-keys/declaration.js'
import type { AuthServices } from '../services.js'
import { recordEvents } from '../../core/resources/change-events.js'
import type { EventOrigin } from '../origin.js'
import { queueMail, queueMailTo } from '../../mail/outbox.js'
import { normalizeEmail } from '../login/login-throttle.js'
import { linkFor, newOneTimeToken } from './one-time-tokens.js'
import { emailChangedMail, passwordResetMail, verifyEmailMail } from './recovery-mail.js'
import { raiseCredentialEpoch, revokeSessionsOf } from '../sessions/sessions.js'
import { hashSecret } from '../tokens.js'
import { removeFactor } from '../mfa/factors.js'

// Account recovery, a password reset, an address to verify and an old address
// to put back: its writes (the routes are recovery-routes.ts, the links'
// secrets one-time-tokens.ts, the messages' words recovery-mail.ts; the rules
// in docs/auth.md, "Account recovery: rules"). Each message is queued in the
// statement or transaction of the token it carries (src/mail/outbox.ts), so a
// token exists exactly when its message will be sent. A reset and a restore
// end the account's sessions and API keys: this folder imports sessions/,
// login/ and api-keys/, never the other way.

/** Messages of one purpose one account is sent per hour at most; past it, silently none (a reset) or 429 (a resend). */
export const MESSAGES_PER_HOUR = 5
/** How long a verification link lives. */
export const VERIFY_EMAIL_TTL_SECONDS = 24 * 3600
/** How long the link that puts an old address back lives: an owner may read that mailbox only days later. */
export const EMAIL_RESTORE_TTL_SECONDS = 7 * 24 * 3600

type Db = Sql | TransactionSql
type Purpose = 'password_reset' | 'verify_email' | 'email_restore'

/**
 * Whether the user may be sent another message of `purpose` this
 * hour (MESSAGES_PER_HOUR): as SQL on a user row named `u`.
 */
const underHourlyLimit = (db: Db, purpose: Purpose) => db`
  (SELECT count(*) FROM one_time_tokens t WHERE t.user_id = u.id AND t.purpose = ${purpose}
    AND t.created_at > now() - interval '1 hour') < ${MESSAGES_PER_HOUR}`

/**
 * Whether the user may hold a password (as SQL on a user row named `u`): not one made from the identity provider's
 * tokens, unless OIDC_LOCAL_PASSWORDS (`localPasswords`) allows it.
 */
const mayHoldPassword = (db: Db, localPasswords: boolean) => db`(${localPasswords}::boolean OR NOT u.made_by_provider)`

/**
 * The work of POST /auth/password-reset, done after its answer
 * (recovery-routes.ts): the same statements whatever the address (a lock on
 * the address, then one statement), so that an unknown address costs the
 * database what a known one does: the token is made and hashed either way,
 * and the request is logged either way (a write, whose commit waits for the
 * WAL flush as the known address's does). For an account that may hold a
 * password (one made from the identity provider's tokens is an unknown
 * address here, unless OIDC_LOCAL_PASSWORDS) whose address had fewer than
 * MESSAGES_PER_HOUR requests this hour: its open reset tokens are retired, a
 * new one is stored as its hash, the message is queued, and
 * user.password_reset_requested recorded. True when a message was queued.
 */
export async function requestPasswordReset(
  sql: Sql,
  email: string,
  template: string,
  ttlSeconds: number,
  origin: EventOrigin,
  localPasswords: boolean,
): Promise<boolean> {
  const { token, hash } = newOneTimeToken()
  const mail = passwordResetMail(linkFor(template, token), ttlSeconds)
  const emailHash = hashSecret(email)
  const [row] = await sql.begin(async (tx) => {
    // One request of an address at a time: the count below must see the requests made at the same moment,
    // which one statement's snapshot would not (twelve at once would each count the same four).
    await tx`SELECT pg_advisory_xact_lock(('x' ||
      encode(substring(${emailHash}::bytea FROM 1 FOR 8), 'hex'))::bit(64)::bigint)`
    return tx<[{ queued: number }]>`
    WITH recent AS (
      SELECT count(*) AS n FROM password_reset_requests WHERE email_hash = ${emailHash}
        AND requested_at > now() - interval '1 hour'),
    logged AS (INSERT INTO password_reset_requests (email_hash) VALUES (${emailHash})),
    target AS (
      SELECT u.id, u.email FROM users u, recent WHERE lower(u.email) = ${email} AND recent.n < ${MESSAGES_PER_HOUR}
        AND u.deleted_at IS NULL AND ${mayHoldPassword(tx, localPasswords)}),
    retired AS (
      UPDATE one_time_tokens SET used_at = now()
      WHERE user_id IN (SELECT id FROM target) AND purpose = 'password_reset' AND used_at IS NULL),
    token AS (
      INSERT INTO one_time_tokens (purpose, user_id, token_hash, expires_at)
      SELECT 'password_reset', id, ${hash}, now() + ${ttlSeconds}::int * interval '1 second' FROM target),
    mail AS (${queueMailTo(tx, tx`target`, mail)}),
    event AS (
      INSERT INTO event_outbox (type, subject_type, subject_id, actor_id, actor_credential, request_id, data)
      SELECT 'user.password_reset_requested', 'user',
      id, ${origin.actorId}::bigint, ${origin.credential}::text, ${origin.requestId}::text, json_build_object('id', id)
      FROM target)
    SELECT count(*)::int AS queued FROM target`
  })
  return row.queued > 0
}

/**
 * Locks the row of the user a token of `purpose` belongs to (used or not), before anything of its tokens, and says
 * whether there is such a token. Every write of an account's tokens takes the user's row first (an address change and
 * a deletion lock it too), so that two of them wait for each other instead of deadlocking. FOR NO KEY UPDATE: what an
 * UPDATE of the row takes, which lets a reset request insert a token for the user meanwhile (its foreign key holds
 * FOR KEY SHARE) and so never wait on us while holding tokens we are about to retire.
 */
async function lockTokenOwner(tx: TransactionSql, hash: Buffer, purpose: Purpose): Promise<boolean> {
  const [owner] = await tx`
    SELECT u.id FROM one_time_tokens t JOIN users u ON u.id = t.user_id
    WHERE t.token_hash = ${hash} AND t.purpose = ${purpose} AND u.deleted_at IS NULL FOR NO KEY UPDATE OF u`
  return owner !== undefined
}

/** The user a live token of `purpose` belongs to (one index lookup), without using it. */
export async function liveTokenUser(sql: Sql, hash: Buffer, purpose: Purpose): Promise<number | undefined> {
  const [row] = await sql<Array<{ user_id: number }>>`
    SELECT user_id FROM one_time_tokens WHERE token_hash = ${hash} AND purpose = ${purpose} AND used_at IS NULL
      AND expires_at > now()`
  return row?.user_id
}

/**
 * POST /auth/password-reset/confirm, once the new password is hashed: uses
 * the token (false when it was used or expired meanwhile, or its user may
 * hold no password: nothing changes), sets the password (the trigger of
 * sql/005 voids every JWT), ends every session, revokes every API key,
 * retires the user's other reset tokens and lifts the login throttle's locks
 * on the account. Recovery assumes the account was in someone else's hands.
 */
export async function resetPassword(
  sql: Sql,
  hash: Buffer,
  passwordHash: string,
  requestId: string,
  localPasswords: boolean,
): Promise<boolean> {
  return sql.begin(async (tx) => {
    // The user first, then its tokens (lockTokenOwner): a deletion of the user at the same moment takes them in that
    // order too.
    if (!(await lockTokenOwner(tx, hash, 'password_reset'))) return false
    // A link sent while OIDC_LOCAL_PASSWORDS allowed it sets no password once it does not.
    const [used] = await tx<Array<{ user_id: number }>>`
      UPDATE one_time_tokens t SET used_at = now()
      FROM users u
      WHERE t.token_hash = ${hash} AND t.purpose = 'password_reset' AND t.used_at IS NULL AND t.expires_at > now()
        AND u.id = t.user_id AND ${mayHoldPassword(tx, localPasswords)}
      RETURNING t.user_id`
    if (!used) return false
    const userId = used.user_id
    const origin: EventOrigin = { actorId: userId, credential: null, requestId }
    const [user] = await tx<
      Array<{ email: string }>
    >`UPDATE users SET password_hash = ${passwordHash} WHERE id = ${userId} AND deleted_at IS NULL RETURNING email`
    if (!user) return false
    await tx`UPDATE one_time_tokens SET used_at = now() WHERE user_id = ${userId} AND purpose = 'password_reset'
      AND used_at IS NULL`
    await revokeSessionsOf(tx, userId, origin)
    await revokeApiKeysOf(tx, userId, origin)
    // Every row of the account: its pairs with client addresses and its account-wide rows
    // (src/auth/login/login-throttle.ts keys them by normalizeEmail).
    await tx`DELETE FROM login_failures WHERE email = ${normalizeEmail(user.email)}`
    await recordEvents(
      tx,
      [{ type: 'user.password_reset', subject: { type: 'user', id: userId }, data: { id: userId } }],
      origin,
    )
    return true
  })
}

/**
 * POST /auth/verify-email: uses the token and marks the address verified,
 * when the user's address is still the one the token was sent to; false
 * otherwise (the token stays as it is).
 */
export async function verifyEmail(sql: Sql, hash: Buffer, requestId: string): Promise<boolean> {
  return sql.begin(async (tx) => {
    // The user first, then its tokens: the order an address change takes them in (the user's row, then
    // queueVerification's retiring of its tokens), so that the two wait for each other instead of deadlocking.
    if (!(await lockTokenOwner(tx, hash, 'verify_email'))) return false
    const [used] = await tx<Array<{ user_id: number }>>`
      UPDATE one_time_tokens t SET used_at = now()
      FROM users u
      WHERE t.token_hash = ${hash} AND t.purpose = 'verify_email' AND t.used_at IS NULL AND t.expires_at > now()
        AND u.id = t.user_id AND lower(u.email) = lower(t.email)
      RETURNING t.user_id`
    if (!used) return false
    await tx`UPDATE users SET email_verified_at = now() WHERE id = ${used.user_id} AND deleted_at IS NULL`
    await recordEvents(
      tx,
      [{ type: 'user.email_verified', subject: { type: 'user', id: used.user_id }, data: { id: used.user_id } }],
      { actorId: used.user_id, credential: null, requestId },
    )
    return true
  })
}

/** What queueing a verification needs of the service. */
export type VerificationDeps = Pick<AuthServices, 'config' | 'mail'>

/**
 * Queues a verification link for the user's address `email`, retiring the
 * user's open verification tokens, on the transaction of the change that
 * asks for it (a new user, a new address). Nothing when VERIFY_EMAIL_URL is
 * unset (verification is off).
 */
export async function queueVerification(
  tx: Db,
  deps: VerificationDeps,
  user: { id: number; email: string },
): Promise<void> {
  const template = deps.config.verifyEmailUrl
  // Without a transport nothing would ever send it: a live token would only wait in the outbox, in clear.
  if (template === undefined || !deps.mail.transport) return
  const { token, hash } = newOneTimeToken()
  await tx`UPDATE one_time_tokens SET used_at = now() WHERE user_id = ${user.id} AND purpose = 'verify_email'
    AND used_at IS NULL`
  await tx`
    INSERT INTO one_time_tokens (purpose, user_id, token_hash, email, expires_at)
    VALUES ('verify_email', ${user.id}, ${hash}, ${user.email}, now() + ${VERIFY_EMAIL_TTL_SECONDS}::int * interval
      '1 second')`
  await queueMail(tx, user.id, user.email, verifyEmailMail(linkFor(template, token)))
}

/** Whether the user may be sent another verification link this hour. */
export async function mayResendVerification(db: Db, userId: number): Promise<boolean> {
  const [row] = await db<
    Array<{ ok: boolean }>
  >`SELECT ${underHourlyLimit(db, 'verify_email')} AS ok FROM users u WHERE u.id = ${userId}`
  return row?.ok ?? false
}

/**
 * An address changed (in the transaction of the change): the new one gets a
 * verification link, the old one word of the change, with a link that puts it
 * back when it was verified (restoreLink), so that an owner whose account was
 * taken over hears of it and can take it back. Nothing when VERIFY_EMAIL_URL
 * is unset.
 * Within MESSAGES_PER_HOUR links an hour per account, as every verification
 * link: an account changing its address again and again must not make the
 * service mail any address it names. Past it the change holds, no link is
 * sent (the resend, later, sends one), and the old address hears of it only
 * if it was verified: an owner's address always does.
 */
export async function addressChanged(
  tx: Db,
  deps: VerificationDeps,
  user: { id: number; email: string; emailVerified: boolean },
  to: string,
): Promise<void> {
  if (deps.config.verifyEmailUrl === undefined || user.email.toLowerCase() === to.toLowerCase()) return
  const within = await mayResendVerification(tx, user.id)
  if (within) await queueVerification(tx, deps, { id: user.id, email: to })
  if (within || user.emailVerified) {
    const link = await restoreLink(tx, deps, user)
    const passwordReset = deps.config.passwordResetUrl !== undefined
    const restore = link === undefined ? undefined : { link, ttlSeconds: EMAIL_RESTORE_TTL_SECONDS, passwordReset }
    await queueMail(tx, user.id, user.email, emailChangedMail(restore))
  }
}

/**
 * The link of the notice to the old address (EMAIL_RESTORE_URL), its token
 * stored with the address it restores, for EMAIL_RESTORE_TTL_SECONDS. A later
 * change does not retire it: a thief who moves the address on again must not
 * void the owner's link (restoreEmail). Undefined when restoring is off, when
 * no transport would ever send it (a live token would only wait in the
 * outbox, in clear), and when the old address was never verified: it never
 * proved to be the owner's (a typo, someone else's mailbox), and its link
 * would hand that mailbox the account (restore, then a reset sent there).
 */
async function restoreLink(
  tx: Db,
  deps: VerificationDeps,
  user: { id: number; email: string; emailVerified: boolean },
): Promise<string | undefined> {
  const template = deps.config.emailRestoreUrl
  if (template === undefined || !deps.mail.transport || !user.emailVerified) return undefined
  const { token, hash } = newOneTimeToken()
  await tx`
    INSERT INTO one_time_tokens (purpose, user_id, token_hash, email, expires_at)
    VALUES ('email_restore', ${user.id}, ${hash}, ${user.email}, now() + ${EMAIL_RESTORE_TTL_SECONDS}::int * interval
      '1 second')`
  return linkFor(template, token)
}

/** What POST /auth/email-restore did with a token. */
export type RestoreOutcome = 'restored' | 'invalid' | 'address_taken'

/**
 * POST /auth/email-restore: uses the token and puts the address it was sent
 * to back on its user, verified (the link reached it), with a new version;
 * ends every session, JWT and API key of the user, as a reset does (the
 * account was in someone else's hands); retires the user's open reset and
 * verification links (sent to whoever moved the address, perhaps) and the
 * restore links of the changes made after the one this link was sent for.
 * The links of earlier changes stay: the first owner's must outlive a
 * thief's use of a later one. 'address_taken' when another account has the
 * address now: nothing changes, and the token stays usable.
 */
export async function restoreEmail(sql: Sql, hash: Buffer, requestId: string): Promise<RestoreOutcome> {
  try {
    return await sql.begin(async (tx) => {
      if (!(await lockTokenOwner(tx, hash, 'email_restore'))) return 'invalid'
      const [used] = await tx<Array<{ id: string; user_id: number; email: string; created_at: Date }>>`
        UPDATE one_time_tokens SET used_at = now()
        WHERE token_hash = ${hash} AND purpose = 'email_restore' AND used_at IS NULL AND expires_at > now()
        RETURNING id::text, user_id, email, created_at`
      if (!used) return 'invalid'
      const userId = used.user_id
      const origin: EventOrigin = { actorId: userId, credential: null, requestId }
      // What GET shows changes: a new version (its ETag) and updated_at, as a PATCH would give it.
      await tx`
        UPDATE users SET email = ${used.email}, version = version + 1,
          updated_at = greatest(clock_timestamp(), updated_at + interval '1 millisecond')
        WHERE id = ${userId}`
      // After the change, whose trigger (sql/012) left the address unverified.
      await tx`UPDATE users SET email_verified_at = now() WHERE id = ${userId}`
      await tx`
        UPDATE one_time_tokens SET used_at = now()
        WHERE user_id = ${userId} AND used_at IS NULL AND (purpose <> 'email_restore' OR id > ${used.id}::bigint)`
      await revokeSessionsOf(tx, userId, origin)
      await raiseCredentialEpoch(tx, userId)
      await revokeApiKeysOf(tx, userId, origin)
      // A second factor set up since the change is whoever moved the address: left on, it would lock the owner out.
      const factorRemoved = await removeFactor(tx, userId, used.created_at)
      const subject = { type: 'user', id: userId }
      await recordEvents(
        tx,
        [
          { type: 'user.email_restored', subject, data: { id: userId, email: used.email } },
          ...(factorRemoved ? [{ type: 'user.mfa_disabled', subject, data: { id: userId } }] : []),
        ],
        origin,
      )
      return 'restored'
    })
  } catch (err) {
    // The unique index on lower(email) (sql/001): the transaction rolled back, the token with it.
    const { code, constraint_name: constraint } = err as { code?: string; constraint_name?: string }
    if (code === '23505' && constraint === 'users_email_key') return 'address_taken'
    throw err
  }
}

/**
 * Tokens no message count or link needs any more (job `recovery.purge-tokens`): expired, and older than the hourly
 * count's window.
 */
export const spentOneTimeTokens = (db: Sql) => db`expires_at < now() AND created_at < now() - interval '1 hour'`

/** Reset requests older than the hourly count's window (job `recovery.purge-requests`). */
export const oldResetRequests = (db: Sql) => db`requested_at < now() - interval '1 hour'`
