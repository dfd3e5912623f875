import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { describe, test } from 'node:test'
import { base32Decode, base32Encode, hotp, matchTotp, stepAt } from '../src/auth/mfa/totp.js'
import { passwordAccount, passwordLogin, type Account } from './helpers/accounts.js'
import { enrolledUser, rfcTotp } from './helpers/totp.js'
import { startServer, type TestResponse, type TestServer } from './helpers/server.js'
import { propagationBound } from './helpers/time-bounds.js'
import { refusedEverywhere } from './helpers/refused.js'

// The second factor (docs/auth.md, "Second factor (TOTP)") and step-up
// ("Step-up"), against two instances sharing one database: TOTP itself
// against RFC 6238's vectors and a TOTP written here from the RFC; enrolment,
// login in one and two steps, recovery codes, replay and guessing, turning
// it off, an admin's removal; what a login proves (amr, auth_time); the
// step-up acts, API keys refused. MFA_REQUIRED and rotation:
// test/mfa-policy.test.ts.

const A = await startServer()
const B = await startServer({}, {}, { databaseUrl: A.databaseUrl })
const { sql } = A
const both = [A, B]

/** Moves both instances' clocks on by one 30-second step, so that a new code is due. */
function nextStep(): void {
  for (const server of both) server.clock.advance(30_000)
}

/** The code an authenticator shows now for `secret`, by the instances' (shared) clock. */
const codeNow = (secret: string) => rfcTotp(secret, A.clock.now())

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/)
  assert.equal(res.body.code, code, res.text)
}

const claimsOf = (jwt: string) => JSON.parse(Buffer.from(jwt.split('.')[1]!, 'base64url').toString())

/** A user with a password and a confirmed factor, through the API. */
const enrolled = (role: 'admin' | 'user' = 'user') => enrolledUser(A, both, role)

const login = (on: TestServer, body: Record<string, unknown>) => on.request('POST', '/auth/login', { auth: null, body })
const secondStep = (on: TestServer, body: Record<string, unknown>) =>
  on.request('POST', '/auth/login/mfa', { auth: null, body })
const me = (on: TestServer, token: string) => on.request('GET', '/auth/me', { auth: token })

async function mfaToken(who: Account, on: TestServer = A, extra: Record<string, unknown> = {}): Promise<string> {
  const res = await login(on, { email: who.email, password: who.password, ...extra })
  assertProblem(res, 401, 'mfa_required')
  assert.match(res.headers.get('www-authenticate') ?? '', /^Bearer realm="api"/)
  assert.match(res.body.mfa_token, /^upa_mt_[A-Za-z0-9_-]{43}$/)
  assert.equal(res.body.expires_in, 300)
  return res.body.mfa_token
}

const countSessions = async (userId: number) =>
  (
    await sql<[{ n: number }]>`SELECT count(*)::int AS n FROM sessions WHERE user_id = ${userId} AND revoked_at IS NULL`
  )[0].n
const backdateLogins = (userId: number, minutes: number) =>
  sql`UPDATE sessions SET created_at = created_at - ${minutes} * interval '1 minute' WHERE user_id = ${userId}`

describe('TOTP itself', () => {
  test("RFC 6238 appendix B's SHA-1 vectors (8 digits), and the RFC written again here agrees on 6", () => {
    const seed = Buffer.from('12345678901234567890')
    const vectors: Array<[number, string]> = [
      [59, '94287082'],
      [1111111109, '07081804'],
      [1111111111, '14050471'],
      [1234567890, '89005924'],
      [2000000000, '69279037'],
      [20000000000, '65353130'],
    ]
    for (const [seconds, code] of vectors) {
      assert.equal(hotp(seed, Math.floor(seconds / 30), 8), code, `T = ${seconds}`)
      assert.equal(rfcTotp(base32Encode(seed), seconds * 1000, 8), code)
    }
  })

  test('base32 as RFC 4648 §10 spells it, both ways', () => {
    const vectors = [
      ['', ''],
      ['f', 'MY'],
      ['fo', 'MZXQ'],
      ['foo', 'MZXW6'],
      ['foob', 'MZXW6YQ'],
      ['fooba', 'MZXW6YTB'],
      ['foobar', 'MZXW6YTBOI'],
    ]
    for (const [text, encoded] of vectors) {
      assert.equal(base32Encode(Buffer.from(text!)), encoded)
      assert.equal(base32Decode(encoded!).toString(), text)
    }
    assert.throws(() => base32Decode('MZ1W'))
  })

  test('a code holds for its step and one either side, after the last step accepted only, and in no other form', () => {
    const secret = base32Encode(randomBytes(20))
    const now = Date.UTC(2026, 10, 27, 12, 0, 15)
    const step = stepAt(now)
    for (const offset of [-1, 0, 1]) {
      const code = rfcTotp(secret, now + offset * 30_000)
      assert.equal(matchTotp(secret, code, now, 0), step + offset, `offset ${offset}`)
      assert.equal(matchTotp(secret, code, now, step + offset), undefined, 'a step is accepted once')
    }
    for (const offset of [-2, 2])
      assert.equal(matchTotp(secret, rfcTotp(secret, now + offset * 30_000), now, 0), undefined)
    const code = rfcTotp(secret, now)
    for (const bad of [` ${code}`, `${code}\n`, code.slice(0, 5), `${code}0`, '١٢٣٤٥٦', 'abcdef', `${code}\u0000`])
      assert.equal(matchTotp(secret, bad, now, 0), undefined, JSON.stringify(bad))
  })
})

describe('enrolment', () => {
  test(
    'a secret and its otpauth:// URI; the first code turns it on, answers 10 recovery codes once, ends the other ' +
      'sessions on both instances',
    async () => {
      const account = await passwordAccount(A)
      const session = await passwordLogin(A, account)
      const other = await passwordLogin(B, account, 'opaque')
      const started = await A.request('POST', '/auth/mfa/totp', { auth: session.access_token })
      assert.equal(started.status, 201, started.text)
      assert.equal(started.headers.get('cache-control'), 'no-store')
      const { secret, otpauth_uri: uri } = started.body
      assert.match(secret, /^[A-Z2-7]{32}$/)
      const parsed = new URL(uri)
      assert.equal(parsed.protocol, 'otpauth:')
      assert.equal(parsed.host, 'totp')
      assert.equal(decodeURIComponent(parsed.pathname), `/users-products-api:${account.email}`)
      assert.deepEqual(Object.fromEntries(parsed.searchParams), {
        secret,
        issuer: 'users-products-api',
        algorithm: 'SHA1',
        digits: '6',
        period: '30',
      })
      // Stored sealed: the secret is nowhere in the row.
      const [row] = await sql<[{ sealed: string; confirmed: boolean }]>`
      SELECT secret_sealed AS sealed, confirmed_at IS NOT NULL AS confirmed FROM totp_factors
        WHERE user_id = ${account.id}`
      assert.equal(row.confirmed, false)
      assert.ok(!row.sealed.includes(secret) && !row.sealed.includes(base32Decode(secret).toString('base64url')))

      // Not on until a code proves the app has it: a login needs no code yet.
      const wrong = String((Number(codeNow(secret)) + 1) % 1_000_000).padStart(6, '0')
      assertProblem(
        await A.request('POST', '/auth/mfa/totp/confirm', { auth: session.access_token, body: { code: wrong } }),
        403,
        'mfa_code_required',
      )
      assert.equal((await login(A, { email: account.email, password: account.password })).status, 200)

      const confirmed = await A.request('POST', '/auth/mfa/totp/confirm', {
        auth: session.access_token,
        body: { code: codeNow(secret) },
      })
      assert.equal(confirmed.status, 200, confirmed.text)
      const codes: string[] = confirmed.body.recovery_codes
      assert.equal(codes.length, 10)
      assert.equal(new Set(codes).size, 10)
      for (const code of codes) assert.match(code, /^[a-z2-7]{5}-[a-z2-7]{5}$/)
      const stored = await sql<
        Array<{ code_hash: Buffer }>
      >`SELECT code_hash FROM recovery_codes WHERE user_id = ${account.id}`
      assert.equal(stored.length, 10)
      for (const { code_hash } of stored) assert.equal(code_hash.length, 32)
      // The other sessions proved only the password: they end, on the other instance too.
      assertProblem(await me(B, other.access_token), 401, 'invalid_token')
      assertProblem(
        await B.request('POST', '/auth/refresh', { auth: null, body: { refresh_token: other.refresh_token } }),
        401,
        'invalid_token',
      )
      assert.equal((await me(A, session.access_token)).status, 200, 'the confirming session goes on')
      // Its next tokens say it proved the factor.
      const refreshed = await A.request('POST', '/auth/refresh', {
        auth: null,
        body: { refresh_token: session.refresh_token },
      })
      assert.deepEqual(claimsOf(refreshed.body.access_token).amr, ['pwd', 'otp'])
      await A.published()
      const [event] = await sql<Array<{ data: unknown; actor_id: string }>>`
      SELECT data, actor_id FROM events WHERE type = 'user.mfa_enabled' AND subject_id = ${account.id}`
      assert.deepEqual(event!.data, { id: account.id })
      assert.equal(Number(event!.actor_id), account.id)

      nextStep()
      assertProblem(
        await A.request('POST', '/auth/mfa/totp/confirm', {
          auth: refreshed.body.access_token,
          body: { code: codeNow(secret) },
        }),
        409,
        'mfa_already_enabled',
      )
      assertProblem(
        await A.request('POST', '/auth/mfa/totp', { auth: refreshed.body.access_token }),
        409,
        'mfa_already_enabled',
      )
    },
  )

  test('enrolling needs a login with a fresh proof: an API key 403, a stale session 403', async () => {
    const account = await passwordAccount(A)
    const session = await passwordLogin(A, account)
    const key = await A.request('POST', '/api-keys', {
      auth: session.access_token,
      body: { name: 'k', scopes: ['users:read'], current_password: account.password },
    })
    assert.equal(key.status, 201, key.text)
    assertProblem(
      await A.request('POST', '/auth/mfa/totp', { auth: null, headers: { 'x-api-key': key.body.key } }),
      403,
      'forbidden',
    )
    await backdateLogins(account.id, 11)
    assertProblem(
      await A.request('POST', '/auth/mfa/totp', { auth: session.access_token }),
      403,
      'current_password_required',
    )
    assertProblem(
      await A.request('POST', '/auth/mfa/totp', {
        auth: session.access_token,
        body: { current_password: 'wrong-one' },
      }),
      403,
      'current_password_required',
    )
    const fresh = await A.request('POST', '/auth/mfa/totp', {
      auth: session.access_token,
      body: { current_password: account.password },
    })
    assert.equal(fresh.status, 201, fresh.text)
    // A second start replaces the first secret: the first one's code does not confirm.
    const again = await A.request('POST', '/auth/mfa/totp', {
      auth: session.access_token,
      body: { current_password: account.password },
    })
    assert.notEqual(again.body.secret, fresh.body.secret)
    assertProblem(
      await A.request('POST', '/auth/mfa/totp/confirm', {
        auth: session.access_token,
        body: { code: codeNow(fresh.body.secret) },
      }),
      403,
      'mfa_code_required',
    )
    assertProblem(
      await A.request('POST', '/auth/mfa/recovery-codes', {
        auth: session.access_token,
        body: { current_password: account.password },
      }),
      409,
      'mfa_not_enabled',
    )
  })

  test('hostile bodies: 4xx, nothing enrolled or turned on', async () => {
    const account = await passwordAccount(A)
    const session = await passwordLogin(A, account)
    const confirmCases: Array<[unknown, number]> = [
      [{ code: 123456 }, 422],
      [{ code: '12345' }, 422],
      [{ code: '1234567' }, 422],
      [{ code: '12345\u0000' }, 422],
      [{ code: '１２３４５６' }, 422],
      [{ code: '123456', extra: true }, 422],
      [{}, 422],
      [[], 422],
      ['{"code": "12', 400],
    ]
    for (const [body, status] of confirmCases) {
      const res = await A.request('POST', '/auth/mfa/totp/confirm', {
        auth: session.access_token,
        body: typeof body === 'string' ? body : (body as object),
      })
      assert.equal(res.status, status, `${JSON.stringify(body)}: ${res.text}`)
    }
    const plain = await A.request('POST', '/auth/mfa/totp', {
      auth: session.access_token,
      body: 'code=1',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
    })
    assert.equal(plain.status, 415, plain.text)
    assertProblem(
      await A.request('POST', '/auth/mfa/totp', { auth: session.access_token, body: { code: 1 } }),
      422,
      'validation_failed',
    )
    const [{ n }] = await sql<
      [{ n: number }]
    >`SELECT count(*)::int AS n FROM totp_factors WHERE user_id = ${account.id}`
    assert.equal(n, 0)
  })
})

describe('logging in with a second factor', () => {
  test(
    'the password alone: 401 mfa_required with an mfa_token and no session; the second step on the other instance ' +
      'gives tokens that say otp',
    async () => {
      const user = await enrolled()
      const before = await countSessions(user.id)
      const token = await mfaToken(user)
      assert.equal(await countSessions(user.id), before, 'no session for half a login')
      const res = await secondStep(B, { mfa_token: token, code: codeNow(user.secret) })
      assert.equal(res.status, 200, res.text)
      const claims = claimsOf(res.body.access_token)
      assert.deepEqual(claims.amr, ['pwd', 'otp'])
      const shown = await me(A, res.body.access_token)
      assert.deepEqual(shown.body.credential.amr, ['pwd', 'otp'])
      assert.equal(shown.body.credential.auth_time, claims.auth_time)
      // Single use: the token opens no second session, even with the next code.
      nextStep()
      assertProblem(await secondStep(A, { mfa_token: token, code: codeNow(user.secret) }), 401, 'invalid_token')
    },
  )

  test(
    'a wrong password is the same 401 invalid_credentials as ever, with no mfa_token: the factor does not help ' +
      'test passwords',
    async () => {
      const user = await enrolled()
      const res = await login(A, { email: user.email, password: 'not-the-password' })
      assertProblem(res, 401, 'invalid_credentials')
      assert.equal(res.body.mfa_token, undefined)
      // And a wrong password with a right code is no better.
      assertProblem(
        await login(A, { email: user.email, password: 'nope', code: codeNow(user.secret) }),
        401,
        'invalid_credentials',
      )
    },
  )

  test('one request with {email, password, code}, opaque tokens, the scope asked for', async () => {
    const user = await enrolled()
    const res = await login(B, {
      email: user.email,
      password: user.password,
      code: codeNow(user.secret),
      token_format: 'opaque',
      scope: 'users:read',
    })
    assert.equal(res.status, 200, res.text)
    assert.equal(res.body.scope, 'users:read')
    const shown = await me(A, res.body.access_token)
    assert.equal(shown.body.credential.type, 'token')
    assert.deepEqual(shown.body.credential.amr, ['pwd', 'otp'])
  })

  test('a code is accepted once: the same code replayed (same step, either instance) is refused', async () => {
    const user = await enrolled()
    const code = codeNow(user.secret)
    assert.equal((await login(A, { email: user.email, password: user.password, code })).status, 200)
    assertProblem(await login(B, { email: user.email, password: user.password, code }), 401, 'invalid_credentials')
    const token = await mfaToken(user)
    assertProblem(await secondStep(A, { mfa_token: token, code }), 401, 'invalid_credentials')
    // An earlier step, even within the drift, is behind the last one accepted.
    nextStep()
    assert.equal((await secondStep(A, { mfa_token: token, code: codeNow(user.secret) })).status, 200)
  })

  test('a recovery code works once, in one request or the second step, and never as a code', async () => {
    const user = await enrolled()
    const [first, second] = user.recoveryCodes
    const one = await login(A, { email: user.email, password: user.password, recovery_code: first })
    assert.equal(one.status, 200, one.text)
    assertProblem(
      await login(B, { email: user.email, password: user.password, recovery_code: first }),
      401,
      'invalid_credentials',
    )
    const token = await mfaToken(user)
    // Upper case and without the dash, as people retype it.
    const res = await secondStep(B, { mfa_token: token, recovery_code: second!.toUpperCase().replace('-', '') })
    assert.equal(res.status, 200, res.text)
    const [{ left }] = await sql<[{ left: number }]>`
      SELECT count(*)::int AS left FROM recovery_codes WHERE user_id = ${user.id} AND used_at IS NULL`
    assert.equal(left, 8)
    // New codes (fresh proof: this login just proved every factor) replace the old ones.
    const renewed = await A.request('POST', '/auth/mfa/recovery-codes', { auth: res.body.access_token })
    assert.equal(renewed.status, 200, renewed.text)
    assert.equal(renewed.body.recovery_codes.length, 10)
    assertProblem(
      await login(A, { email: user.email, password: user.password, recovery_code: user.recoveryCodes[2] }),
      401,
      'invalid_credentials',
    )
  })

  test(
    'wrong codes count against the account as wrong passwords do: the lock comes, login.failed is ' + 'recorded',
    async () => {
      const user = await enrolled()
      const token = await mfaToken(user)
      const wrong = String((Number(codeNow(user.secret)) + 500_000) % 1_000_000).padStart(6, '0')
      let locked: TestResponse | undefined
      let refused = 0
      for (let i = 0; i < 12 && !locked; i++) {
        const res = await secondStep(i % 2 ? A : B, { mfa_token: token, code: wrong })
        if (res.status === 429) locked = res
        else assertProblem(res, 401, 'invalid_credentials')
        if (res.status === 401) refused++
      }
      assert.ok(locked, 'locked within 12 wrong codes')
      assertProblem(locked, 429, 'too_many_login_attempts')
      assert.ok(Number(locked.headers.get('retry-after')) > 0)
      // Locked for the right code too, and for a new password login from here.
      assertProblem(
        await secondStep(A, { mfa_token: token, code: codeNow(user.secret) }),
        429,
        'too_many_login_attempts',
      )
      await A.published()
      const [{ failed }] = await sql<[{ failed: number }]>`
      SELECT count(*)::int AS failed FROM events WHERE type = 'login.failed' AND subject_id = ${user.id}`
      assert.equal(failed, refused, 'one login.failed per wrong code checked')
    },
  )

  test('an mfa_token dies with its 300 s, with a password change, and is no credential anywhere', async () => {
    const user = await enrolled()
    const expired = await mfaToken(user)
    await sql`UPDATE mfa_challenges SET expires_at = now() - interval '1 second' WHERE user_id = ${user.id}`
    assertProblem(await secondStep(A, { mfa_token: expired, code: codeNow(user.secret) }), 401, 'invalid_token')
    const token = await mfaToken(user)
    assertProblem(await me(A, token), 401, 'invalid_token')
    const changed = await A.request('PATCH', `/users/${user.id}`, {
      auth: user.session.access_token,
      body: {
        password: `new-${randomBytes(4).toString('hex')}`,
        current_password: user.password,
        code: codeNow(user.secret),
      },
    })
    assert.equal(changed.status, 200, changed.text)
    nextStep()
    assertProblem(await secondStep(A, { mfa_token: token, code: codeNow(user.secret) }), 401, 'invalid_token')
  })

  test('hostile second steps: 4xx, no session', async () => {
    const user = await enrolled()
    const token = await mfaToken(user)
    const before = await countSessions(user.id)
    const cases: Array<[unknown, number, string?]> = [
      [{ mfa_token: token }, 400, 'invalid_request'],
      [{ mfa_token: token, code: codeNow(user.secret), recovery_code: user.recoveryCodes[0] }, 400, 'invalid_request'],
      [{ mfa_token: token, code: '12345' }, 422],
      [{ mfa_token: token, code: 123456 }, 422],
      [{ mfa_token: token, code: '123456', admin: true }, 422],
      [{ mfa_token: 'x'.repeat(5000), code: '123456' }, 422],
      [{ mfa_token: `${token}\u0000`, code: '123456' }, 422],
      [{ mfa_token: 'upa_mt_forged', code: '123456' }, 401, 'invalid_token'],
      [{ mfa_token: user.session.refresh_token, code: codeNow(user.secret) }, 401, 'invalid_token'],
      [{ mfa_token: token, recovery_code: 'aaaaa-aaaaa-aaaaa' }, 422],
    ]
    for (const [body, status, code] of cases) {
      const res = await secondStep(A, body as Record<string, unknown>)
      assert.equal(res.status, status, `${JSON.stringify(body).slice(0, 80)}: ${res.text}`)
      if (code) assert.equal(res.body.code, code)
    }
    const form = await A.request('POST', '/auth/login/mfa', {
      auth: null,
      body: `mfa_token=${token}&code=123456`,
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
    })
    assert.equal(form.status, 415)
    assert.equal(await countSessions(user.id), before)
  })
})

describe('turning it off, and an admin removing it', () => {
  test('DELETE /auth/mfa/totp needs the password and a code; then a login needs the password only', async () => {
    const user = await enrolled()
    const auth = user.session.access_token
    assertProblem(
      await A.request('DELETE', '/auth/mfa/totp', { auth, body: { current_password: user.password } }),
      403,
      'mfa_code_required',
    )
    assertProblem(
      await A.request('DELETE', '/auth/mfa/totp', {
        auth,
        body: { current_password: 'wrong', code: codeNow(user.secret) },
      }),
      403,
      'current_password_required',
    )
    assertProblem(
      await A.request('DELETE', '/auth/mfa/totp', { auth, body: { code: codeNow(user.secret) } }),
      422,
      'validation_failed',
    )
    const off = await A.request('DELETE', '/auth/mfa/totp', {
      auth,
      body: { current_password: user.password, code: codeNow(user.secret) },
    })
    assert.equal(off.status, 204, off.text)
    assert.equal((await login(B, { email: user.email, password: user.password })).status, 200)
    const [{ rows }] = await sql<[{ rows: number }]>`
      SELECT (SELECT count(*) FROM totp_factors WHERE user_id = ${user.id})::int
        + (SELECT count(*) FROM recovery_codes WHERE user_id = ${user.id})::int AS rows`
    assert.equal(rows, 0)
    await A.published()
    const [event] = await sql`SELECT 1 FROM events WHERE type = 'user.mfa_disabled' AND subject_id = ${user.id}`
    assert.ok(event)
    assertProblem(
      await A.request('DELETE', '/auth/mfa/totp', { auth, body: { current_password: user.password, code: '123456' } }),
      409,
      'mfa_not_enabled',
    )
  })

  test(
    "an admin's DELETE /users/{id}/mfa ends every session, JWT and API key of that user on both " + 'instances',
    async () => {
      const user = await enrolled()
      const key = await A.request('POST', '/api-keys', {
        auth: user.session.access_token,
        body: { name: 'k', scopes: ['users:read'], current_password: user.password, code: codeNow(user.secret) },
      })
      assert.equal(key.status, 201, key.text)
      const admin = await passwordAccount(A, 'admin')
      const adminSession = await passwordLogin(A, admin)
      const within = await propagationBound(both)
      const removed = await A.request('DELETE', `/users/${user.id}/mfa`, { auth: adminSession.access_token })
      assert.equal(removed.status, 204, removed.text)
      await refusedEverywhere(both, (server) => me(server, user.session.access_token), within)
      await refusedEverywhere(
        both,
        (server) => server.request('GET', '/auth/me', { auth: null, headers: { 'x-api-key': key.body.key } }),
        within,
      )
      assert.equal(
        (await login(A, { email: user.email, password: user.password })).status,
        200,
        'the password alone now',
      )
      await A.published()
      const [event] = await sql<Array<{ actor_id: string }>>`
      SELECT actor_id FROM events WHERE type = 'user.mfa_disabled' AND subject_id = ${user.id}`
      assert.equal(Number(event!.actor_id), admin.id)
      // Idempotent; an unknown user is 404.
      assert.equal(
        (await A.request('DELETE', `/users/${user.id}/mfa`, { auth: adminSession.access_token })).status,
        204,
      )
      assertProblem(
        await A.request('DELETE', '/users/999999999/mfa', { auth: adminSession.access_token }),
        404,
        'not_found',
      )
    },
  )

  test("removing another's factor is an admin's, with a fresh proof, never with an API key", async () => {
    const user = await enrolled()
    const other = await passwordAccount(A)
    const otherSession = await passwordLogin(A, other)
    assertProblem(
      await A.request('DELETE', `/users/${user.id}/mfa`, { auth: otherSession.access_token }),
      403,
      'forbidden',
    )
    const admin = await passwordAccount(A, 'admin')
    const adminSession = await passwordLogin(A, admin)
    const adminKey = await A.request('POST', '/api-keys', {
      auth: adminSession.access_token,
      body: { name: 'k', scopes: ['users:read', 'users:write'], current_password: admin.password },
    })
    assertProblem(
      await A.request('DELETE', `/users/${user.id}/mfa`, { auth: null, headers: { 'x-api-key': adminKey.body.key } }),
      403,
      'forbidden',
    )
    await backdateLogins(admin.id, 11)
    assertProblem(
      await A.request('DELETE', `/users/${user.id}/mfa`, { auth: adminSession.access_token }),
      403,
      'current_password_required',
    )
    const [{ on }] = await sql<[{ on: number }]>`
      SELECT count(*)::int AS on FROM totp_factors WHERE user_id = ${user.id} AND confirmed_at IS NOT NULL`
    assert.equal(on, 1)
  })
})

describe('step-up: what creates lasting authority needs a login with a fresh proof', () => {
  test('a right password with a wrong code, again and again, meets the lock: the password clears nothing', async () => {
    const user = await enrolled()
    const wrong = String((Number(codeNow(user.secret)) + 500_000) % 1_000_000).padStart(6, '0')
    const body = { name: 'k', scopes: ['users:read'], current_password: user.password, code: wrong }
    let locked: TestResponse | undefined
    for (let i = 0; i < 12 && !locked; i++) {
      const res = await A.request('POST', '/api-keys', { auth: user.session.access_token, body })
      if (res.status === 429) locked = res
      else assertProblem(res, 403, 'mfa_code_required')
    }
    assert.ok(locked, 'locked within 12 tries')
    assertProblem(locked, 429, 'too_many_login_attempts')
    const [{ keys }] = await sql<
      [{ keys: number }]
    >`SELECT count(*)::int AS keys FROM api_keys WHERE user_id = ${user.id}`
    assert.equal(keys, 0)
  })

  test("an admin's API key with users:write makes no admin and sets no password (the review's finding)", async () => {
    const admin = await passwordAccount(A, 'admin')
    const session = await passwordLogin(A, admin)
    const key = await A.request('POST', '/api-keys', {
      auth: session.access_token,
      body: { name: 'k', scopes: ['users:read', 'users:write'], current_password: admin.password },
    })
    const withKey = { auth: null, headers: { 'x-api-key': key.body.key } }
    const email = `made-${randomBytes(4).toString('hex')}@example.com`
    for (const body of [
      { name: 'Made', email, role: 'admin' },
      { name: 'Made', email, password: 'chosen-password' },
      { name: 'Made', email, role: 'admin', password: 'chosen-password', current_password: admin.password },
    ])
      assertProblem(await A.request('POST', '/users', { ...withKey, body }), 403, 'forbidden')
    const [{ made }] = await sql<[{ made: number }]>`SELECT count(*)::int AS made FROM users WHERE email = ${email}`
    assert.equal(made, 0)
    const victim = await passwordAccount(A)
    const [before] = await sql<[{ hash: string }]>`SELECT password_hash AS hash FROM users WHERE id = ${victim.id}`
    for (const body of [{ password: 'taken-over-1' }, { email: `x-${email}` }, { role: 'admin' }])
      assertProblem(await A.request('PATCH', `/users/${victim.id}`, { ...withKey, body }), 403, 'forbidden')
    const [after] = await sql<[{ hash: string; email: string; role: string }]>`
      SELECT password_hash AS hash, email, role FROM users WHERE id = ${victim.id}`
    assert.deepEqual(after, { hash: before.hash, email: victim.email, role: 'user' })
    // What is no step-up stays open to the key: a name, a plain user without a password.
    assert.equal(
      (await A.request('PATCH', `/users/${victim.id}`, { ...withKey, body: { name: 'Renamed' } })).status,
      200,
    )
    assert.equal((await A.request('POST', '/users', { ...withKey, body: { name: 'Plain', email } })).status, 201)
  })

  test(
    "an admin's stale session needs current_password (and code) to set another user's password, e-mail or admin " +
      'role',
    async () => {
      const admin = await enrolled('admin')
      const victim = await passwordAccount(A)
      const auth = admin.session.access_token
      await backdateLogins(admin.id, 11)
      for (const body of [
        { password: 'new-password-1' },
        { email: `v-${randomBytes(3).toString('hex')}@example.com` },
        { role: 'admin' },
      ])
        assertProblem(await A.request('PATCH', `/users/${victim.id}`, { auth, body }), 403, 'current_password_required')
      assertProblem(
        await A.request('POST', '/users', {
          auth,
          body: { name: 'New admin', email: `a-${randomBytes(3).toString('hex')}@example.com`, role: 'admin' },
        }),
        403,
        'current_password_required',
      )
      // The password without the code is not enough for a user with a factor.
      assertProblem(
        await A.request('PATCH', `/users/${victim.id}`, {
          auth,
          body: { role: 'admin', current_password: admin.password },
        }),
        403,
        'mfa_code_required',
      )
      const res = await A.request('PATCH', `/users/${victim.id}`, {
        auth,
        body: { role: 'admin', current_password: admin.password, code: codeNow(admin.secret) },
      })
      assert.equal(res.status, 200, res.text)
      assert.equal(res.body.role, 'admin')
      // A name is no step-up; a PUT naming the same address again is no change of it.
      assert.equal((await A.request('PATCH', `/users/${victim.id}`, { auth, body: { name: 'Renamed' } })).status, 200)
      const put = await A.request('PUT', `/users/${victim.id}`, { auth, body: { name: 'Again', email: victim.email } })
      assert.equal(put.status, 200, put.text)
    },
  )

  test(
    'an API key from a session that logged in with the password only, for a user who then enrolled, needs the ' +
      'code',
    async () => {
      const user = await enrolled()
      // The enrolling session proved the factor: within the window it needs nothing more.
      const windowKey = await A.request('POST', '/api-keys', {
        auth: (
          await A.request('POST', '/auth/refresh', { auth: null, body: { refresh_token: user.session.refresh_token } })
        ).body.access_token,
        body: { name: 'k', scopes: ['users:read'] },
      })
      assert.equal(windowKey.status, 201, windowKey.text)
      const [row] = await sql<
        [{ session_id: string | null }]
      >`SELECT session_id FROM api_keys WHERE id = ${windowKey.body.id}`
      assert.notEqual(row.session_id, null, 'bound to its session')
      // A login with the password alone cannot happen any more; a session backdated out of the window needs both.
      await backdateLogins(user.id, 11)
      const fresh = await passwordLogin(A, { email: user.email, password: user.password }).catch(() => undefined)
      assert.equal(fresh, undefined, 'a password login alone is refused with a factor on')
      const withBoth = await A.request('POST', '/api-keys', {
        auth: user.session.access_token,
        body: { name: 'k2', scopes: ['users:read'], current_password: user.password, code: codeNow(user.secret) },
      })
      assert.equal(withBoth.status, 201, withBoth.text)
      const [unbound] = await sql<
        [{ session_id: string | null }]
      >`SELECT session_id FROM api_keys WHERE id = ${withBoth.body.id}`
      assert.equal(unbound.session_id, null, 'made with the password in its request: its own')
      const wrongCode = String((Number(codeNow(user.secret)) + 1) % 1_000_000).padStart(6, '0')
      nextStep()
      assertProblem(
        await A.request('POST', '/api-keys', {
          auth: user.session.access_token,
          body: { name: 'k3', scopes: ['users:read'], current_password: user.password, code: wrongCode },
        }),
        403,
        'mfa_code_required',
      )
    },
  )
})
