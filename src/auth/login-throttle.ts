import { recordEvents } from '../events/record.js'
import type { EventOrigin } from '../events/origin.js'
import type { Sql } from 'postgres'
import { HttpError } from '../http/problem.js'
import { RateLimiter } from '../http/rate-limit.js'
import { describeError, type Logger } from '../log.js'

// Failed logins are counted in the database (every instance sees them), for
// unknown e-mail addresses too, so the answer says nothing about which
// accounts exist. Two counts per attempt:
// - per (account, client address): after FREE_FAILURES within WINDOW the pair
//   is locked for a delay that doubles with each further failure, up to
//   MAX_LOCK. Guessing from one address becomes slow, and the owner at
//   another address is not locked out by it;
// - per account alone (address '*'): the same from ACCOUNT_FREE_FAILURES on,
//   against guessing spread over many addresses.
// A successful login clears its pair's count. Before any of this, each
// address may try LOGINS_PER_MINUTE times a minute on this instance.

const FREE_FAILURES = 5
const ACCOUNT_FREE_FAILURES = 100
const WINDOW_SECONDS = 15 * 60
const FIRST_LOCK_SECONDS = 30
const MAX_LOCK_SECONDS = 15 * 60
const ANY_ADDRESS = '*'

/** Login attempts one client address may make per minute on one instance (when RATE_LIMIT is on). */
export const LOGINS_PER_MINUTE = 30
const PURGE_EVERY_MS = 60_000
const PURGE_BATCH = 1000
const PURGE_MAX_BATCHES = 10

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
 * concurrent guesses cannot outrun the lock.
 */
export async function recordFailedLogin(sql: Sql, attempt: { email: string; userId: number | undefined; client: string }, origin: EventOrigin): Promise<void> {
  await recordEvents(sql, [{
    type: 'login.failed',
    subject: { type: 'user', id: attempt.userId ?? null },
    data: { email: attempt.email, client_address: attempt.client.slice(0, 64) },
  }], origin)
}

/**
 * Counts a login attempt before its password is checked, or refuses it (429)
 * while its pair or its account is locked. Check and count are one statement,
 * serialized on the rows, so concurrent guesses cannot outrun the lock. Call
 * it only once the attempt will be checked (holding a hash slot): an attempt
 * turned away before that is not a failure.
 */
export async function countAttempt(sql: Sql, email: string, address: string): Promise<void> {
  const counted = await sql<Array<{ address: string }>>`
    INSERT INTO login_failures AS f (email, address, failures, last_failure)
    VALUES (${email}, ${address}, 1, now()), (${email}, ${ANY_ADDRESS}, 1, now())
    ON CONFLICT (email, address) DO UPDATE SET
      failures = CASE WHEN f.last_failure < now() - ${WINDOW_SECONDS}::int * interval '1 second' THEN 1 ELSE f.failures + 1 END,
      last_failure = now(),
      locked_until = CASE
        WHEN f.last_failure >= now() - ${WINDOW_SECONDS}::int * interval '1 second'
          AND f.failures + 1 >= CASE WHEN f.address = ${ANY_ADDRESS} THEN ${ACCOUNT_FREE_FAILURES}::int ELSE ${FREE_FAILURES}::int END
        THEN now() + least(${FIRST_LOCK_SECONDS}::int * power(2, f.failures + 1 - CASE WHEN f.address = ${ANY_ADDRESS} THEN ${ACCOUNT_FREE_FAILURES}::int ELSE ${FREE_FAILURES}::int END), ${MAX_LOCK_SECONDS}::int) * interval '1 second'
        ELSE NULL END
    WHERE f.locked_until IS NULL OR f.locked_until <= now()
    RETURNING address`
  if (counted.length === 2) return
  const [row] = await sql<Array<{ wait: number }>>`
    SELECT max(extract(epoch FROM locked_until - now()))::float8 AS wait FROM login_failures
    WHERE email = ${email} AND address IN (${address}, ${ANY_ADDRESS}) AND locked_until > now()`
  throw tooMany(row?.wait ?? 1)
}

/** A successful login clears its pair's count (the account's decays with its window). */
export async function clearFailures(sql: Sql, email: string, address: string): Promise<void> {
  await sql`DELETE FROM login_failures WHERE email = ${email} AND address = ${address}`
}

/** Deletes rows whose window has passed and whose lock has run out, a batch at a time; returns how many. */
export async function purgeLoginFailures(sql: Sql): Promise<number> {
  let purged = 0
  for (let batch = 0; batch < PURGE_MAX_BATCHES; batch++) {
    const deleted = await sql`
      DELETE FROM login_failures WHERE ctid IN (
        SELECT ctid FROM login_failures
        WHERE last_failure < now() - ${WINDOW_SECONDS} * interval '1 second' AND (locked_until IS NULL OR locked_until < now())
        LIMIT ${PURGE_BATCH})`
    purged += deleted.count
    if (deleted.count < PURGE_BATCH) break
  }
  return purged
}

/**
 * What one instance keeps about logins: each address's attempts this minute
 * (off when RATE_LIMIT=0), and when it last purged old failure counts (at
 * most once a minute, in the background of a login).
 */
export class LoginGuard {
  private readonly perAddress: RateLimiter | undefined
  private lastPurge = 0

  constructor(rateLimitOn: boolean, private readonly log: Logger, perMinute = LOGINS_PER_MINUTE) {
    this.perAddress = rateLimitOn ? new RateLimiter(perMinute) : undefined
  }

  /** Refuses (429) an address past its attempts for this minute. */
  admit(addressBucket: string): void {
    const decision = this.perAddress?.hit(addressBucket)
    if (decision && !decision.allowed) {
      throw new HttpError('rate_limited', `At most ${decision.limit} login attempts per minute from one address.`, {
        headers: { 'retry-after': String(decision.resetSeconds) },
      })
    }
  }

  purgeNow(sql: Sql, now = Date.now()): void {
    if (now - this.lastPurge < PURGE_EVERY_MS) return
    this.lastPurge = now
    purgeLoginFailures(sql).catch((err: unknown) => this.log.warn('purging old login failures failed', describeError(err)))
  }
}
