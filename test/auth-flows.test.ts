import assert from 'node:assert/strict'
import { createHash, createHmac, randomBytes } from 'node:crypto'
import { after, describe, test } from 'node:test'
import { verifyJwt } from '../src/auth/jwt.js'
import { createLogger } from '../src/core/log.js'
import { createService } from '../src/service.js'
import { holdHashSlots, workOf, type Work } from './helpers/accounts.js'
import { startServer, type TestResponse } from './helpers/server.js'
import { waitUntil } from './helpers/wait.js'

// Authentication through the real server: how credentials are sent and
// refused, login (and its throttling, also across two instances on one
// database), refresh-token rotation and reuse detection, logout, /auth/me,
// what role changes and deletion do to live credentials, a login flood, and
// that no secret ever reaches a log line or an error body.
//
// Top-level tests run one after another, so a test may rely on what it arranged.

const api = await startServer()
const { sql } = api
const { config } = api.deps
const SIGNING_KEY = config.jwtSecrets[0]!

// A second instance of the service on the same database, as a load balancer would have.
const second = await startSecondInstance()

async function startSecondInstance(): Promise<{ url: string; logs: Array<Record<string, unknown>> }> {
  const logs: Array<Record<string, unknown>> = []
  const service = createService(
    { ...config, poolMax: 4 },
    { log: createLogger('debug', (line) => void logs.push(JSON.parse(line))) },
  )
  after(() => service.close())
  return { url: `http://127.0.0.1:${(await service.listen(0, '127.0.0.1')).port}`, logs }
}

// ---------------------------------------------------------------------------
// Helpers

/** Every password, token and key this file sends or receives; none may appear in a log line or an error body. */
const secrets = new Set<string>([api.admin.token])
const errorBodies: string[] = []
const keep = (secret: string) => (secrets.add(secret), secret)
const unique = () => randomBytes(4).toString('hex')
const password = (tag = 'pw') => keep(`${tag}-${randomBytes(9).toString('base64url')}`)

interface CallOptions {
  body?: unknown
  /** A bearer credential; none by default (these tests are explicit about who calls). */
  auth?: string
  headers?: Record<string, string>
}

/**
 * A request to one of the two instances. Every answer under /auth/ must carry
 * Cache-Control: no-store (RFC 6749 §5.1), errors included: checked here, for
 * every call this file makes.
 */
async function callOn(base: string, method: string, path: string, options: CallOptions = {}): Promise<TestResponse> {
  const headers: Record<string, string> = { ...options.headers }
  if (options.auth !== undefined) headers.authorization = `Bearer ${options.auth}`
  let body: string | undefined
  if (options.body !== undefined) {
    body = typeof options.body === 'string' ? options.body : JSON.stringify(options.body)
    headers['content-type'] ??= method === 'PATCH' ? 'application/merge-patch+json' : 'application/json'
  }
  const res = await fetch(base + path, { method, headers, body })
  const text = await res.text()
  const parsed = /json/.test(res.headers.get('content-type') ?? '') && text ? JSON.parse(text) : undefined
  if (path.startsWith('/auth/'))
    assert.equal(
      res.headers.get('cache-control'),
      'no-store',
      `${method} ${path} answered ${res.status} without Cache-Control: no-store`,
    )
  if (res.status >= 400) errorBodies.push(text)
  for (const member of ['access_token', 'refresh_token', 'key'])
    if (typeof parsed?.[member] === 'string') keep(parsed[member])
  return { status: res.status, headers: res.headers, text, body: parsed }
}
const call = (method: string, path: string, options?: CallOptions) => callOn(api.url, method, path, options)
const callB = (method: string, path: string, options?: CallOptions) => callOn(second.url, method, path, options)

const CHALLENGE = 'Bearer realm="api"'
const INVALID_TOKEN = 'Bearer realm="api", error="invalid_token"'

/** A problem answer; `challenge` is the exact WWW-Authenticate expected, null for none, undefined to not check. */
function assertProblem(res: TestResponse, status: number, code: string, challenge?: string | null): void {
  assert.equal(res.status, status, res.text)
  assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/)
  assert.equal(res.body.code, code, res.text)
  assert.equal(res.body.status, status)
  if (challenge !== undefined) assert.equal(res.headers.get('www-authenticate'), challenge)
}
const assertInvalidToken = (res: TestResponse) => assertProblem(res, 401, 'invalid_token', INVALID_TOKEN)

interface TokenPair {
  access_token: string
  token_type: string
  expires_in: number
  refresh_token: string
  scope: string
}

async function userWithPassword(role: 'admin' | 'user' = 'user', email?: string) {
  const pw = password()
  const user = await api.createUser({ role, password: pw, ...(email ? { email } : {}) })
  return { ...user, password: pw }
}

const login = (email: string, pw: string, extra: Record<string, unknown> = {}, on = call) =>
  on('POST', '/auth/login', { body: { email, password: pw, ...extra } })

async function loggedIn(
  user: { email: string; password: string },
  extra: Record<string, unknown> = {},
): Promise<TokenPair> {
  const res = await login(user.email, user.password, extra)
  assert.equal(res.status, 200, res.text)
  return res.body
}

const refresh = (token: string) => call('POST', '/auth/refresh', { body: { refresh_token: token } })
const me = (auth: string) => call('GET', '/auth/me', { auth })

const sha256 = (secret: string) => createHash('sha256').update(secret).digest()
const count = async (query: Promise<Array<{ n: number }>>) => (await query)[0]!.n

interface RefreshRow {
  session_id: number
  used_at: string | null
  revoked_at: string | null
}
async function refreshRow(token: string): Promise<RefreshRow> {
  const [row] = await sql<RefreshRow[]>`
    SELECT r.session_id, r.used_at, s.revoked_at FROM refresh_tokens r JOIN sessions s ON s.id = r.session_id WHERE
    r.token_hash = ${sha256(token)}`
  assert.ok(row, 'the refresh token is stored (as its SHA-256)')
  return row
}
const accessTokensOf = (sessionId: number) =>
  count(sql`SELECT count(*)::int AS n FROM access_tokens WHERE session_id = ${sessionId}`)

async function failuresOf(email: string): Promise<{ failures: number; locked: boolean } | undefined> {
  const [row] = await sql<Array<{ failures: number; locked: boolean }>>`
    SELECT failures, coalesce(locked_until > now(), false) AS locked FROM login_failures
      WHERE email = ${email.toLowerCase()} AND address <> '*'`
  return row
}

// ---------------------------------------------------------------------------
// JWT attacks through the server (the unit-level reasons are in jwt.test.ts)

const b64 = (value: unknown) =>
  Buffer.from(typeof value === 'string' ? value : JSON.stringify(value)).toString('base64url')

function forge(
  header: unknown,
  payload: unknown,
  { secret = SIGNING_KEY.secret, bits = 256 }: { secret?: Buffer; bits?: 256 | 384 | 512 } = {},
): string {
  const input = `${b64(header)}.${b64(payload)}`
  return `${input}.${createHmac(`sha${bits}`, secret).update(input).digest('base64url')}`
}

function adminClaims(over: Record<string, unknown> = {}): Record<string, unknown> {
  const now = Math.floor(Date.now() / 1000)
  const scope = 'api_keys:read api_keys:write products:read products:write users:read users:write'
  return {
    sub: String(api.admin.id),
    iss: config.jwtIssuer,
    aud: config.jwtAudience,
    iat: now,
    exp: now + 900,
    role: 'admin',
    scope,
    sid: String(2 ** 53),
    gen: 0,
    ...over,
  }
}

function jwtAttacks(): Array<[string, string]> {
  const HS256 = { alg: 'HS256', typ: 'JWT', kid: SIGNING_KEY.kid }
  const good = forge(HS256, adminClaims())
  const [h, p, s] = good.split('.') as [string, string, string]
  const now = Math.floor(Date.now() / 1000)
  // A signature with a - or _ to re-encode, and its last character changed without changing its bytes.
  let withUrlChars = good
  for (let i = 1; !/[-_]/.test(withUrlChars.split('.')[2]!); i++)
    withUrlChars = forge(HS256, adminClaims({ iat: now - i }))
  const [uh, up, us] = withUrlChars.split('.') as [string, string, string]
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
  const sameBytes = s.slice(0, -1) + alphabet[alphabet.indexOf(s.at(-1)!) ^ 1]
  assert.deepEqual(Buffer.from(sameBytes, 'base64url'), Buffer.from(s, 'base64url'))
  return [
    ...['none', 'None', 'NONE', 'nOnE'].flatMap((alg): Array<[string, string]> => [
      [`alg ${alg}, no signature`, `${b64({ alg, typ: 'JWT' })}.${p}.`],
      [`alg ${alg}, HS256 signature`, forge({ alg, typ: 'JWT' }, adminClaims())],
    ]),
    ['HS384, signed HMAC-SHA384', forge({ ...HS256, alg: 'HS384' }, adminClaims(), { bits: 384 })],
    ['HS512, signed HMAC-SHA512', forge({ ...HS256, alg: 'HS512' }, adminClaims(), { bits: 512 })],
    ['RS256, signed HMAC-SHA256 with the secret', forge({ ...HS256, alg: 'RS256' }, adminClaims())],
    ['signature stripped', `${h}.${p}.`],
    ['signature with = padding', `${good}=`],
    ['signature with + and /', `${uh}.${up}.${us.replaceAll('-', '+').replaceAll('_', '/')}`],
    ['signature with a last character decoding to the same bytes', `${h}.${p}.${sameBytes}`],
    ['another key', forge(HS256, adminClaims(), { secret: Buffer.from('not-the-service-key-but-32-bytes-long') })],
    ['an empty key', forge(HS256, adminClaims(), { secret: Buffer.alloc(0) })],
    ['expired', forge(HS256, adminClaims({ exp: now - 60, iat: now - 960 }))],
    ['exp missing', forge(HS256, adminClaims({ exp: undefined }))],
    ['exp as a string', forge(HS256, adminClaims({ exp: String(now + 900) }))],
    ['nbf in the future', forge(HS256, adminClaims({ nbf: now + 120 }))],
    ['iat in the future', forge(HS256, adminClaims({ iat: now + 120 }))],
    ['wrong iss', forge(HS256, adminClaims({ iss: 'someone-else' }))],
    ['wrong aud', forge(HS256, adminClaims({ aud: 'another-service' }))],
    ['unknown kid', forge({ ...HS256, kid: 'k9' }, adminClaims())],
    ['kid with a path', forge({ ...HS256, kid: '../../etc/passwd' }, adminClaims())],
    ['kid with SQL', forge({ ...HS256, kid: "' OR 1=1 --" }, adminClaims())],
    ['unknown crit', forge({ ...HS256, crit: ['x-custom'], 'x-custom': true }, adminClaims())],
    ['payload edited, old signature', `${h}.${b64(adminClaims({ sub: '1', scope: 'everything' }))}.${s}`],
    ['two segments', `${h}.${p}`],
    ['four segments', `${good}.${s}`],
    ['non-base64url characters', `${h}.${p}*.${s}`],
    ['header not JSON', forge('not json', adminClaims())],
    ['payload an array', forge(HS256, [adminClaims()])],
    ['a 5000-character token', forge(HS256, adminClaims({ pad: 'x'.repeat(3600) }))],
  ]
}

describe('credentials on the wire', () => {
  test(
    'the forging helper makes good tokens when nothing is wrong (so the attacks below test what they ' + 'say)',
    async () => {
      const res = await me(forge({ alg: 'HS256', typ: 'JWT', kid: SIGNING_KEY.kid }, adminClaims()))
      assert.equal(res.status, 200, res.text)
      assert.equal(res.body.user.id, api.admin.id)
    },
  )

  for (const [name, token] of jwtAttacks()) {
    test(`a JWT with ${name} is refused: 401 invalid_token, never 500`, async () => {
      assertInvalidToken(await me(token))
      assertInvalidToken(await call('GET', '/users', { auth: token }))
    })
  }

  test('no credential on a protected endpoint: 401 unauthorized with Bearer realm="api"', async () => {
    for (const path of ['/auth/me', '/users', '/products', '/api-keys']) {
      assertProblem(await call('GET', path), 401, 'unauthorized', CHALLENGE)
    }
  })

  const badHeaders: Array<[string, string]> = [
    ['Basic credentials', `Basic ${Buffer.from(`admin@example.com:secret`).toString('base64')}`],
    ['the Bearer scheme without a token', 'Bearer'],
    ['the Bearer scheme with only spaces', 'Bearer   '],
    ['another scheme', `Token ${api.admin.token}`],
    ['two tokens', `Bearer ${api.admin.token} ${api.admin.token}`],
    ['a token with a comma', 'Bearer abc,def'],
  ]
  for (const [name, header] of badHeaders) {
    test(`Authorization with ${name}: 401 invalid_token`, async () => {
      assertInvalidToken(await call('GET', '/auth/me', { headers: { authorization: header } }))
    })
  }

  test('the Bearer scheme name is case-insensitive (RFC 9110 §11.1)', async () => {
    const res = await call('GET', '/auth/me', { headers: { authorization: `bEaReR ${api.admin.token}` } })
    assert.equal(res.status, 200, res.text)
  })

  test('Authorization and X-API-Key together: 400 invalid_request, even when both are good', async () => {
    const created = await call('POST', '/api-keys', {
      auth: api.admin.token,
      body: { name: 'both', scopes: ['users:read'] },
    })
    assert.equal(created.status, 201, created.text)
    for (const auth of [api.admin.token, 'garbage']) {
      assertProblem(
        await call('GET', '/auth/me', { auth, headers: { 'x-api-key': created.body.key } }),
        400,
        'invalid_request',
      )
      assertProblem(
        await call('GET', '/users', { auth, headers: { 'x-api-key': created.body.key } }),
        400,
        'invalid_request',
      )
    }
  })

  test('credentials are never read from the query string', async () => {
    const token = encodeURIComponent(api.admin.token)
    // Anonymous with a good token in the query: still anonymous.
    assertProblem(await call('GET', `/auth/me?access_token=${token}`), 401, 'unauthorized', CHALLENGE)
    assertProblem(await call('GET', `/users?access_token=${token}`), 401, 'unauthorized', CHALLENGE)
    // With a credential, the parameter is unknown.
    assertProblem(
      await call('GET', `/auth/me?access_token=${token}`, { auth: api.admin.token }),
      400,
      'unknown_parameter',
    )
    assertProblem(
      await call('GET', `/users?access_token=${token}`, { auth: api.admin.token }),
      400,
      'unknown_parameter',
    )
    assertProblem(await call('GET', `/users?api_key=${token}`, { auth: api.admin.token }), 400, 'unknown_parameter')
  })

  const garbage: Array<[string, string]> = [
    ['a well-formed unknown upa_at_ token', `upa_at_${randomBytes(32).toString('base64url')}`],
    ['a well-formed unknown upa_ak_ key', `upa_ak_${randomBytes(32).toString('base64url')}`],
    ['a well-formed unknown upa_rt_ token', `upa_rt_${randomBytes(32).toString('base64url')}`],
    ['a short upa_at_ token', 'upa_at_abc'],
    ['a too long upa_ak_ key', `upa_ak_${randomBytes(33).toString('base64url')}`],
    ['a bare prefix', 'upa_rt_'],
    ['random text', 'hello'],
  ]
  for (const [name, secret] of garbage) {
    test(`${name} as a credential: 401 invalid_token (as Bearer and as X-API-Key)`, async () => {
      assertInvalidToken(await call('GET', '/auth/me', { auth: secret }))
      assertInvalidToken(await call('GET', '/auth/me', { headers: { 'x-api-key': secret } }))
    })
  }

  test('an unknown path or a wrong method under /auth/ is answered with no-store too', async () => {
    assertProblem(await call('GET', '/auth/nothing-here'), 404, 'not_found')
    assertProblem(await call('GET', '/auth/login'), 405, 'method_not_allowed')
  })
})

// ---------------------------------------------------------------------------
// Login

describe('POST /auth/login', () => {
  test('matches the e-mail without regard to case and returns a JWT pair for everything the role allows', async () => {
    const tag = unique()
    const user = await userWithPassword('user', `Ann.Login-${tag}@Example.COM`)
    const sessionsBefore = await count(sql`SELECT count(*)::int AS n FROM sessions WHERE user_id = ${user.id}`)
    const res = await login(`ann.login-${tag}@example.com`, user.password)
    assert.equal(res.status, 200, res.text)
    assert.match(res.headers.get('content-type') ?? '', /^application\/json/)
    assert.deepEqual(Object.keys(res.body).sort(), [
      'access_token',
      'expires_in',
      'refresh_token',
      'scope',
      'token_type',
    ])
    assert.equal(res.body.token_type, 'Bearer')
    assert.equal(res.body.expires_in, 900)
    assert.match(res.body.refresh_token, /^upa_rt_[A-Za-z0-9_-]{43}$/)
    assert.equal(res.body.scope, 'api_keys:read api_keys:write products:read users:read users:write')

    const claims = verifyJwt(res.body.access_token, {
      keys: config.jwtSecrets,
      issuer: config.jwtIssuer,
      audience: config.jwtAudience,
      now: Date.now() / 1000,
    })
    assert.equal(claims.sub, String(user.id))
    assert.equal(claims.role, 'user')
    assert.equal(claims.scope, res.body.scope)
    assert.equal(claims.exp - claims.iat, 900)
    assert.ok(Math.abs(claims.iat - Date.now() / 1000) < 10)

    // A session, its refresh token stored only as a hash, no opaque access token.
    assert.equal(
      await count(sql`SELECT count(*)::int AS n FROM sessions WHERE user_id = ${user.id}`),
      sessionsBefore + 1,
    )
    const row = await refreshRow(res.body.refresh_token)
    assert.equal(row.used_at, null)
    assert.equal(row.revoked_at, null)
    const [session] = await sql<
      Array<{ user_id: number; token_format: string; scopes: string[] }>
    >`SELECT user_id, token_format, scopes FROM sessions WHERE id = ${row.session_id}`
    assert.deepEqual(session, {
      user_id: user.id,
      token_format: 'jwt',
      scopes: ['users:read', 'users:write', 'products:read', 'api_keys:read', 'api_keys:write'],
    })
    assert.equal(await accessTokensOf(row.session_id), 0)
    assert.equal(
      await count(
        sql`SELECT count(*)::int AS n FROM refresh_tokens WHERE token_hash = ${Buffer.from(res.body.refresh_token)}`,
      ),
      0,
      'not stored in plain',
    )

    // Upper case works as well, and the token authenticates.
    assert.equal((await login(user.email.toUpperCase(), user.password)).status, 200)
    assert.equal((await me(res.body.access_token)).body.user.id, user.id)
  })

  test('token_format opaque returns an upa_at_ token stored as a hash, valid for ACCESS_TOKEN_TTL', async () => {
    const user = await userWithPassword()
    const pair = await loggedIn(user, { token_format: 'opaque' })
    assert.match(pair.access_token, /^upa_at_[A-Za-z0-9_-]{43}$/)
    assert.equal(pair.expires_in, 900)
    const [row] = await sql<Array<{ session_id: number; seconds: number }>>`
      SELECT session_id, extract(epoch FROM expires_at - now())::float8 AS seconds FROM access_tokens WHERE
      token_hash = ${sha256(pair.access_token)}`
    assert.ok(row, 'the access token is stored as its SHA-256')
    assert.ok(row.seconds > 890 && row.seconds <= 900, `expires in ${row.seconds} s`)
    assert.equal((await refreshRow(pair.refresh_token)).session_id, row.session_id)
    const res = await me(pair.access_token)
    assert.equal(res.status, 200, res.text)
    assert.equal(res.body.credential.type, 'token')
  })

  test('scope narrows the token: products:read only reads products', async () => {
    const user = await userWithPassword()
    const pair = await loggedIn(user, { scope: 'products:read' })
    assert.equal(pair.scope, 'products:read')
    assert.equal((await me(pair.access_token)).body.credential.scopes.join(' '), 'products:read')
    assert.equal((await call('GET', '/products', { auth: pair.access_token })).status, 200)
    const denied = await call('GET', `/users/${user.id}`, { auth: pair.access_token })
    assertProblem(
      denied,
      403,
      'insufficient_scope',
      'Bearer realm="api", error="insufficient_scope", scope="users:read"',
    )
    const opaque = await loggedIn(user, { scope: 'products:read users:read', token_format: 'opaque' })
    assert.equal(opaque.scope, 'products:read users:read')
    assert.equal((await call('GET', `/users/${user.id}`, { auth: opaque.access_token })).status, 200)
    assertProblem(
      await call('PATCH', `/users/${user.id}`, { auth: opaque.access_token, body: { name: 'x' } }),
      403,
      'insufficient_scope',
    )
  })

  test(
    'asking for a scope beyond the role, an unknown or an empty scope: 403 insufficient_scope and no ' + 'session',
    async () => {
      const user = await userWithPassword()
      for (const scope of ['products:write', 'products:read products:write', 'admin', '', '   ']) {
        const res = await login(user.email, user.password, { scope })
        assertProblem(res, 403, 'insufficient_scope')
      }
      assert.equal(await count(sql`SELECT count(*)::int AS n FROM sessions WHERE user_id = ${user.id}`), 0)
      // An admin may ask for products:write.
      const admin = await userWithPassword('admin')
      assert.equal((await loggedIn(admin, { scope: 'products:write' })).scope, 'products:write')
    },
  )

  test(
    'a wrong password, an unknown e-mail and an account without a password: the same 401, for the same work (one ' +
      'scrypt hash, against a decoy where there is no hash)',
    async () => {
      // A server of the test's own: its counters count these logins and nothing else.
      const own = await startServer()
      const onOwn = (method: string, path: string, options?: CallOptions) => callOn(own.url, method, path, options)
      const ownLogin = (email: string) => login(email, password('wrong'), {}, onOwn)
      const cases = {
        'a wrong password': (await own.createUser({ password: password() })).email,
        'an unknown e-mail': `nobody-${unique()}@example.com`,
        'an account without a password': (await own.createUser()).email,
      }
      const strip = ({ request_id, ...rest }: Record<string, unknown>) => (
        assert.equal(typeof request_id, 'string'),
        rest
      )
      const headerNames = (res: TestResponse) =>
        [...res.headers.keys()].filter((h) => h !== 'date' && h !== 'x-request-id').sort()
      let first: { res: TestResponse; work: Work } | undefined
      for (let i = 0; i < 4; i++) {
        for (const [name, email] of Object.entries(cases)) {
          const { result: res, work } = await workOf(own, () => ownLogin(email))
          assertProblem(res, 401, 'invalid_credentials')
          first ??= { res, work }
          assert.deepEqual(strip(res.body), strip(first.res.body), name)
          assert.deepEqual(headerNames(res), headerNames(first.res), name)
          assert.deepEqual(work, { hashes: 1, statements: first.work.statements }, `${name}: a wrong password's work`)
        }
      }
      // Every address is counted, known or not, and none is locked after 4.
      const failures = await own.sql<Array<{ email: string; failures: number; locked: boolean }>>`
      SELECT email, failures, coalesce(locked_until > now(), false) AS locked FROM login_failures WHERE address <> '*'`
      const byEmail = (a: { email: string }, b: { email: string }) => (a.email < b.email ? -1 : 1)
      const expected = Object.values(cases).map((email) => ({ email, failures: 4, locked: false }))
      assert.deepEqual(failures.map((row) => ({ ...row })).sort(byEmail), expected.sort(byEmail))
    },
  )

  test('a user without a password cannot log in: the same 401 invalid_credentials', async () => {
    const user = await api.createUser()
    for (const pw of ['null', 'undefined', password()]) {
      assertProblem(await login(user.email, pw), 401, 'invalid_credentials')
    }
    assert.equal(await count(sql`SELECT count(*)::int AS n FROM sessions WHERE user_id = ${user.id}`), 0)
  })

  describe('hostile bodies are refused before anything is checked or counted', async () => {
    const user = await userWithPassword()
    const big = keep('p'.repeat(100_000))
    const cases: Array<[string, unknown, number, string, string?, Record<string, string>?]> = [
      [
        'an unknown member (role)',
        { email: user.email, password: user.password, role: 'admin' },
        422,
        'validation_failed',
        '/role',
      ],
      [
        'an unknown member (user_id)',
        { email: user.email, password: user.password, user_id: 1 },
        422,
        'validation_failed',
        '/user_id',
      ],
      ['email as a number', { email: 42, password: user.password }, 422, 'validation_failed', '/email'],
      ['email as an array', { email: [user.email], password: user.password }, 422, 'validation_failed', '/email'],
      [
        'password as an object (operator injection)',
        { email: user.email, password: { $ne: '' } },
        422,
        'validation_failed',
        '/password',
      ],
      ['password as true', { email: user.email, password: true }, 422, 'validation_failed', '/password'],
      ['password missing', { email: user.email }, 422, 'validation_failed', '/password'],
      ['email missing', { password: user.password }, 422, 'validation_failed', '/email'],
      ['password empty', { email: user.email, password: '' }, 422, 'validation_failed', '/password'],
      ['a 100 kB password', { email: user.email, password: big }, 422, 'validation_failed', '/password'],
      [
        'a password with NUL',
        { email: user.email, password: `${user.password}\u0000` },
        422,
        'validation_failed',
        '/password',
      ],
      [
        'token_format unknown',
        { email: user.email, password: user.password, token_format: 'saml' },
        422,
        'validation_failed',
        '/token_format',
      ],
      [
        'scope as an array',
        { email: user.email, password: user.password, scope: ['products:read'] },
        422,
        'validation_failed',
        '/scope',
      ],
      ['the body an array', [{ email: user.email, password: user.password }], 422, 'validation_failed'],
      ['malformed JSON', `{"email":"${user.email}","password":"${user.password}"`, 400, 'malformed_json'],
      [
        'a form-encoded body',
        `email=${user.email}&password=${user.password}`,
        415,
        'unsupported_media_type',
        undefined,
        { 'content-type': 'application/x-www-form-urlencoded' },
      ],
    ]
    for (const [name, body, status, code, path, headers] of cases) {
      test(`${name}: ${status} ${code}`, async () => {
        const res = await call('POST', '/auth/login', { body, ...(headers ? { headers } : {}) })
        assertProblem(res, status, code)
        if (path)
          assert.ok(
            res.body.errors.some((e: { path: string }) => e.path === path),
            res.text,
          )
        assert.ok(!res.text.includes(user.password), 'the password is not echoed')
        assert.ok(res.text.length < 2000, 'the 100 kB value is not echoed either')
      })
    }
    test('none of them opened a session or counted a failure', async () => {
      assert.equal(await count(sql`SELECT count(*)::int AS n FROM sessions WHERE user_id = ${user.id}`), 0)
      assert.equal(await failuresOf(user.email), undefined)
    })
  })
})

// ---------------------------------------------------------------------------
// Throttling

describe('login throttling', () => {
  test(
    'after 5 failures for one e-mail: 429 too_many_login_attempts with Retry-After, even with the right ' + 'password',
    async () => {
      const user = await userWithPassword()
      for (let i = 0; i < 5; i++) assertProblem(await login(user.email, password('guess')), 401, 'invalid_credentials')
      assert.deepEqual(await failuresOf(user.email), { failures: 5, locked: true })
      for (const pw of [user.password, password('guess')]) {
        const res = await login(user.email.toUpperCase(), pw)
        assertProblem(res, 429, 'too_many_login_attempts')
        const retryAfter = res.headers.get('retry-after') ?? ''
        assert.match(retryAfter, /^\d+$/)
        assert.ok(Number(retryAfter) >= 1 && Number(retryAfter) <= 30, `Retry-After: ${retryAfter}`)
      }
      // Refused attempts do not add to the count.
      assert.deepEqual(await failuresOf(user.email), { failures: 5, locked: true })
      assert.equal(await count(sql`SELECT count(*)::int AS n FROM sessions WHERE user_id = ${user.id}`), 0)

      // The wait is over (simulated): the right password works and clears the count.
      await sql`UPDATE login_failures SET locked_until = now() - interval '1 second'
        WHERE email = ${user.email.toLowerCase()}`
      await loggedIn(user)
      assert.equal(await failuresOf(user.email), undefined)
    },
  )

  test('a burst of concurrent guesses for one e-mail is stopped after 5 as well', async () => {
    const email = `burst-${unique()}@example.com`
    const answers = await Promise.all(Array.from({ length: 12 }, () => login(email, password('burst'))))
    const statuses = answers.map((r) => r.status).sort()
    assert.deepEqual(statuses, [...Array(5).fill(401), ...Array(7).fill(429)], `statuses ${statuses.join(' ')}`)
    for (const res of answers)
      assertProblem(res, res.status, res.status === 401 ? 'invalid_credentials' : 'too_many_login_attempts')
    assert.deepEqual(await failuresOf(email), { failures: 5, locked: true })
  })

  test('failures on one instance count on the other, and a success on either clears them for both', async () => {
    const user = await userWithPassword()
    for (let i = 0; i < 2; i++)
      assertProblem(await login(user.email, password('a'), {}, call), 401, 'invalid_credentials')
    for (let i = 0; i < 2; i++)
      assertProblem(await login(user.email, password('b'), {}, callB), 401, 'invalid_credentials')
    assert.deepEqual(await failuresOf(user.email), { failures: 4, locked: false })
    assert.equal((await login(user.email, user.password, {}, callB)).status, 200)
    assert.equal(await failuresOf(user.email), undefined)

    for (let i = 0; i < 3; i++)
      assertProblem(await login(user.email, password('a'), {}, call), 401, 'invalid_credentials')
    for (let i = 0; i < 2; i++)
      assertProblem(await login(user.email, password('b'), {}, callB), 401, 'invalid_credentials')
    for (const on of [call, callB]) {
      const res = await login(user.email, user.password, {}, on)
      assertProblem(res, 429, 'too_many_login_attempts')
      assert.match(res.headers.get('retry-after') ?? '', /^\d+$/)
    }
    assert.deepEqual(await failuresOf(user.email), { failures: 5, locked: true })
  })
})

// ---------------------------------------------------------------------------
// Refresh

const refreshUser = await userWithPassword()

describe('POST /auth/refresh', () => {
  test('returns a new pair and retires the refresh token it was given', async () => {
    const first = await loggedIn(refreshUser, { token_format: 'opaque' })
    const res = await refresh(first.refresh_token)
    assert.equal(res.status, 200, res.text)
    const next: TokenPair = res.body
    assert.deepEqual(Object.keys(next).sort(), ['access_token', 'expires_in', 'refresh_token', 'scope', 'token_type'])
    assert.match(next.access_token, /^upa_at_/)
    assert.match(next.refresh_token, /^upa_rt_[A-Za-z0-9_-]{43}$/)
    assert.notEqual(next.refresh_token, first.refresh_token)
    assert.notEqual(next.access_token, first.access_token)
    assert.equal(next.scope, first.scope)

    const old = await refreshRow(first.refresh_token)
    const fresh = await refreshRow(next.refresh_token)
    assert.equal(typeof old.used_at, 'string', 'the old refresh token is retired (used_at set)')
    assert.equal(fresh.used_at, null)
    assert.equal(fresh.session_id, old.session_id, 'the same session goes on')
    assert.equal(fresh.revoked_at, null)
    assert.equal((await me(next.access_token)).body.credential.type, 'token')
  })

  test('a JWT session refreshes to a new JWT', async () => {
    const first = await loggedIn(refreshUser)
    const res = await refresh(first.refresh_token)
    assert.equal(res.status, 200, res.text)
    assert.equal(res.body.access_token.split('.').length, 3)
    const got = await me(res.body.access_token)
    assert.equal(got.body.credential.type, 'jwt')
    assert.equal(got.body.user.id, refreshUser.id)
  })

  test('a retired refresh token presented again: 401, and the whole session is revoked', async () => {
    const p1 = await loggedIn(refreshUser, { token_format: 'opaque' })
    const p2: TokenPair = (await refresh(p1.refresh_token)).body
    const p3: TokenPair = (await refresh(p2.refresh_token)).body
    const { session_id } = await refreshRow(p1.refresh_token)
    assert.equal(await accessTokensOf(session_id), 3)

    assertInvalidToken(await refresh(p1.refresh_token))
    const row = await refreshRow(p3.refresh_token)
    assert.equal(typeof row.revoked_at, 'string', 'sessions.revoked_at is set')
    assert.equal(await accessTokensOf(session_id), 0, 'its access tokens are deleted')
    // Everything of the session stops working, the newest pair included.
    assertInvalidToken(await refresh(p3.refresh_token))
    for (const pair of [p1, p2, p3]) assertInvalidToken(await me(pair.access_token))
    assert.equal((await refreshRow(p3.refresh_token)).used_at, null, 'refused, not rotated')
  })

  test('two simultaneous refreshes with one token: exactly one 200', async () => {
    const pair = await loggedIn(refreshUser, { token_format: 'opaque' })
    const { session_id } = await refreshRow(pair.refresh_token)
    const answers = await Promise.all([refresh(pair.refresh_token), refresh(pair.refresh_token)])
    assert.deepEqual(answers.map((r) => r.status).sort(), [200, 401])
    assertInvalidToken(answers.find((r) => r.status === 401)!)
    // One rotation only: the login's refresh token and one successor.
    assert.equal(await count(sql`SELECT count(*)::int AS n FROM refresh_tokens WHERE session_id = ${session_id}`), 2)
    // The loser was a reuse of a retired token: strict reuse detection
    // ends the session (README, "Deviations from the contract").
    assert.equal(typeof (await refreshRow(pair.refresh_token)).revoked_at, 'string')
  })

  test('unknown or malformed refresh tokens: 401 or 422, and nothing changes', async () => {
    const pair = await loggedIn(refreshUser, { token_format: 'opaque' })
    const unknownToken = `upa_rt_${randomBytes(32).toString('base64url')}`
    for (const token of [unknownToken, pair.access_token, 'upa_rt_short', api.admin.token])
      assertInvalidToken(await refresh(token))
    for (const body of [
      {},
      { refresh_token: 42 },
      { refresh_token: '' },
      { refresh_token: pair.refresh_token, scope: 'products:write' },
    ]) {
      assertProblem(await call('POST', '/auth/refresh', { body }), 422, 'validation_failed')
    }
    assertProblem(await call('POST', '/auth/refresh'), 415, 'unsupported_media_type')
    const row = await refreshRow(pair.refresh_token)
    assert.equal(row.used_at, null)
    assert.equal(row.revoked_at, null)
    assert.equal((await me(pair.access_token)).status, 200)
  })
})

// ---------------------------------------------------------------------------
// Logout

describe('POST /auth/logout', () => {
  test('with {refresh_token}: 204, and every token of the session stops working', async () => {
    const pair = await loggedIn(refreshUser, { token_format: 'opaque' })
    const { session_id } = await refreshRow(pair.refresh_token)
    const res = await call('POST', '/auth/logout', { body: { refresh_token: pair.refresh_token } })
    assert.equal(res.status, 204, res.text)
    assert.equal(res.text, '')
    assert.equal(typeof (await refreshRow(pair.refresh_token)).revoked_at, 'string')
    assert.equal(await accessTokensOf(session_id), 0)
    assertInvalidToken(await me(pair.access_token))
    assertInvalidToken(await refresh(pair.refresh_token))
  })

  test(
    'with the opaque access token as credential and no body: 204, and that token stops working at ' + 'once',
    async () => {
      const pair = await loggedIn(refreshUser, { token_format: 'opaque' })
      const other = await loggedIn(refreshUser, { token_format: 'opaque' })
      assert.equal((await me(pair.access_token)).status, 200)
      const res = await call('POST', '/auth/logout', { auth: pair.access_token })
      assert.equal(res.status, 204, res.text)
      assertInvalidToken(await me(pair.access_token))
      assertInvalidToken(await refresh(pair.refresh_token))
      assert.equal(typeof (await refreshRow(pair.refresh_token)).revoked_at, 'string')
      // Only that session: another login of the same user goes on.
      assert.equal((await me(other.access_token)).status, 200)
    },
  )

  test('with a JWT and no body: its session ends, the JWT and its refresh token stop at once', async () => {
    const pair = await loggedIn(refreshUser)
    assert.equal((await me(pair.access_token)).status, 200)
    assert.equal((await call('POST', '/auth/logout', { auth: pair.access_token })).status, 204)
    assert.notEqual((await refreshRow(pair.refresh_token)).revoked_at, null)
    assertInvalidToken(await me(pair.access_token))
    assertInvalidToken(await refresh(pair.refresh_token))
  })

  test('with nothing at all, or with an API key: 400 invalid_request, no session ended', async () => {
    const pair = await loggedIn(refreshUser)
    assertProblem(await call('POST', '/auth/logout'), 400, 'invalid_request')
    const key = (
      await call('POST', '/api-keys', { auth: pair.access_token, body: { name: 'logout key', scopes: ['users:read'] } })
    ).body.key
    assertProblem(await call('POST', '/auth/logout', { auth: key }), 400, 'invalid_request')
    assert.equal((await refreshRow(pair.refresh_token)).revoked_at, null)
    assert.equal((await me(pair.access_token)).status, 200)
  })

  test(
    'an unknown refresh token: 401; a bad credential beside a good refresh token: 401 and the session ' + 'stays',
    async () => {
      assertInvalidToken(
        await call('POST', '/auth/logout', {
          body: { refresh_token: `upa_rt_${randomBytes(32).toString('base64url')}` },
        }),
      )
      const pair = await loggedIn(refreshUser, { token_format: 'opaque' })
      assertInvalidToken(
        await call('POST', '/auth/logout', { auth: 'upa_at_nonsense', body: { refresh_token: pair.refresh_token } }),
      )
      // A token in the query string logs nobody out.
      assertProblem(await call('POST', `/auth/logout?access_token=${pair.access_token}`), 400, 'unknown_parameter')
      assert.equal((await refreshRow(pair.refresh_token)).revoked_at, null)
      assert.equal((await me(pair.access_token)).status, 200)
    },
  )
})

// ---------------------------------------------------------------------------
// /auth/me

describe('GET /auth/me', () => {
  const userMembers = ['created_at', 'email', 'email_verified_at', 'id', 'name', 'role', 'updated_at']

  test('with a JWT: the user and {type: "jwt", scopes, expires_at, amr, auth_time}', async () => {
    const pair = await loggedIn(refreshUser)
    const res = await me(pair.access_token)
    assert.equal(res.status, 200, res.text)
    assert.deepEqual(Object.keys(res.body).sort(), ['credential', 'user'])
    assert.deepEqual(Object.keys(res.body.user).sort(), userMembers)
    assert.equal(res.body.user.id, refreshUser.id)
    assert.equal(res.body.user.email, refreshUser.email)
    const { exp } = JSON.parse(Buffer.from(pair.access_token.split('.')[1]!, 'base64url').toString())
    const [session] = await sql<Array<{ created: number }>>`
      SELECT floor(extract(epoch FROM s.created_at))::float8 AS created FROM sessions s
      JOIN refresh_tokens r ON r.session_id = s.id WHERE r.token_hash = ${sha256(pair.refresh_token)}`
    assert.deepEqual(res.body.credential, {
      type: 'jwt',
      scopes: ['api_keys:read', 'api_keys:write', 'products:read', 'users:read', 'users:write'],
      expires_at: new Date(exp * 1000).toISOString(),
      amr: ['pwd'],
      auth_time: session!.created,
    })
  })

  test('with an opaque token: {type: "token"}, the stored expiry and how the session logged in', async () => {
    const pair = await loggedIn(refreshUser, { token_format: 'opaque', scope: 'users:read products:read' })
    const res = await me(pair.access_token)
    assert.equal(res.status, 200, res.text)
    const [row] = await sql<Array<{ expires_at: string; created: number }>>`
      SELECT t.expires_at, floor(extract(epoch FROM s.created_at))::float8 AS created
      FROM access_tokens t JOIN sessions s ON s.id = t.session_id WHERE t.token_hash = ${sha256(pair.access_token)}`
    assert.deepEqual(res.body.credential, {
      type: 'token',
      scopes: ['products:read', 'users:read'],
      expires_at: row!.expires_at,
      amr: ['pwd'],
      auth_time: row!.created,
    })
    assert.equal(res.body.user.id, refreshUser.id)
  })

  test('with an API key (X-API-Key or Bearer): {type: "api_key"}, its scopes and expiry', async () => {
    const expires = new Date(Date.now() + 86_400_000).toISOString()
    const created = await call('POST', '/api-keys', {
      auth: refreshUser.token,
      body: {
        name: 'me',
        scopes: ['users:read', 'products:read'],
        expires_at: expires,
        current_password: refreshUser.password,
      },
    })
    assert.equal(created.status, 201, created.text)
    assert.match(created.body.key, /^upa_ak_[A-Za-z0-9_-]{43}$/)
    const expected = { type: 'api_key', scopes: ['products:read', 'users:read'], expires_at: expires }
    for (const res of [
      await call('GET', '/auth/me', { headers: { 'x-api-key': created.body.key } }),
      await me(created.body.key),
    ]) {
      assert.equal(res.status, 200, res.text)
      assert.equal(res.body.user.id, refreshUser.id)
      assert.deepEqual(res.body.credential, expected)
    }
    const forever = await call('POST', '/api-keys', {
      auth: refreshUser.token,
      body: { name: 'forever', scopes: ['products:read'], current_password: refreshUser.password },
    })
    assert.equal((await me(forever.body.key)).body.credential.expires_at, null)
  })
})

// ---------------------------------------------------------------------------
// Live credentials and changes to their user

describe('every credential sees role changes and deletion at once', () => {
  test(
    'demoted: the opaque token and the API key lose admin powers at once; a JWT issued before is ' + 'refused',
    async () => {
      const carol = await userWithPassword('admin')
      const opaque = await loggedIn(carol, { token_format: 'opaque' })
      const jwt = await loggedIn(carol)
      const key = (
        await call('POST', '/api-keys', {
          auth: opaque.access_token,
          body: { name: 'admin key', scopes: ['users:read', 'products:write'] },
        })
      ).body.key
      for (const auth of [opaque.access_token, jwt.access_token, key])
        assert.equal((await call('GET', '/users', { auth })).status, 200)

      const demoted = await call('PATCH', `/users/${carol.id}`, { auth: api.admin.token, body: { role: 'user' } })
      assert.equal(demoted.status, 200, demoted.text)
      assert.equal(demoted.body.role, 'user')

      assertProblem(await call('GET', '/users', { auth: opaque.access_token }), 403, 'forbidden')
      assertProblem(await call('GET', '/users', { auth: key }), 403, 'forbidden')
      // products:write is beyond the user role now, whatever the key was given.
      assertProblem(
        await call('POST', '/products', {
          auth: key,
          body: { sku: `K-${unique()}`, name: 'n', price: 1, currency: 'EUR' },
        }),
        403,
        'insufficient_scope',
      )
      const now = await me(opaque.access_token)
      assert.equal(now.body.user.role, 'user')
      assert.ok(!now.body.credential.scopes.includes('products:write'))
      // The JWT says admin, but a role change voids every JWT issued before it.
      assertInvalidToken(await call('GET', '/users', { auth: jwt.access_token }))
      // A refresh issues what the role allows now.
      const refreshed = await refresh(jwt.refresh_token)
      assert.equal(refreshed.status, 200, refreshed.text)
      assert.ok(!refreshed.body.scope.includes('products:write'), refreshed.body.scope)
      assertProblem(await call('GET', '/users', { auth: refreshed.body.access_token }), 403, 'forbidden')
    },
  )

  test(
    'deleted: its opaque token, refresh token, API key and JWT are refused at once, its sessions ended and keys ' +
      'gone; the purge takes the rest',
    async () => {
      const dave = await userWithPassword()
      const opaque = await loggedIn(dave, { token_format: 'opaque' })
      const created = await call('POST', '/api-keys', {
        auth: dave.token,
        body: { name: 'doomed', scopes: ['users:read'], current_password: dave.password },
      })
      assert.equal(created.status, 201, created.text)
      const { session_id } = await refreshRow(opaque.refresh_token)
      const rows = () =>
        sql<[{ sessions: number; keys: number; refresh: number; access: number }]>`
        SELECT (SELECT count(*)::int FROM sessions WHERE user_id = ${dave.id}) AS sessions,
               (SELECT count(*)::int FROM api_keys WHERE user_id = ${dave.id}) AS keys,
               (SELECT count(*)::int FROM refresh_tokens WHERE session_id = ${session_id}) AS refresh,
               (SELECT count(*)::int FROM access_tokens WHERE session_id = ${session_id}) AS access`
      assert.deepEqual((await rows())[0], { sessions: 1, keys: 1, refresh: 1, access: 1 })
      assert.equal((await me(created.body.key)).status, 200)

      assert.equal((await call('DELETE', `/users/${dave.id}`, { auth: api.admin.token })).status, 204)
      assertInvalidToken(await me(opaque.access_token))
      assertInvalidToken(await call('GET', '/auth/me', { headers: { 'x-api-key': created.body.key } }))
      assertInvalidToken(await refresh(opaque.refresh_token))
      assertInvalidToken(await me(dave.token))
      // In the trash: its session is ended, not gone (its tokens refused with it).
      assert.deepEqual((await rows())[0], { sessions: 1, keys: 0, refresh: 1, access: 1 })
      const [live] =
        await sql`SELECT count(*)::int AS n FROM sessions WHERE user_id = ${dave.id} AND revoked_at IS NULL`
      assert.equal(live!.n, 0)
      const purge = await call('DELETE', `/users/${dave.id}?permanent=true`, { auth: api.admin.token })
      assert.equal(purge.status, 204)
      assert.deepEqual((await rows())[0], { sessions: 0, keys: 0, refresh: 0, access: 0 })
    },
  )
})

// ---------------------------------------------------------------------------
// Flood

test(
  'a login flood fills the hash queue and no more: the logins past it are turned away at once (429, Retry-After), ' +
    'other endpoints answer meanwhile',
  async () => {
    const product = await call('POST', '/products', {
      auth: api.admin.token,
      body: { sku: `FLOOD-${unique()}`, name: 'Flood', price: 100, currency: 'EUR' },
    })
    assert.equal(product.status, 201, product.text)
    const reader = await api.createUser()
    const probe = async () => {
      assert.equal((await call('GET', '/healthz')).status, 200)
      const read = await call('GET', `/products/${product.body.id}`, { auth: reader.token })
      assert.equal(read.status, 200, read.text)
    }
    // Both hash slots held: the flood waits in the queue (64) or is turned away, whatever a hash costs here.
    // How long the probes take meanwhile is a figure of `make bench-faults` (bench/faults/timing-channels.ts).
    const release = await holdHashSlots(api)
    const answered: TestResponse[] = []
    const flood = Promise.all(
      Array.from({ length: 100 }, async () => {
        const res = await login(`flood-${unique()}@example.com`, password('flood'))
        answered.push(res)
        return res
      }),
    )
    let answers: TestResponse[]
    try {
      await waitUntil('the 36 logins past the queue turned away', () => answered.length === 36)
      for (const res of answered) {
        assertProblem(res, 429, 'rate_limited')
        assert.equal(res.headers.get('retry-after'), '1')
      }
      for (let i = 0; i < 5; i++) await probe()
      assert.equal(answered.length, 36, 'the queued logins wait')
    } finally {
      await release()
      answers = await flood
    }
    const checked = answers.filter((r) => r.status === 401)
    assert.equal(checked.length, 64, `statuses: ${answers.map((r) => r.status).join(' ')}`)
    for (const res of checked) assertProblem(res, 401, 'invalid_credentials')
    await probe()
  },
)

// ---------------------------------------------------------------------------
// Secrets

test('no password, token, refresh token or API key appears in a log line or an error body', () => {
  assert.ok(secrets.size > 100, `collected ${secrets.size} secrets`)
  const lines = [...api.logs, ...second.logs].map((line) => JSON.stringify(line))
  assert.ok(
    lines.some((l) => l.includes('"/auth/login"')),
    'the logins were logged',
  )
  assert.ok(errorBodies.length > 100)
  for (const secret of secrets) {
    const inLog = lines.find((l) => l.includes(secret))
    assert.equal(inLog, undefined, `a secret (${secret.slice(0, 10)}…) is in a log line`)
    const inBody = errorBodies.find((b) => b.includes(secret))
    assert.equal(inBody, undefined, `a secret (${secret.slice(0, 10)}…) is in an error body`)
  }
})
