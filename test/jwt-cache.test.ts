import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { JwtCache } from '../src/auth/jwt-cache.js'
import type { UserPrincipal } from '../src/auth/principal.js'
import { startServer, type TestResponse } from './helpers/server.js'

// The cache of verified JWTs (src/auth/jwt-cache.ts): a token is verified in
// full once per instance, yet a cached token still expires on time, a token
// differing from a cached one by a single character is still refused, a
// refused token is never cached, and the cache keeps to its bound. Through
// the real server, whose clock a test moves on instead of waiting for an
// expiry, plus the cache on its own for its rules.
//
// Top-level tests run one after another (node:test's default).

const api = await startServer()
const REALM = 'Bearer realm="api"'

const me = (token: string) => api.request('GET', '/auth/me', { auth: token })
const nowSeconds = () => api.clock.now() / 1000

function assertInvalidToken(res: TestResponse): void {
  assert.equal(res.status, 401, res.text)
  assert.equal(res.body.code, 'invalid_token')
  assert.equal(res.headers.get('www-authenticate'), `${REALM}, error="invalid_token"`)
}

/** `token` with the character at `at` replaced by another of the base64url alphabet. */
function oneCharacterOff(token: string, at: number): string {
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
  const i = at < 0 ? token.length + at : at
  assert.notEqual(token[i], '.', 'precondition: not a separator')
  const other = alphabet[(alphabet.indexOf(token[i]!) + 1) % alphabet.length]!
  return token.slice(0, i) + other + token.slice(i + 1)
}

describe('through the server', () => {
  test(
    'a cached token still expires on time: 200 while exp + 30 s leeway is ahead, 401 invalid_token from then ' + 'on',
    async () => {
      const user = await api.createUser()
      // exp 10 s ago: within the 30 s leeway.
      const exp = Math.floor(nowSeconds()) - 10
      const token = api.jwtFor(user.id, 'user', undefined, { iat: exp - 900, exp })
      const before = api.deps.jwtCache.size
      assert.equal((await me(token)).status, 200)
      assert.equal(api.deps.jwtCache.size, before + 1, 'the verified token is cached')
      assert.equal((await me(token)).status, 200, 'answered from the cache')

      // The service's clock at exp + 30 s, the leeway's end.
      api.clock.advance((exp + 30) * 1000 - api.clock.now())
      assertInvalidToken(await me(token))
      assertInvalidToken(await me(token))
      assert.equal(api.deps.jwtCache.size, before, 'the expired token left the cache')
    },
  )

  test(
    'a token one character off a cached one is refused (header, payload, signature, its unused trailing bits), ' +
      'and not cached',
    async () => {
      const user = await api.createUser()
      const token = api.jwtFor(user.id, 'user')
      assert.equal((await me(token)).status, 200)
      const cached = api.deps.jwtCache.size
      const [header, payload] = token.split('.') as [string, string, string]
      const positions = {
        'the header': 3,
        'the payload': header.length + 1 + Math.floor(payload.length / 2),
        'the last of the payload': header.length + payload.length,
        'the signature': header.length + payload.length + 2,
        'the last of the signature': -1,
      }
      for (const [where, at] of Object.entries(positions)) {
        const forged = oneCharacterOff(token, at)
        assert.notEqual(forged, token)
        const res = await me(forged)
        assert.equal(res.status, 401, `one character off in ${where}: ${res.text}`)
        assert.equal(res.body.code, 'invalid_token')
      }
      // Also a token with one character more or less.
      assertInvalidToken(await me(token + 'A'))
      assertInvalidToken(await me(token.slice(0, -1)))
      assert.equal(api.deps.jwtCache.size, cached, 'no refused token was cached')
      assert.equal((await me(token)).status, 200, 'the genuine token still works')
    },
  )

  test('a token with a bad signature is refused every time, never remembered', async () => {
    const token = oneCharacterOff(api.jwtFor(api.admin.id, 'admin'), -2)
    const cached = api.deps.jwtCache.size
    for (let i = 0; i < 3; i++) assertInvalidToken(await me(token))
    assert.equal(api.deps.jwtCache.size, cached)
  })

  test('the role and scopes of a cached token are those it was signed with', async () => {
    const user = await api.createUser()
    const token = api.jwtFor(user.id, 'user', ['users:read'])
    for (let i = 0; i < 2; i++) {
      const res = await me(token)
      assert.equal(res.status, 200, res.text)
      assert.deepEqual(res.body.credential.scopes, ['users:read'])
      assert.equal(res.body.credential.type, 'jwt')
    }
    const narrow = await api.request('GET', '/api-keys', { auth: token })
    assert.equal(narrow.status, 403)
    assert.equal(narrow.body.code, 'insufficient_scope')
  })

  test(
    'an instance with a cache of 4 keeps 4 tokens; a token pushed out is verified again and still ' + 'works',
    async () => {
      const small = await startServer({}, {}, { databaseUrl: api.databaseUrl, cacheSize: 4 })
      const user = await small.createUser()
      // Distinct tokens: iat differs.
      const iat = Math.floor(small.clock.now() / 1000)
      const tokens = Array.from({ length: 10 }, (_, i) => small.jwtFor(user.id, 'user', undefined, { iat: iat - i }))
      for (const token of tokens) {
        assert.equal((await small.request('GET', '/auth/me', { auth: token })).status, 200)
        assert.ok(small.deps.jwtCache.size <= 4, `size ${small.deps.jwtCache.size}`)
      }
      assert.equal(small.deps.jwtCache.size, 4)
      assert.equal(
        (await small.request('GET', '/auth/me', { auth: tokens[0]! })).status,
        200,
        'the oldest, pushed out, works again',
      )
      assert.equal(small.deps.jwtCache.size, 4)
    },
  )
})

describe('JwtCache', () => {
  const principal = (userId: string): UserPrincipal => ({
    kind: 'user',
    userId,
    role: 'user',
    scopes: new Set(),
    credential: {
      type: 'jwt',
      expiresAt: new Date(0).toISOString(),
      sessionId: 1,
      epoch: 0,
      proof: { amr: ['pwd'], authTime: 0 },
    },
  })

  test('keeps at most max entries, dropping the oldest first', () => {
    const cache = new JwtCache(3)
    for (let i = 1; i <= 5; i++) cache.set(`t${i}`, principal(String(i)), 2000)
    assert.equal(cache.size, 3)
    assert.equal(cache.get('t1', 1000), undefined)
    assert.equal(cache.get('t2', 1000), undefined)
    for (const i of [3, 4, 5]) assert.ok(cache.get(`t${i}`, 1000), `t${i} is kept`)
    // Setting a token already there does not push anything out.
    cache.set('t5', principal('5'), 2000)
    assert.equal(cache.size, 3)
    assert.ok(cache.get('t3', 1000))
  })

  const cases: Array<[string, number, boolean]> = [
    ['long before exp', 1000, true],
    ['at exp', 2000, true],
    ['29.999 s after exp', 2029.999, true],
    ['exp + 30 s (verifyJwt refuses from here)', 2030, false],
    ['an hour after exp', 5600, false],
  ]
  for (const [label, now, kept] of cases) {
    test(`a token with exp 2000 is ${kept ? 'served' : 'not served, and removed,'} ${label}`, () => {
      const cache = new JwtCache(10)
      cache.set('t', principal('1'), 2000)
      assert.equal(cache.get('t', now) !== undefined, kept)
      assert.equal(cache.size, kept ? 1 : 0)
    })
  }

  test('uses the leeway it is given', () => {
    const cache = new JwtCache(10, 0)
    cache.set('t', principal('1'), 2000)
    assert.ok(cache.get('t', 1999.999))
    assert.equal(cache.get('t', 2000), undefined)
  })

  test('refuses a bound that is not a positive integer', () => {
    for (const max of [0, -1, 1.5, Number.NaN]) assert.throws(() => new JwtCache(max), RangeError)
  })
})
