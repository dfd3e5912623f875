import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { normalizeEmail } from '../../src/auth/login/login-throttle.js'
import type { TestServer } from './server.js'
import { waitUntil } from './wait.js'

// Accounts that log in with a password, as a person does: for the tests of
// what a login's credentials may do and when they stop. (server.createUser's
// JWT skips the login; these go through POST /auth/login, sessions and all.)
// Also what the tests of logins and resets under attack measure: the work a
// request costs, and a hash queue held full.

export interface Account {
  id: number
  email: string
  password: string
}

export interface Tokens {
  access_token: string
  refresh_token: string
}

/** A user with a password of its own in `server`'s database (its scrypt hash costs what a real one does). */
export async function passwordAccount(server: TestServer, role: 'admin' | 'user' = 'user'): Promise<Account> {
  const password = `pw-${randomBytes(5).toString('hex')}`
  const user = await server.createUser({ role, password })
  return { id: user.id, email: user.email, password }
}

/** POST /auth/login on `on` with the account's password; it must succeed. */
export async function passwordLogin(
  on: TestServer,
  who: Pick<Account, 'email' | 'password'>,
  format: 'jwt' | 'opaque' = 'jwt',
  headers: Record<string, string> = {},
): Promise<Tokens> {
  const res = await on.request('POST', '/auth/login', {
    auth: null,
    headers,
    body: { email: who.email, password: who.password, token_format: format },
  })
  assert.equal(res.status, 200, res.text)
  return res.body
}

/**
 * What a server did for a request, by its own counters: scrypt runs, and statements its pool sent (db_queries_total).
 */
export interface Work {
  hashes: number
  statements: number
}

/**
 * The work `request` makes `server` do, up to the end of the background work it starts (a password
 * reset's): the measure of "an unknown account costs what a known one does", exact on a machine of any
 * speed. The counters count everything the server does, so nothing else may use it meanwhile: a server
 * of the test's own, and no statement of the test's on `server.sql` (its pool) while this runs.
 */
export async function workOf<T>(server: TestServer, request: () => Promise<T>): Promise<{ result: T; work: Work }> {
  const counters = (): Work => ({ hashes: server.deps.passwords.derivations, statements: server.deps.metrics.queries })
  const before = counters()
  const result = await request()
  await waitUntil('the background work of the request done', () => server.deps.recoveryRequests.held === 0, 5000)
  const after = counters()
  return { result, work: { hashes: after.hashes - before.hashes, statements: after.statements - before.statements } }
}

/** Hashes a service runs at once (PasswordHasher's `maxRunning`). */
const HASH_SLOTS = 2

/**
 * Holds every hash slot of `server` until the returned function is called: a login in each, held up
 * inside its slot by a lock on login_failures, where a login counts its attempt once it holds a slot
 * (src/auth/routes.ts). Logins sent meanwhile wait in the hash queue or are turned away, however long a
 * hash takes on this machine. `headers` are the holders' (an X-Forwarded-For of their own, say); the
 * release answers them 401. Hold for less than the service's STATEMENT_TIMEOUT (5 s in tests), which
 * would end the holders' statements: a flood of a few hundred logins arrives in a fraction of that.
 */
export async function holdHashSlots(server: TestServer, headers: Record<string, string> = {}) {
  const held = await server.sql.reserve()
  await held`BEGIN`
  // Held idle while the test floods the server: longer than the pool's own limit may be, on a busy machine.
  await held`SET LOCAL idle_in_transaction_session_timeout = 0`
  await held`LOCK TABLE login_failures IN ACCESS EXCLUSIVE MODE`
  const holders = Array.from({ length: HASH_SLOTS }, () =>
    server.request('POST', '/auth/login', {
      auth: null,
      headers,
      body: { email: `holder-${randomBytes(4).toString('hex')}@example.com`, password: 'held-up-1' },
    }),
  )
  await waitUntil('a login held in each hash slot', async () => {
    const [row] = await server.sql<[{ n: number }]>`
      SELECT count(*)::int AS n FROM pg_locks
      WHERE NOT granted AND relation = 'login_failures'::regclass
        AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`
    return row.n === HASH_SLOTS
  })
  return async (): Promise<void> => {
    await held`COMMIT`
    held.release()
    for (const res of await Promise.all(holders)) assert.equal(res.status, 401, res.text)
  }
}

/**
 * Once `n` reset requests for `email` have been worked on: the service answers before it works on
 * one (src/auth/recovery/recovery-routes.ts), and each leaves a row whether or not an account has the address.
 */
export async function resetRequestsWorked(server: TestServer, email: string, n: number): Promise<void> {
  const hash = createHash('sha256').update(normalizeEmail(email)).digest()
  await waitUntil(
    `${n} reset requests for ${email} worked on`,
    async () => {
      const [row] = await server.sql<
        [{ n: number }]
      >`SELECT count(*)::int AS n FROM password_reset_requests WHERE email_hash = ${hash}`
      return row.n >= n
    },
    5000,
  )
}
