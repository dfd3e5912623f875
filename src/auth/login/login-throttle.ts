import { recordEvents } from '../../core/resources/change-events.js'
import type { EventOrigin } from '../origin.js'
import type { Sql } from 'postgres'
import { addressBucket } from '../../core/http/client-address.js'
import { HttpError } from '../../core/http/problem.js'
import { RateLimiter } from '../../core/http/rate-limit.js'
import { knownCondition, rememberAddress, tagsOf, type LoginAddress } from './known-addresses.js'

// What stands between a login and password guessing: this throttle, and the
// addresses that proved an account's password (known-addresses.ts), which
// the account-wide lock spares. It imports nothing of sessions or recovery,
// so that both, the proof of a current password and the instance's services
// can use it.
//
// Failed logins are counted in the database (every instance sees them), for
// unknown e-mail addresses too, so the answer says nothing about which
// accounts exist. Two counts per attempt:
// - per (account, client address): after FREE_FAILURES within WINDOW the pair
//   is locked for a delay that doubles with each further failure, up to
//   MAX_LOCK. Guessing from one address becomes slow, and the owner at
//   another address is not locked out by it;
// - per account alone, the same from ACCOUNT_FREE_FAILURES on, against
//   guessing spread over many addresses. Addresses that proved the account's
//   password within KNOWN_DAYS (src/auth/login/known-addresses.ts) count on a row of
//   their own ('*known'), all others on '*': however many addresses an
//   attacker has, the lock they drive up is not the owner's. An attacker
//   cannot make an address known without the password, and every address is
//   unknown to an e-mail without an account, so a 429 says nothing about
//   which accounts exist.
// An attempt refused by a lock is counted nowhere (only checked attempts are
// failures): refused by its pair's lock, not against its account, so one
// address alone cannot lock the account; refused by its account's lock, not
// against its pair, so the owner trying from a new address while others
// hold the account locked does not lock that address for later too. A
// successful login clears its pair's count and takes its own count back from
// the account's row. Before any of this, each address may try
// LOGIN_RATE_LIMIT times a minute on this instance.

const FREE_FAILURES = 5
const ACCOUNT_FREE_FAILURES = 100
const WINDOW_SECONDS = 15 * 60
const FIRST_LOCK_SECONDS = 30
const MAX_LOCK_SECONDS = 15 * 60
const UNKNOWN_ADDRESSES = '*'
const KNOWN_ADDRESSES = '*known'

const tooMany = (seconds: number) =>
  new HttpError('too_many_login_attempts', 'Too many failed logins for this account; retry later.', {
    headers: { 'retry-after': String(Math.max(1, Math.ceil(seconds))) },
  })

/**
 * The one spelling of an e-mail address used both to find the account and
 * to count its failures. Stored addresses are ASCII (the Email schema), and
 * the unique index is on lower(email): ASCII letters are lower-cased and
 * nothing else, so no Unicode case rule (JavaScript's and PostgreSQL's differ,
 * for U+0130 say) can make two keys of one account.
 */
export const normalizeEmail = (email: string) => email.replace(/[A-Z]+/g, (letters) => letters.toLowerCase())

/**
 * The event of a password that did not match (a login, or the
 * current_password of a change to one's own account). Recorded on its own
 * once the check failed: the attempt was counted before the check, so that
 * concurrent guesses cannot outrun the lock. The typed e-mail is kept only
 * when it names an account: anything else typed there (a password in the
 * wrong field, say) must not reach the event log and its webhooks.
 */
export async function recordFailedLogin(
  sql: Sql,
  attempt: { email: string; userId: number | undefined; client: string },
  origin: EventOrigin,
): Promise<void> {
  await recordEvents(
    sql,
    [
      {
        type: 'login.failed',
        subject: { type: 'user', id: attempt.userId ?? null },
        data: {
          email: attempt.userId === undefined ? null : attempt.email,
          client_address: attempt.client.slice(0, 64),
        },
      },
    ],
    origin,
  )
}

/**
 * Counts one more failure on a row of login_failures, locking it past `freeFailures` in the window; a locked row is
 * left alone.
 */
const countFailure = (sql: Sql, freeFailures: number) => sql`
  ON CONFLICT (email, address) DO UPDATE SET
    failures = CASE WHEN f.last_failure < now() - ${WINDOW_SECONDS}::int * interval '1 second' THEN 1
      ELSE f.failures + 1 END,
    last_failure = now(),
    locked_until = CASE
      WHEN f.last_failure >= now() - ${WINDOW_SECONDS}::int * interval '1 second'
        AND f.failures + 1 >= ${freeFailures}::int
      THEN now() + least(${FIRST_LOCK_SECONDS}::int * power(2, f.failures + 1
        - ${freeFailures}::int), ${MAX_LOCK_SECONDS}::int) * interval '1 second'
      ELSE NULL END
  WHERE f.locked_until IS NULL OR f.locked_until <= now()
  RETURNING 1`

/**
 * Counts a login attempt before its password is checked, or refuses it (429)
 * while its pair or its account's row for this kind of address is locked.
 * Check and count are one statement, serialized on the rows, so concurrent
 * guesses cannot outrun the lock. Call it only once the attempt will be
 * checked (holding a hash slot): an attempt
 * turned away before that is not a failure.
 */
export async function countAttempt(sql: Sql, email: string, from: LoginAddress): Promise<void> {
  // The same statement for every e-mail, an account or not: a known address is found through the account.
  const known = sql`EXISTS (SELECT 1 FROM users u JOIN login_known_addresses k ON k.user_id = u.id WHERE
    lower(u.email) = ${email} AND ${knownCondition(sql, from)})`
  const [result] = await sql<Array<{ account: string; counted: boolean }>>`
    WITH kind AS (SELECT CASE WHEN ${known} THEN ${KNOWN_ADDRESSES} ELSE ${UNKNOWN_ADDRESSES} END AS account),
    account_open AS (
      SELECT 1 FROM kind WHERE NOT EXISTS (
        SELECT 1 FROM login_failures WHERE email = ${email} AND address = kind.account AND locked_until > now())),
    pair AS (
      INSERT INTO login_failures AS f (email, address, failures, last_failure)
      SELECT ${email}, ${from.bucket}, 1, now() FROM account_open
      ${countFailure(sql, FREE_FAILURES)}),
    account AS (
      INSERT INTO login_failures AS f (email, address, failures, last_failure)
      SELECT ${email}, kind.account, 1, now() FROM kind WHERE EXISTS (SELECT 1 FROM pair)
      ${countFailure(sql, ACCOUNT_FREE_FAILURES)})
    SELECT (SELECT account FROM kind) AS account, EXISTS (SELECT 1 FROM account) AS counted`
  if (result!.counted) return
  const [row] = await sql<Array<{ wait: number }>>`
    SELECT max(extract(epoch FROM locked_until - now()))::float8 AS wait FROM login_failures
    WHERE email = ${email} AND address IN (${from.bucket}, ${result!.account}) AND locked_until > now()`
  throw tooMany(row?.wait ?? 1)
}

/**
 * The password was proved from this address: its pair's count is cleared,
 * the account's row takes back the count of this attempt (the owner's own
 * logins must not add up to a lock; a row this attempt locked stays locked),
 * and the address is known to the account from now on.
 *
 * Three statements, each holding one row at a time, in countAttempt's order
 * (the pair, then the account): as one statement its row locks would be
 * taken in no set order, and concurrent logins of one account would deadlock
 * against countAttempt.
 */
export async function passwordProven(sql: Sql, email: string, userId: number, from: LoginAddress): Promise<void> {
  await sql`DELETE FROM login_failures WHERE email = ${email} AND address = ${from.bucket}`
  // Which account row the attempt counted on: decided before this address is remembered, as countAttempt decided it.
  await sql`
    UPDATE login_failures SET failures = failures - 1
    WHERE email = ${email} AND failures > 0 AND (locked_until IS NULL OR locked_until <= now())
      AND address = CASE WHEN EXISTS (SELECT 1 FROM users u JOIN login_known_addresses k ON k.user_id = u.id WHERE
      u.id = ${userId} AND ${knownCondition(sql, from)})
        THEN ${KNOWN_ADDRESSES} ELSE ${UNKNOWN_ADDRESSES} END`
  await rememberAddress(sql, userId, from)
}

/**
 * The rows of login_failures whose window has passed and whose lock
 * has run out (job `logins.purge-failures`, src/service.ts).
 */
export const expiredLoginFailures = (sql: Sql) => sql`
  last_failure < now() - ${WINDOW_SECONDS} * interval '1 second' AND (locked_until IS NULL OR locked_until < now())`

/**
 * What one instance keeps about logins: each address's attempts this minute
 * (off when the limit is 0), and the keys that tag known addresses.
 */
export class LoginGuard {
  private readonly perAddress: RateLimiter | undefined
  /**
   * The anonymous recovery requests (a reset, its confirmation, a verification): as many again, counted apart, so that
   * neither uses up the other.
   */
  private readonly recoveryPerAddress: RateLimiter | undefined

  /**
   * `perMinute`: LOGIN_RATE_LIMIT, or 0 when RATE_LIMIT is off. `keys`: knownAddressKeysFrom(JWT_SECRETS). `now`: the
   * service's clock.
   */
  constructor(
    perMinute: number,
    private readonly keys: readonly Buffer[],
    now: () => number,
  ) {
    if (keys.length === 0)
      throw new Error('LoginGuard: no keys; config.jwtSecrets is not resolved (resolveSecrets, src/auth/secrets.ts)')
    this.perAddress = perMinute > 0 ? new RateLimiter(perMinute, undefined, now) : undefined
    this.recoveryPerAddress = perMinute > 0 ? new RateLimiter(perMinute, undefined, now) : undefined
  }

  /** The client address as the throttle counts it. */
  address(client: string): LoginAddress {
    const bucket = addressBucket(client)
    return { bucket, tags: tagsOf(this.keys, bucket) }
  }

  /** Refuses (429) an address past its attempts for this minute. */
  admit(addressBucket: string): void {
    admitTo(this.perAddress, addressBucket, 'login attempts')
  }

  /**
   * The same for the anonymous recovery endpoints (src/auth/recovery/recovery-routes.ts), on a count of their own;
   * `client` as the request gives it.
   */
  admitRecovery(client: string): void {
    admitTo(this.recoveryPerAddress, addressBucket(client), 'account recovery requests')
  }
}

function admitTo(limiter: RateLimiter | undefined, bucket: string, what: string): void {
  const decision = limiter?.hit(bucket)
  if (decision && !decision.allowed) {
    throw new HttpError('rate_limited', `At most ${decision.limit} ${what} per minute from one address.`, {
      headers: { 'retry-after': String(decision.resetSeconds) },
    })
  }
}
