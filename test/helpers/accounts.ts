import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import type { TestServer } from './server.js'

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
