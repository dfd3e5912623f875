import assert from 'node:assert/strict'
import { createHmac } from 'node:crypto'
import { passwordAccount, passwordLogin, type Account, type Tokens } from './accounts.js'
import type { TestServer } from './server.js'

// A second factor as a person's authenticator app has it: TOTP written here
// from RFC 6238, not from src/ (so the service is held against the RFC, not
// against itself), and users enrolled through the API.

/** The RFC 6238 code of a base32 secret at a time (HMAC-SHA-1, 30-second steps). */
export function rfcTotp(base32Secret: string, atMs: number, digits = 6): string {
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567'
  const bits = [...base32Secret].map((c) => alphabet.indexOf(c).toString(2).padStart(5, '0')).join('')
  const key = Buffer.from((bits.match(/.{8}/g) ?? []).map((b) => parseInt(b, 2)))
  const counter = Buffer.alloc(8)
  counter.writeBigUInt64BE(BigInt(Math.floor(atMs / 30_000)))
  const mac = createHmac('sha1', key).update(counter).digest()
  const offset = mac[19]! & 15
  return String((mac.readUInt32BE(offset) & 0x7fffffff) % 10 ** digits).padStart(digits, '0')
}

export interface Enrolled extends Account {
  secret: string
  recoveryCodes: string[]
  /** The session that enrolled, with every factor proved. */
  session: Tokens
}

/**
 * A new user with a password and a confirmed factor, made through `on`'s API;
 * then the clocks of `servers` move on a step, so that the next code is new.
 */
export async function enrolledUser(
  on: TestServer,
  servers: readonly TestServer[],
  role: 'admin' | 'user' = 'user',
): Promise<Enrolled> {
  const account = await passwordAccount(on, role)
  const session = await passwordLogin(on, account)
  const started = await on.request('POST', '/auth/mfa/totp', { auth: session.access_token })
  assert.equal(started.status, 201, started.text)
  const confirmed = await on.request('POST', '/auth/mfa/totp/confirm', {
    auth: session.access_token,
    body: { code: rfcTotp(started.body.secret, on.clock.now()) },
  })
  assert.equal(confirmed.status, 200, confirmed.text)
  for (const server of servers) server.clock.advance(30_000)
  return { ...account, secret: started.body.secret, recoveryCodes: confirmed.body.recovery_codes, session }
}
