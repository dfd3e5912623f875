import assert from 'node:assert/strict'
import { generateKeyPairSync, randomBytes, sign as signData } from 'node:crypto'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { createServer as createHttpsServer } from 'node:https'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import { loadConfig } from '../src/config.js'
import { ConfigError } from '../src/core/config-error.js'
import { certificateFromAuthority } from './helpers/certificates.js'
import { API_SCOPES, SIGNING_ALGS, startTestProvider, type SignOptions } from './helpers/oidc-provider.js'
import { assertInvalidToken, refusedEverywhere } from './helpers/refused.js'
import { startServer, type TestServer } from './helpers/server.js'
import { waitUntil } from './helpers/wait.js'
import type { ProviderTuning } from '../src/auth/oidc/provider-principals.js'
import { SseClient } from './helpers/sse.js'
import { boundFrom, propagationBound, timed } from './helpers/time-bounds.js'

// Access tokens of the team's identity provider (OIDC_ISSUER), against a real
// OpenID provider (panva's oidc-provider, test/helpers/oidc-provider.ts) over
// HTTPS that the service trusts through NODE_EXTRA_CA_CERTS, as an operator's
// would be. Tokens come from its real flows (client credentials, and
// authorization code with PKCE), or are signed with the very keys it
// publishes, for the rules a real provider would never break. Two instances
// of the real server on one database, as behind a load balancer; the other
// instances a test starts use that database too (a fresh one costs a copy
// of the template), unless the test needs one of its own. Bounds on time
// are the contract's (a second), or five times a baseline the test measures
// first when that is more (test/helpers/time-bounds.ts).

const provider = await startTestProvider()
after(() => provider.close())

const oidcEnv = (more: Record<string, string> = {}) => ({
  OIDC_ISSUER: provider.issuer,
  OIDC_AUDIENCE: provider.audience,
  OIDC_ADMIN_CLAIM: 'realm_access.roles',
  OIDC_ADMIN_VALUE: 'admin',
  ...more,
})
const A = await startServer(oidcEnv())
const B = await startServer(oidcEnv(), {}, { databaseUrl: A.databaseUrl })
const { sql } = A
const both = [A, B]

const unique = () => randomBytes(5).toString('hex')
const now = () => Math.floor(Date.now() / 1000)

const me = (server: TestServer, token: string) => server.request('GET', '/auth/me', { auth: token })

/** A person at the provider: an account whose tokens carry a verified address. */
function person(claims: Record<string, unknown> = {}) {
  const sub = `person-${unique()}`
  const email = `${sub}@example.com`
  return { sub, email, claims: { sub, email, email_verified: true, name: `Person ${sub}`, ...claims } }
}

/** The claims a provider's access token has, for `sign`: ours for this test's provider, valid now. */
function tokenClaims(claims: Record<string, unknown>, at = now()): Record<string, unknown> {
  return { iss: provider.issuer, aud: provider.audience, iat: at, exp: at + 300, scope: API_SCOPES, ...claims }
}
const signed = (claims: Record<string, unknown>, options?: SignOptions) => provider.sign(tokenClaims(claims), options)

/**
 * A token signed RS256 with a key the attacker made, carrying in
 * its header what `header` gives for that key's public JWK.
 */
function attackerSigned(
  payload: Record<string, unknown>,
  header: (jwk: Record<string, unknown>) => Record<string, unknown>,
): string {
  const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048 })
  const encode = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url')
  const jwk = publicKey.export({ format: 'jwk' }) as Record<string, unknown>
  const input = `${encode({ alg: 'RS256', typ: 'at+jwt', ...header(jwk) })}.${encode(payload)}`
  return `${input}.${signData('sha256', Buffer.from(input), privateKey).toString('base64url')}`
}

// Live users: a deleted one waits in the trash with its address (test/trash-users.test.ts).
const usersWithEmail = async (email: string) =>
  (await sql<Array<{ id: number }>>`SELECT id FROM users WHERE lower(email) = lower(${email}) AND deleted_at IS NULL`)
    .length
const identityOf = async (sub: string) =>
  (
    await sql<Array<{ user_id: number | null; user_deleted_at: Date | null }>>`
  SELECT user_id, user_deleted_at FROM identities WHERE issuer = ${provider.issuer} AND subject = ${sub}`
  )[0]

/** Every instance refuses `token` within `withinMs` (a propagationBound measured before the change). */
const refusedOnBoth = (token: string, withinMs: number) =>
  refusedEverywhere(both, (server) => me(server, token), withinMs)

/** Another instance trusting the provider, on A's database. */
const another = (env: Record<string, string> = {}, tuning: ProviderTuning = {}) =>
  startServer(oidcEnv(env), {}, { databaseUrl: A.databaseUrl, tuning: { identityProvider: tuning } })

describe('real flows of the provider', () => {
  test(
    "authorization code with PKCE: the token's user is made from its verified address on first sight, /auth/me " +
      'says oidc and the issuer, and the event names the credential',
    async () => {
      const who = person()
      provider.setAccount(who.sub, who.claims)
      const token = await provider.authorizationCodeToken(who.sub, { scope: 'users:read products:read' })
      const res = await me(A, token)
      assert.equal(res.status, 200, res.text)
      assert.equal(res.body.user.email, who.email)
      assert.equal(res.body.user.name, who.claims.name)
      assert.equal(res.body.user.role, 'user')
      assert.ok(res.body.user.email_verified_at, 'the provider verified the address')
      assert.deepEqual(res.body.credential, {
        type: 'oidc',
        issuer: provider.issuer,
        scopes: ['products:read', 'users:read'],
        expires_at: res.body.credential.expires_at,
        // The provider's token says nothing of how or when the person signed in there.
        amr: [],
        auth_time: null,
      })
      const link = await identityOf(who.sub)
      assert.equal(link?.user_id, Number(res.body.user.id))
      // The other instance finds the link, and makes no second user.
      assert.equal((await me(B, token)).body.user.id, res.body.user.id)
      assert.equal(await usersWithEmail(who.email), 1)
      await A.published()
      const [event] = await sql<
        Array<{ actor_credential: string }>
      >`SELECT actor_credential FROM events WHERE type = 'user.created' AND subject_id = ${res.body.user.id}`
      assert.equal(event?.actor_credential, 'oidc')
    },
  )

  test(
    'client credentials: a token without a verified address makes no user (401); with one, its scope narrows what ' +
      'the role allows',
    async () => {
      const before = (await sql<[{ n: number }]>`SELECT count(*)::int AS n FROM users`)[0].n
      assertInvalidToken(
        await me(A, await provider.clientCredentialsToken({ scope: 'products:read' })),
        'no e-mail at all',
      )
      const who = person()
      assertInvalidToken(
        await me(A, await provider.clientCredentialsToken({ claims: { ...who.claims, email_verified: false } })),
        'email_verified false',
      )
      assert.equal((await sql<[{ n: number }]>`SELECT count(*)::int AS n FROM users`)[0].n, before, 'no user was made')
      assert.equal(await identityOf(who.sub), undefined)

      const token = await provider.clientCredentialsToken({ claims: who.claims, scope: 'products:read' })
      assert.equal((await A.request('GET', '/products?limit=1', { auth: token })).status, 200)
      const write = await A.request('POST', '/products', {
        auth: token,
        body: { sku: `OIDC-${unique()}`, name: 'x', price: 1, currency: 'EUR' },
      })
      assert.equal(write.status, 403, write.text)
      assert.equal(write.body.code, 'insufficient_scope')
      const listUsers = await A.request('GET', '/users', { auth: token })
      assert.equal(listUsers.status, 403, 'a user, not an admin')
    },
  )

  test("our own tokens keep working beside the provider's", async () => {
    const res = await A.request('GET', '/auth/me')
    assert.equal(res.status, 200)
    assert.equal(res.body.credential.type, 'jwt')
  })
})

describe('what is checked', () => {
  test("each of RS256, PS256, ES256 and EdDSA is accepted with the provider's key of that algorithm", async () => {
    const who = person()
    for (const alg of SIGNING_ALGS) {
      const res = await me(A, signed(who.claims, { alg }))
      assert.equal(res.status, 200, `${alg}: ${res.text}`)
    }
  })

  const attacks: Array<[string, () => string]> = [
    ["alg confusion: HS256 keyed with the provider's public RSA key", () => signed(person().claims, { alg: 'HS256' })],
    ['alg none', () => signed(person().claims, { alg: 'none' })],
    ['alg none, spelt otherwise', () => signed(person().claims, { alg: 'none', header: { alg: 'None' } })],
    [
      "ES256 named with the RSA key's kid",
      () =>
        signed(person().claims, {
          alg: 'ES256',
          kid: provider.publicJwks().keys.find((k) => k.alg === 'RS256')!.kid as string,
        }),
    ],
    ['no kid while the set holds several keys', () => signed(person().claims, { kid: null })],
    [
      "a key of the attacker's, embedded in the header (jwk)",
      () => attackerSigned(tokenClaims(person().claims), (jwk) => ({ jwk })),
    ],
    [
      "a key of the attacker's, named by URL (jku) with a kid of the provider's",
      () =>
        attackerSigned(tokenClaims(person().claims), () => ({
          jku: 'https://127.0.0.1:1/jwks',
          kid: provider.publicJwks().keys[0]!.kid,
        })),
    ],
    ['a crit header', () => signed(person().claims, { header: { crit: ['exp'] } })],
    ["typ of an ID token's kind", () => signed(person().claims, { header: { typ: 'id_token+jwt' } })],
    ['another audience', () => signed({ ...person().claims, aud: 'https://another-api.example.test' })],
    [
      'another audience among several',
      () => signed({ ...person().claims, aud: ['https://another-api.example.test', 'x'] }),
    ],
    ['expired', () => signed({ ...person().claims, iat: now() - 400, exp: now() - 60 })],
    ['not yet valid (nbf)', () => signed({ ...person().claims, nbf: now() + 120 })],
    ['issued in the future', () => signed({ ...person().claims, iat: now() + 120, exp: now() + 400 })],
    ['no iat', () => signed({ ...person().claims, iat: undefined })],
    [
      'issued more than a day ago, however long its exp',
      () => signed({ ...person().claims, iat: now() - 86_400 - 120, exp: now() + 3600 }),
    ],
    ['no exp', () => signed({ ...person().claims, exp: undefined })],
    ['a NUL in sub', () => signed({ ...person().claims, sub: 'a\u0000b' })],
    ['a sub of 256 characters', () => signed({ ...person().claims, sub: 'x'.repeat(256) })],
    ['a sub that is a number', () => signed({ ...person().claims, sub: 12345 })],
    [
      'a signature of another token',
      () => {
        const [header, payload] = signed(person().claims).split('.')
        return `${header}.${payload}.${signed(person().claims).split('.')[2]}`
      },
    ],
    ['a token over 8 KiB', () => signed({ ...person().claims, padding: 'x'.repeat(8 * 1024) })],
  ]
  for (const [name, token] of attacks) {
    test(`refused with 401 invalid_token, and no user made: ${name}`, async () => {
      const t = token()
      const payload = JSON.parse(Buffer.from(t.split('.')[1]!, 'base64url').toString()) as {
        email?: string
        sub?: string
      }
      assertInvalidToken(await me(A, t), name)
      if (payload.email) assert.equal(await usersWithEmail(payload.email), 0, 'no user was made')
    })
  }

  test(
    'another issuer: a token naming an issuer that is not OIDC_ISSUER is ours to check (HS256 only), and ' + 'refused',
    async () => {
      const res = await me(A, provider.sign({ ...tokenClaims(person().claims), iss: 'https://evil.example.test' }))
      assertInvalidToken(res)
      // Our own issuer with the provider's key: our verification takes HS256 only.
      assertInvalidToken(
        await me(
          A,
          provider.sign({ ...tokenClaims(person().claims), iss: 'users-products-api', aud: 'users-products-api' }),
        ),
      )
    },
  )

  test(
    'an e-mail address the users resource does not accept makes no user; a name it does not accept falls back to ' +
      'the address',
    async () => {
      const bad = person({ email: 'not an address' })
      assertInvalidToken(await me(A, signed(bad.claims)))
      assert.equal(await identityOf(bad.sub), undefined)
      const who = person({ name: `bad\u0000name ${'x'.repeat(300)}` })
      const res = await me(A, signed(who.claims))
      assert.equal(res.status, 200, res.text)
      assert.equal(res.body.user.name, who.sub)
    },
  )
})

describe('which local user', () => {
  test('a local user with the same verified address is linked, not duplicated', async () => {
    const local = await A.createUser({ email: `linked-${unique()}@example.com` })
    await sql`UPDATE users SET email_verified_at = now() WHERE id = ${local.id}`
    const who = person({ email: local.email.toUpperCase() })
    const res = await me(A, signed(who.claims))
    assert.equal(res.status, 200, res.text)
    assert.equal(res.body.user.id, local.id)
    assert.equal(await usersWithEmail(local.email), 1)
    assert.equal((await identityOf(who.sub))?.user_id, local.id)
  })

  test(
    'a local user holding the address unverified is not linked (whoever signed up with it may not own it): 401, ' +
      'nothing changed',
    async () => {
      const local = await A.createUser({ email: `unverified-${unique()}@example.com` })
      const who = person({ email: local.email })
      const res = await me(A, signed(who.claims))
      assertInvalidToken(res)
      assert.match(res.body.detail, /invalid|expired|revoked/)
      assert.equal(await identityOf(who.sub), undefined)
      assert.equal(await usersWithEmail(local.email), 1)
    },
  )

  test(
    "a second account of the provider with the same verified address does not take over the first one's " + 'user',
    async () => {
      const first = person()
      assert.equal((await me(A, signed(first.claims))).status, 200)
      const second = person({ email: first.email })
      assertInvalidToken(await me(A, signed(second.claims)))
      assert.equal(await identityOf(second.sub), undefined)
    },
  )

  test('the same subject on first sight at two instances at once makes one user', async () => {
    const who = person()
    const answers = await Promise.all([A, B, A, B].map((server) => me(server, signed(who.claims))))
    assert.deepEqual(
      answers.map((a) => a.status),
      [200, 200, 200, 200],
      answers.map((a) => a.text).join('\n'),
    )
    assert.equal(new Set(answers.map((a) => a.body.user.id)).size, 1)
    assert.equal(await usersWithEmail(who.email), 1)
  })
})

describe('role from OIDC_ADMIN_CLAIM, on every token', () => {
  test(
    'realm_access.roles holding admin makes an admin; a newer token without it demotes the user in the database, ' +
      'and the older admin token is refused from then on',
    async () => {
      const who = person()
      const admin = signed({ ...who.claims, realm_access: { roles: ['offline_access', 'admin'] }, iat: now() - 10 })
      const res = await A.request('GET', '/users?limit=1', { auth: admin })
      assert.equal(res.status, 200, res.text)
      const [user] = await sql<
        Array<{ id: number; role: string }>
      >`SELECT id, role FROM users WHERE email = ${who.email}`
      assert.equal(user?.role, 'admin')
      const plain = signed({ ...who.claims, realm_access: { roles: ['offline_access'] }, iat: now() - 5 })
      const within = await propagationBound(both)
      const demoted = await A.request('GET', '/users?limit=1', { auth: plain })
      assert.equal(demoted.status, 403, demoted.text)
      assert.equal((await sql<Array<{ role: string }>>`SELECT role FROM users WHERE id = ${user!.id}`)[0]?.role, 'user')
      // The admin token carries the old role: it cannot promote the user back.
      await refusedOnBoth(admin, within)
      assert.equal((await me(B, plain)).body.user.role, 'user')
      await A.published()
      const [event] = await sql<
        Array<{ actor_credential: string }>
      >`SELECT actor_credential FROM events WHERE type = 'user.updated' AND subject_id = ${user!.id}`
      assert.equal(event?.actor_credential, 'oidc')
    },
  )

  test(
    'the last admin: a token whose claim says user leaves the account admin in the database, and acts as a ' + 'user',
    async () => {
      const L = await startServer(oidcEnv())
      const who = person({ realm_access: { roles: ['admin'] } })
      const made = await me(L, provider.sign(tokenClaims(who.claims, now() - 5)))
      assert.equal(made.body.user.role, 'admin')
      // The file's own admin steps down: the provider's user is the last admin.
      await L.sql`UPDATE users SET role = 'user' WHERE id = ${L.admin.id}`
      const plain = provider.sign(tokenClaims({ ...who.claims, realm_access: { roles: [] } }, now()))
      assert.equal((await L.request('GET', '/users?limit=1', { auth: plain })).status, 403, 'the token acts as a user')
      assert.equal(
        (await L.sql<Array<{ role: string }>>`SELECT role FROM users WHERE id = ${made.body.user.id}`)[0]?.role,
        'admin',
      )
      assert.equal((await me(L, plain)).status, 200)
    },
  )

  test("a claim named by a URL, dots and all (Auth0's namespaced claims), is a claim of its own", async () => {
    const H = await another({ OIDC_ADMIN_CLAIM: 'https://example.com/roles' })
    const who = person({ 'https://example.com/roles': ['admin'] })
    assert.equal((await H.request('GET', '/users?limit=1', { auth: signed(who.claims) })).status, 200)
    const other = person({ 'https://example.com/roles': 'user' })
    assert.equal((await H.request('GET', '/users?limit=1', { auth: signed(other.claims) })).status, 403)
  })
})

describe('withdrawn access', () => {
  test(
    'deleting the user stops its provider tokens at once on every instance; a later token does not make it again ' +
      'without OIDC_REPROVISION',
    async () => {
      const who = person()
      const token = signed(who.claims)
      const res = await me(B, token)
      assert.equal(res.status, 200)
      const within = await propagationBound(both)
      assert.equal((await A.request('DELETE', `/users/${res.body.user.id}`)).status, 204)
      await refusedOnBoth(token, within)
      const link = await identityOf(who.sub)
      assert.equal(link?.user_id, null)
      assert.ok(link?.user_deleted_at, 'the link remembers the deletion')
      // Issued after the deletion: iat is in seconds, so a second on (within the clock leeway).
      const later = provider.sign(tokenClaims(who.claims, now() + 2))
      assertInvalidToken(await me(A, later))
      assertInvalidToken(await me(B, later))
      assert.equal(await usersWithEmail(who.email), 0)
    },
  )

  test(
    'with OIDC_REPROVISION=true a token issued after the deletion makes the user again; one issued before stays ' +
      'refused',
    async () => {
      const R = await another({ OIDC_REPROVISION: 'true' })
      const who = person()
      const before = provider.sign(tokenClaims(who.claims, now() - 5))
      const first = await me(R, before)
      assert.equal(first.status, 200)
      assert.equal((await R.request('DELETE', `/users/${first.body.user.id}`)).status, 204)
      assertInvalidToken(await me(R, before))
      const again = await me(R, provider.sign(tokenClaims(who.claims, now() + 2)))
      assert.equal(again.status, 200, again.text)
      assert.notEqual(again.body.user.id, first.body.user.id)
      assertInvalidToken(await me(R, before))
    },
  )

  test(
    'with OIDC_REPROVISION=true, deleted twice: an instance that remembers only the first deletion does not let a ' +
      'token issued between the two make the user again',
    async () => {
      const R = await another({ OIDC_REPROVISION: 'true' })
      const R2 = await another({ OIDC_REPROVISION: 'true' })
      const who = person()
      const first = provider.sign(tokenClaims(who.claims, now() - 5))
      const made = await me(R, first)
      assert.equal((await R.request('DELETE', `/users/${made.body.user.id}`)).status, 204)
      // iat is in whole seconds: the first deletion is moved two seconds back, so that a token of the second before
      // now is issued after it, and the second deletion, now, after that token, without waiting for the clock to turn.
      await sql`UPDATE identities SET user_deleted_at = user_deleted_at - interval '2 seconds'
      WHERE issuer = ${provider.issuer} AND subject = ${who.sub}`
      assertInvalidToken(await me(R2, first), 'R2 now remembers the first deletion')
      const between = provider.sign(tokenClaims(who.claims, now() - 1))
      const again = await me(R, between)
      assert.equal(again.status, 200, again.text)
      assert.equal((await R.request('DELETE', `/users/${again.body.user.id}`)).status, 204)
      assertInvalidToken(await me(R2, between))
      assert.equal(
        (
          await R.sql<
            [{ n: number }]
          >`SELECT count(*)::int AS n FROM users WHERE email = ${who.email} AND deleted_at IS NULL`
        )[0].n,
        0,
      )
    },
  )

  test(
    'two accounts of the provider with one new address, at once on two instances: one user, the other token 401, ' +
      'never a 500',
    async () => {
      for (let round = 0; round < 3; round++) {
        const one = person()
        const other = person({ email: one.email })
        const answers = await Promise.all([me(A, signed(one.claims)), me(B, signed(other.claims))])
        assert.deepEqual(answers.map((a) => a.status).sort(), [200, 401], answers.map((a) => a.text).join('\n'))
        assert.equal(await usersWithEmail(one.email), 1)
      }
    },
  )

  test(
    'POST /auth/logout-all with a provider token refuses every provider token of the user issued until then, on ' +
      'every instance; later ones work',
    async () => {
      const who = person()
      const earlier = provider.sign(tokenClaims(who.claims, now() - 5))
      const current = provider.sign(tokenClaims(who.claims, now() - 1))
      assert.equal((await me(A, earlier)).status, 200)
      assert.equal((await me(B, earlier)).status, 200)
      const within = await propagationBound(both)
      assert.equal((await A.request('POST', '/auth/logout-all', { auth: current, body: {} })).status, 204)
      await refusedOnBoth(earlier, within)
      await refusedOnBoth(current, within)
      // Issued after the deletion: iat is in seconds, so a second on (within the clock leeway).
      const later = provider.sign(tokenClaims(who.claims, now() + 2))
      for (const server of both) assert.equal((await me(server, later)).status, 200)
    },
  )

  test("an event stream opened with a provider token ends with its user's deletion on another instance", async () => {
    const who = person({ realm_access: { roles: ['admin'] } })
    const token = signed(who.claims)
    const stream = await SseClient.open(B.url, '/events/stream', { headers: { authorization: `Bearer ${token}` } })
    assert.equal(stream.res.statusCode, 200)
    await stream.waitFor(() => stream.retry !== undefined, 5000, 'retry:')
    const { body } = await me(A, token)
    // The baseline: how long a change made through A (the user renamed) takes to reach the stream on B.
    const renamed = (e: { event?: string; data: string }) =>
      e.event === 'user.updated' && JSON.parse(e.data).subject.id === body.user.id
    const eventMs = await timed(async () => {
      const res = await A.request('PATCH', `/users/${body.user.id}`, { body: { name: 'Renamed Person' } })
      assert.equal(res.status, 200, res.text)
      await stream.waitFor(() => stream.events.some(renamed), 5000, 'user.updated')
    })
    const started = performance.now()
    assert.equal((await A.request('DELETE', `/users/${body.user.id}`)).status, 204)
    const ended = await stream.endedWithin(boundFrom(eventMs))
    const took = Math.round(performance.now() - started)
    assert.ok(ended, `the stream outlived its user by ${took} ms (an event took ${Math.round(eventMs)} ms)`)
  })

  test(
    'a remembered link is read again after its time even if no revocation names it (the list forgets after a ' +
      'day): a role changed unannounced holds',
    async () => {
      // A database of its own: the test turns a trigger of the users table off for a moment.
      const env = { OIDC_ISSUER: provider.issuer, OIDC_AUDIENCE: provider.audience }
      const S = await startServer(env, {}, { tuning: { identityProvider: { linkMaxAgeMs: 100 } } })
      const who = person()
      const made = await me(S, signed(who.claims))
      const listUsers = async (auth: string) => (await S.request('GET', '/users?limit=1', { auth })).status
      await S.sql`UPDATE users SET role = 'admin' WHERE id = ${made.body.user.id}`
      // Issued after the change (a role change refuses the provider's tokens issued before it).
      const promoted = provider.sign(tokenClaims(who.claims, now() + 1))
      await waitUntil('promoted: the link was read again', async () => (await listUsers(promoted)) === 200)
      // What the revocation list would have said, had it not forgotten: the role changes without an announcement.
      await S.sql`ALTER TABLE users DISABLE TRIGGER users_epoch_raised`
      try {
        await S.sql`UPDATE users SET role = 'user' WHERE id = ${made.body.user.id}`
      } finally {
        await S.sql`ALTER TABLE users ENABLE TRIGGER users_epoch_raised`
      }
      const after = provider.sign(tokenClaims(who.claims, now() + 2))
      await waitUntil('demoted: the link was read again', async () => (await listUsers(after)) === 403)
    },
  )

  test('POST /auth/logout with a provider token is a 400: it has no session here', async () => {
    const res = await A.request('POST', '/auth/logout', { auth: signed(person().claims) })
    assert.equal(res.status, 400, res.text)
    assert.equal(res.body.code, 'invalid_request')
    assert.match(res.body.detail, /logout-all/)
  })

  test(
    "an API key: within REAUTH_WINDOW of the provider's auth_time no password is asked; without auth_time it is " +
      '(403)',
    async () => {
      const fresh = signed({ ...person().claims, auth_time: now() - 10 })
      const created = await A.request('POST', '/api-keys', {
        auth: fresh,
        body: { name: 'from a provider token', scopes: ['products:read'] },
      })
      assert.equal(created.status, 201, created.text)
      const stale = signed(person().claims)
      const refused = await A.request('POST', '/api-keys', {
        auth: stale,
        body: { name: 'x', scopes: ['products:read'] },
      })
      assert.equal(refused.status, 403, refused.text)
      assert.equal(refused.body.code, 'current_password_required')
    },
  )
})

/** db_queries_total of an instance, scraped with its admin's JWT (checked in memory). */
async function statements(server: TestServer): Promise<number> {
  const res = await server.request('GET', '/metrics')
  assert.equal(res.status, 200, res.text)
  return Number(/^db_queries_total ([0-9]+)$/m.exec(res.text)![1])
}

describe("the provider's keys", () => {
  test(
    'a token in use costs no fetch and no statement of its own: 10 requests send the statements of 10 with our ' +
      'JWT',
    async () => {
      const token = signed(person().claims)
      assert.equal((await B.request('GET', '/products?limit=1', { auth: token })).status, 200)
      const fetches = provider.jwksFetches
      const count = async (auth: string) => {
        for (let attempt = 0; ; attempt++) {
          const before = await statements(B)
          for (let i = 0; i < 10; i++) assert.equal((await B.request('GET', '/products?limit=1', { auth })).status, 200)
          const sent = (await statements(B)) - before
          // Background work of the instance may land in the window; what a token costs shows in every attempt.
          if (sent === 10 || attempt === 4) return sent
        }
      }
      assert.equal(await count(token), 10)
      assert.equal(await count(B.admin.token), 10)
      assert.equal(provider.jwksFetches, fetches)
    },
  )

  test('a key rotated in at the provider works at once on every instance', async () => {
    // The baseline: a token of a key both instances hold, on each.
    const known = signed(person().claims)
    const baseline = await timed(async () => {
      for (const server of both) assert.equal((await me(server, known)).status, 200)
    })
    await provider.rotateKeys()
    const token = signed(person().claims)
    const took = await timed(async () => {
      for (const server of both) assert.equal((await me(server, token)).status, 200)
    })
    assert.ok(took < boundFrom(baseline), `${Math.round(took)} ms, where a known key took ${Math.round(baseline)} ms`)
  })

  test('a thousand made-up kids cost one fetch', async () => {
    const C = await another()
    await waitUntil("C holds the provider's keys", () => C.deps.identityProvider!.keys.loaded)
    const fetches = provider.jwksFetches
    const claims = person().claims
    for (let batch = 0; batch < 20; batch++) {
      const answers = await Promise.all(
        Array.from({ length: 50 }, (_, i) => me(C, signed(claims, { alg: 'EdDSA', kid: `made-up-${batch}-${i}` }))),
      )
      for (const res of answers) assertInvalidToken(res)
    }
    assert.equal(provider.jwksFetches - fetches, 1)
  })

  test('a key removed at the provider stops the tokens it signed, even those verified before', async () => {
    const E = await another({}, { unknownKidRefetchMs: 0 })
    const old = signed(person().claims)
    assert.equal((await me(E, old)).status, 200)
    await provider.rotateKeys({ algs: ['RS256'], dropOld: true })
    // A token of the new key makes E fetch the set, which no longer holds the old key.
    assert.equal((await me(E, signed(person().claims))).status, 200)
    assertInvalidToken(await me(E, old))
  })

  test(
    'the provider down: cached keys go on working; an instance that never had them answers 503 ' +
      'identity_provider_unavailable with Retry-After, at once, and serves our own tokens; it recovers when the ' +
      'provider is back',
    async () => {
      // EdDSA: A holds the provider's current key of it (the test above replaced the RS256 key).
      const token = signed(person().claims, { alg: 'EdDSA' })
      assert.equal((await me(A, token)).status, 200)
      await provider.stop()
      try {
        assert.equal(
          (await me(A, signed(person().claims, { alg: 'EdDSA' }))).status,
          200,
          'keys cached before the outage',
        )
        const F = await another({}, { retryAfterMs: 300 })
        // The baseline: what F takes to answer a token of its own, which needs no provider.
        const baseline = await timed(async () => {
          assert.equal((await F.request('GET', '/auth/me')).status, 200, 'our own JWTs do not need the provider')
        })
        const started = performance.now()
        const res = await me(F, token)
        assert.equal(res.status, 503, res.text)
        assert.equal(res.body.code, 'identity_provider_unavailable')
        assert.ok(Number(res.headers.get('retry-after')) >= 1)
        assert.ok(performance.now() - started < boundFrom(baseline), `${Math.round(performance.now() - started)} ms`)
        await provider.start()
        // Asked again within retryAfterMs it answers 503 at once; then it fetches the keys.
        await waitUntil('F recovers', async () => (await me(F, token)).status === 200)
      } finally {
        await provider.start().catch(() => {})
      }
    },
  )

  test('/metrics counts the fetches of the keys that worked and that failed', async () => {
    const hostile = await hostileProvider()
    const S = await hostile.service()
    assert.equal((await me(S, hostile.token())).status, 200)
    hostile.answerJwks(() => ({ status: 500, body: '{}' }))
    // A token of a kid the set lacks makes the instance fetch again, which fails.
    assertInvalidToken(
      await me(
        S,
        hostile
          .token({ ...person().claims })
          .replace(/^[^.]+/, Buffer.from(JSON.stringify({ alg: 'EdDSA', kid: 'rotated-in' })).toString('base64url')),
      ),
    )
    const text = (await S.request('GET', '/metrics')).text
    assert.match(text, /^identity_provider_key_fetches_total 1$/m)
    assert.match(text, /^identity_provider_key_fetch_failures_total 1$/m)
  })

  test('a provider that never answers holds no request longer than one bounded fetch', async () => {
    let asked = 0
    const silent = createHttpsServer(localCertificate(), () => void asked++)
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve))
    const issuer = `https://127.0.0.1:${(silent.address() as AddressInfo).port}`
    try {
      const fetchTimeoutMs = 500
      const env = { OIDC_ISSUER: issuer, OIDC_AUDIENCE: provider.audience }
      const identityProvider = { fetchTimeoutMs, retryAfterMs: 60_000 }
      const G = await startServer(env, {}, { databaseUrl: A.databaseUrl, tuning: { identityProvider } })
      // The baseline: what G takes to answer a token of its own, which needs no provider.
      const baseline = await timed(async () => assert.equal((await G.request('GET', '/auth/me')).status, 200))
      const token = provider.sign({ ...tokenClaims(person().claims), iss: issuer })
      const started = performance.now()
      const res = await me(G, token)
      assert.equal(res.status, 503, res.text)
      const took = performance.now() - started
      assert.ok(took < fetchTimeoutMs + boundFrom(baseline), `${Math.round(took)} ms`)
      const before = asked
      assert.equal((await me(G, token)).status, 503)
      assert.equal(asked, before, 'no second fetch within retryAfterMs')
    } finally {
      silent.closeAllConnections()
      silent.close()
    }
  })
})

let certificate: { cert: Buffer; key: Buffer } | undefined

/** A certificate of the run's authority for 127.0.0.1, for the providers of this file's own making; made once. */
function localCertificate(): { cert: Buffer; key: Buffer } {
  if (!certificate) {
    const dir = mkdtempSync(join(tmpdir(), 'oidc-local-'))
    try {
      const made = certificateFromAuthority(dir, 'local')
      certificate = { cert: readFileSync(made.cert), key: readFileSync(made.key) }
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }
  return certificate
}

/**
 * A provider that answers as an attacker or a broken deployment would: an
 * HTTPS server (the run's CA) whose discovery document and JWKS the test
 * writes, signing with a key of its own. Not a stand-in for the real
 * provider above: the hostile input the service must survive.
 */
async function hostileProvider() {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519')
  const jwk = {
    ...(publicKey.export({ format: 'jwk' }) as Record<string, unknown>),
    kid: 'hostile-1',
    alg: 'EdDSA',
    use: 'sig',
  }
  let discovery: (issuer: string) => { status?: number; headers?: Record<string, string>; body: string | Buffer } = (
    issuer,
  ) => ({ body: JSON.stringify({ issuer, jwks_uri: `${issuer}/jwks` }) })
  let jwks: () => { status?: number; headers?: Record<string, string>; body: string | Buffer } = () => ({
    body: JSON.stringify({ keys: [jwk] }),
  })
  let fetches = 0
  const server = createHttpsServer(localCertificate(), (req, res) => {
    const answer =
      req.url === '/.well-known/openid-configuration'
        ? discovery(issuer)
        : req.url === '/jwks'
          ? (fetches++, jwks())
          : // Where a redirect points: a good document, so that following it would work.
            req.url === '/moved'
            ? { body: JSON.stringify({ issuer, jwks_uri: `${issuer}/jwks` }) }
            : { status: 404, body: '' }
    res.writeHead(answer.status ?? 200, { 'content-type': 'application/json', ...answer.headers })
    res.end(answer.body)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const issuer = `https://127.0.0.1:${(server.address() as AddressInfo).port}`
  after(() => {
    server.closeAllConnections()
    server.close()
  })
  const encode = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url')
  return {
    issuer,
    jwk,
    get fetches() {
      return fetches
    },
    answerDiscovery(answer: typeof discovery) {
      discovery = answer
    },
    answerJwks(answer: typeof jwks) {
      jwks = answer
    },
    /** A token of its own key, for the audience of this file's provider. */
    token(claims: Record<string, unknown> = person().claims): string {
      const header = encode({ alg: 'EdDSA', typ: 'at+jwt', kid: jwk.kid })
      const input = `${header}.${encode({ ...tokenClaims(claims), iss: issuer })}`
      return `${input}.${signData(null, Buffer.from(input), privateKey).toString('base64url')}`
    },
    /** An instance of the service, on A's database, that trusts it. */
    service(tuning: ProviderTuning = {}) {
      const env = { OIDC_ISSUER: issuer, OIDC_AUDIENCE: provider.audience }
      const identityProvider = { retryAfterMs: 100, ...tuning }
      return startServer(env, {}, { databaseUrl: A.databaseUrl, tuning: { identityProvider } })
    },
  }
}

describe('a provider that answers badly', () => {
  const unusable: Array<[string, (h: Awaited<ReturnType<typeof hostileProvider>>) => void]> = [
    [
      'a discovery document naming another issuer',
      (h) =>
        h.answerDiscovery(() => ({
          body: JSON.stringify({ issuer: 'https://evil.example.test', jwks_uri: `${h.issuer}/jwks` }),
        })),
    ],
    [
      'a jwks_uri over plain http',
      (h) => h.answerDiscovery((issuer) => ({ body: JSON.stringify({ issuer, jwks_uri: 'http://127.0.0.1:1/jwks' }) })),
    ],
    [
      'a redirect (to a good document), which is not followed',
      (h) => h.answerDiscovery((issuer) => ({ status: 302, headers: { location: `${issuer}/moved` }, body: '' })),
    ],
    ['a JWKS that is not JSON', (h) => h.answerJwks(() => ({ body: '<html>gateway</html>' }))],
    [
      'a JWKS of 300 KiB',
      (h) => h.answerJwks(() => ({ body: JSON.stringify({ keys: [h.jwk], padding: 'x'.repeat(300 * 1024) }) })),
    ],
    [
      'a JWKS of private and symmetric keys only',
      (h) =>
        h.answerJwks(() => ({
          body: JSON.stringify({
            keys: [
              { ...h.jwk, d: 'AAAA' },
              { kty: 'oct', k: 'c2VjcmV0', kid: 'hostile-1', alg: 'HS256' },
            ],
          }),
        })),
    ],
    [
      'a JWKS whose keys are not an array',
      (h) => h.answerJwks(() => ({ body: JSON.stringify({ keys: { 0: h.jwk } }) })),
    ],
    ['an error answer', (h) => h.answerJwks(() => ({ status: 500, body: '{}' }))],
  ]
  for (const [name, arrange] of unusable) {
    test(`${name}: its tokens get 503 identity_provider_unavailable, never a 500, and nothing is made`, async () => {
      const hostile = await hostileProvider()
      arrange(hostile)
      const S = await hostile.service()
      const who = person()
      const res = await me(S, hostile.token(who.claims))
      assert.equal(res.status, 503, res.text)
      assert.equal(res.body.code, 'identity_provider_unavailable')
      assert.ok(!/evil|gateway|<html>/.test(res.text), "nothing of the provider's answer reaches the client")
      assert.equal((await S.sql`SELECT 1 FROM users WHERE email = ${who.email}`).length, 0)
    })
  }

  test('one unusable key beside a good one leaves the good one working', async () => {
    const hostile = await hostileProvider()
    hostile.answerJwks(() => ({
      body: JSON.stringify({
        keys: [
          { kty: 'EC', crv: 'P-384', x: 'AA', y: 'AA', kid: 'odd' },
          { ...hostile.jwk, use: 'enc', kid: 'enc' },
          hostile.jwk,
        ],
      }),
    }))
    const S = await hostile.service()
    assert.equal((await me(S, hostile.token())).status, 200)
  })

  test(
    'keys past their Cache-Control max-age are fetched again in the background, the cached ones answering ' +
      'meanwhile',
    async () => {
      const hostile = await hostileProvider()
      hostile.answerJwks(() => ({
        headers: { 'cache-control': 'public, max-age=1' },
        body: JSON.stringify({ keys: [hostile.jwk] }),
      }))
      const S = await hostile.service({ minMaxAgeMs: 200 })
      assert.equal((await me(S, hostile.token())).status, 200)
      const fetched = hostile.fetches
      // Every token answered with the cached keys meanwhile, the first past the max-age among them.
      await waitUntil('the keys fetched again', async () => {
        assert.equal((await me(S, hostile.token())).status, 200, 'answered with the cached keys')
        return hostile.fetches === fetched + 1
      })
    },
  )
})

describe('configuration', () => {
  const base = { JWT_SECRETS: `test:${'k'.repeat(43)}` }
  const cases: Array<[string, Record<string, string>, RegExp]> = [
    ['an http issuer', { OIDC_ISSUER: 'http://idp.example.com', OIDC_AUDIENCE: 'api' }, /OIDC_ISSUER/],
    ['an issuer without an audience', { OIDC_ISSUER: 'https://idp.example.com' }, /OIDC_AUDIENCE/],
    [
      'an admin claim without its value',
      { OIDC_ISSUER: 'https://idp.example.com', OIDC_AUDIENCE: 'api', OIDC_ADMIN_CLAIM: 'roles' },
      /OIDC_ADMIN_VALUE/,
    ],
    [
      "the provider's issuer equal to ours",
      { OIDC_ISSUER: 'https://idp.example.com', OIDC_AUDIENCE: 'api', JWT_ISSUER: 'https://idp.example.com' },
      /must differ from JWT_ISSUER/,
    ],
    ['OIDC_REPROVISION without a provider', { OIDC_REPROVISION: 'true' }, /needs OIDC_ISSUER/],
    [
      'OIDC_REPROVISION not a boolean',
      { OIDC_ISSUER: 'https://idp.example.com', OIDC_AUDIENCE: 'api', OIDC_REPROVISION: 'yes' },
      /OIDC_REPROVISION/,
    ],
  ]
  for (const [name, env, message] of cases) {
    test(`start-up refuses ${name}`, () => {
      assert.throws(
        () => loadConfig({ ...base, ...env }),
        (err: unknown) => err instanceof ConfigError && message.test(err.message),
      )
    })
  }
})
