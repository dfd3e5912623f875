import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, describe, test } from 'node:test'
import { resealTotpSecrets } from '../src/auth/mfa/factors.js'
import { passwordAccount, passwordLogin } from './helpers/accounts.js'
import { enrolledUser, rfcTotp } from './helpers/totp.js'
import { startServer, type TestResponse, type TestServer } from './helpers/server.js'
import { API_SCOPES, startTestProvider } from './helpers/oidc-provider.js'

// The second factor's policy and keeping (docs/auth.md, "Second factor
// (TOTP)"): MFA_REQUIRED for logins and provider tokens, and TOTP secrets
// through a rotation of JWT_SECRETS. The factor itself: test/mfa.test.ts.

const A = await startServer()
const { sql } = A

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/)
  assert.equal(res.body.code, code, res.text)
}

const login = (on: TestServer, body: Record<string, unknown>) => on.request('POST', '/auth/login', { auth: null, body })

describe('MFA_REQUIRED', () => {
  test(
    'admin: an admin without a factor may only see itself and enrol; after enrolling and logging in again, ' +
      'everything',
    async () => {
      const strict = await startServer({ MFA_REQUIRED: 'admin' }, {}, { databaseUrl: A.databaseUrl })
      const admin = await passwordAccount(strict, 'admin')
      for (const format of ['jwt', 'opaque'] as const) {
        const held = await passwordLogin(strict, admin, format)
        assertProblem(
          await strict.request('GET', '/users', { auth: held.access_token }),
          403,
          'mfa_enrollment_required',
        )
        assertProblem(
          await strict.request('POST', '/api-keys', {
            auth: held.access_token,
            body: { name: 'k', scopes: ['users:read'] },
          }),
          403,
          'mfa_enrollment_required',
        )
        const shown = await strict.request('GET', '/auth/me', { auth: held.access_token })
        assert.equal(shown.status, 200, shown.text)
        assert.deepEqual(shown.body.credential.amr, ['pwd'])
      }
      // A plain user is not covered.
      const user = await passwordAccount(strict)
      const plain = await passwordLogin(strict, user)
      assert.equal((await strict.request('GET', `/users/${user.id}`, { auth: plain.access_token })).status, 200)

      const held = await passwordLogin(strict, admin)
      const started = await strict.request('POST', '/auth/mfa/totp', { auth: held.access_token })
      assert.equal(started.status, 201, started.text)
      const confirmed = await strict.request('POST', '/auth/mfa/totp/confirm', {
        auth: held.access_token,
        body: { code: rfcTotp(started.body.secret, strict.clock.now()) },
      })
      assert.equal(confirmed.status, 200, confirmed.text)
      // The confirming session's refreshed tokens carry otp: the policy is met.
      const refreshed = await strict.request('POST', '/auth/refresh', {
        auth: null,
        body: { refresh_token: held.refresh_token },
      })
      assert.equal((await strict.request('GET', '/users', { auth: refreshed.body.access_token })).status, 200)
      strict.clock.advance(30_000)
      const full = await login(strict, {
        email: admin.email,
        password: admin.password,
        code: rfcTotp(started.body.secret, strict.clock.now()),
      })
      assert.equal(full.status, 200, full.text)
      assert.equal((await strict.request('GET', '/users', { auth: full.body.access_token })).status, 200)
      // The same token on an instance without the policy is an ordinary one.
      assert.equal((await A.request('GET', '/users', { auth: full.body.access_token })).status, 200)
    },
  )
})

describe('rotating JWT_SECRETS keeps every factor', () => {
  test('secrets sealed under the old kid move to the new one; with the old kid dropped, codes still work', async () => {
    const user = await enrolledUser(A, [A])
    const oldKeys = A.deps.config.jwtSecrets
    const rotatedSecret = `rotated-${randomBytes(16).toString('hex')}`
    const newKey = { kid: 'rotated', secret: Buffer.from(rotatedSecret) }
    assert.equal(await resealTotpSecrets(sql, [newKey, ...oldKeys]), await countFactors())
    const [row] = await sql<[{ kid: string }]>`
      SELECT split_part(secret_sealed, '.', 2) AS kid FROM totp_factors WHERE user_id = ${user.id}`
    assert.equal(row.kid, 'rotated')
    assert.equal(await resealTotpSecrets(sql, [newKey, ...oldKeys]), 0, 'nothing left to move')
    const rotated = await startServer({ JWT_SECRETS: `rotated:${rotatedSecret}` }, {}, { databaseUrl: A.databaseUrl })
    rotated.clock.advance(A.clock.now() - rotated.clock.now() + 30_000)
    const res = await login(rotated, {
      email: user.email,
      password: user.password,
      code: rfcTotp(user.secret, rotated.clock.now()),
    })
    assert.equal(res.status, 200, res.text)
  })
})

async function countFactors(): Promise<number> {
  const [{ n }] = await sql<[{ n: number }]>`SELECT count(*)::int AS n FROM totp_factors`
  return n
}

describe("MFA_REQUIRED and the identity provider's tokens", () => {
  test(
    'a provider token satisfies it only when its amr names a second factor; its factor is the ' + "provider's",
    async () => {
      const provider = await startTestProvider()
      after(() => provider.close())
      const env = { OIDC_ISSUER: provider.issuer, OIDC_AUDIENCE: provider.audience, MFA_REQUIRED: 'all' }
      const strict = await startServer(env, {}, { databaseUrl: A.databaseUrl })
      const strictB = await startServer(env, {}, { databaseUrl: A.databaseUrl })
      const sub = `person-${randomBytes(4).toString('hex')}`
      const claims = { sub, email: `${sub}@example.com`, email_verified: true, name: 'Person' }
      const pwdOnly = await provider.clientCredentialsToken({ scope: API_SCOPES, claims: { ...claims, amr: ['pwd'] } })
      const noAmr = await provider.clientCredentialsToken({ scope: API_SCOPES, claims })
      for (const [server, token] of [
        [strict, pwdOnly],
        [strictB, noAmr],
      ] as const) {
        assertProblem(await server.request('GET', '/products', { auth: token }), 403, 'mfa_enrollment_required')
        assert.equal((await server.request('GET', '/auth/me', { auth: token })).status, 200)
      }
      for (const amr of [['pwd', 'mfa'], ['otp'], ['hwk', 'pwd'], ['swk']]) {
        const token = await provider.clientCredentialsToken({ scope: API_SCOPES, claims: { ...claims, amr } })
        const res = await strictB.request('GET', '/products', { auth: token })
        assert.equal(res.status, 200, `${amr}: ${res.text}`)
        assert.deepEqual((await strict.request('GET', '/auth/me', { auth: token })).body.credential.amr, amr)
      }
      // Its factor is the provider's: /auth/mfa is not for its tokens.
      assertProblem(await strict.request('POST', '/auth/mfa/totp', { auth: pwdOnly }), 403, 'forbidden')
    },
  )
})
