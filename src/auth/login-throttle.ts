import type { Sql } from 'postgres'
import { HttpError } from '../http/problem.js'

// Failed logins are counted per e-mail address in the database, so every
// instance sees them, and for unknown addresses too, so the answer says
// nothing about which accounts exist. After FREE_FAILURES within WINDOW the
// address is locked for a delay that doubles with each further failure, up to
// MAX_LOCK: guessing becomes slow while the owner waits minutes at worst and
// is never locked out for good. A successful login clears the count.

const FREE_FAILURES = 5
const WINDOW_SECONDS = 15 * 60
const FIRST_LOCK_SECONDS = 30
const MAX_LOCK_SECONDS = 15 * 60

const tooMany = (seconds: number) =>
  new HttpError(429, 'too_many_login_attempts', 'Too many failed logins for this account; retry later.', {
    headers: { 'retry-after': String(Math.max(1, Math.ceil(seconds))) },
  })

/**
 * Counts a login attempt for the address before its password is checked, or
 * refuses it (429) while the address is locked. Fixed: the lock used to be
 * checked first and the failure recorded only after the ~100 ms hash, so a
 * burst of concurrent guesses all passed the check before the first failure
 * was written: one address got as many guesses as the hash queue holds (66),
 * not 5. Now check and count are one statement, serialized on the row. The
 * attempt stays counted when the password is wrong; a success clears it.
 */
export async function countAttempt(sql: Sql, email: string): Promise<void> {
  const [counted] = await sql`
    INSERT INTO login_failures AS f (email, failures, last_failure)
    VALUES (${email.toLowerCase()}, 1, now())
    ON CONFLICT (email) DO UPDATE SET
      failures = CASE WHEN f.last_failure < now() - ${WINDOW_SECONDS} * interval '1 second' THEN 1 ELSE f.failures + 1 END,
      last_failure = now(),
      locked_until = CASE
        WHEN f.last_failure >= now() - ${WINDOW_SECONDS} * interval '1 second' AND f.failures + 1 >= ${FREE_FAILURES}
        THEN now() + least(${FIRST_LOCK_SECONDS} * power(2, f.failures + 1 - ${FREE_FAILURES}), ${MAX_LOCK_SECONDS}) * interval '1 second'
        ELSE NULL END
    WHERE f.locked_until IS NULL OR f.locked_until <= now()
    RETURNING 1`
  if (counted) return
  const [row] = await sql<Array<{ wait: number }>>`
    SELECT extract(epoch FROM locked_until - now())::float8 AS wait FROM login_failures WHERE email = ${email.toLowerCase()}`
  throw tooMany(row?.wait ?? 1)
}

export async function clearFailures(sql: Sql, email: string): Promise<void> {
  await sql`DELETE FROM login_failures WHERE email = ${email.toLowerCase()}`
}
