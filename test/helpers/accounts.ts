import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { normalizeEmail } from '../../src/auth/login-throttle.js'
import type { TestServer } from './server.js'
import { waitUntil } from './wait.js'

// Accounts that log in with a password, as a person does: for the tests of
// what a login's credentials may do and when they stop. (server.createUser's
// JWT skips the login; these go through POST /auth/login, sessions and all.)

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
export async function passwordLogin(on: TestServer, who: Pick<Account, 'email' | 'password'>, format: 'jwt' | 'opaque' = 'jwt', headers: Record<string, string> = {}): Promise<Tokens> {
  const res = await on.request('POST', '/auth/login', { auth: null, headers, body: { email: who.email, password: who.password, token_format: format } })
  assert.equal(res.status, 200, res.text)
  return res.body
}

/**
 * Once `n` reset requests for `email` have been worked on: the service answers before it works on
 * one (src/auth/recovery-routes.ts), and each leaves a row whether or not an account has the address.
 */
export async function resetRequestsWorked(server: TestServer, email: string, n: number): Promise<void> {
  const hash = createHash('sha256').update(normalizeEmail(email)).digest()
  await waitUntil(`${n} reset requests for ${email} worked on`, async () => {
    const [row] = await server.sql<[{ n: number }]>`SELECT count(*)::int AS n FROM password_reset_requests WHERE email_hash = ${hash}`
    return row.n >= n
  }, 5000)
}
