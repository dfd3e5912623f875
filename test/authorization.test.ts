import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { testPasswords } from './helpers/passwords.js'
import type { Role, Scope } from '../src/auth/principal.js'
import { applicationRegistry } from './helpers/registry.js'
import { displayPrefix, hashSecret, newSecret } from '../src/auth/tokens.js'
import { startServer, type TestResponse, type TestServer } from './helpers/server.js'

const roleScopes = applicationRegistry.scopes.byRole

// Who may call what: every endpoint × every kind of credential × every kind
// of caller, against the contract (docs/auth.md, "Who may call what"), with the database
// compared before and after each call so that a refused request is seen to
// change nothing, and an allowed write to change something. Then the rules a
// route declaration cannot express: a non-admin and other users' ids, a
// non-admin and the role member, and self sign-up (ALLOW_SIGNUP).
//
// Top-level tests run one after another (node:test's default), so the
// before/after comparison sees only the request under test.

const api = await startServer()

// ---------------------------------------------------------------------------
// Helpers

/** One real scrypt hash for every user of this file that logs in (hashing costs ~100 ms each). */
const PASSWORD = 'authorization-test-password'
const passwordHash = await testPasswords.hash(PASSWORD)

let sequence = 0
const unique = (tag: string) => `${tag}-${process.pid}-${++sequence}`

interface Actor {
  id: number
  role: Role
  email: string
}

async function newActor(server: TestServer, role: Role): Promise<Actor> {
  const { id, email } = await server.createUser({ role, name: `Actor ${role}`, passwordHash })
  return { id, role, email }
}

const opaqueTokens = new Map<number, string>()
/** An opaque access token from POST /auth/login, one login per actor. */
async function opaqueToken(server: TestServer, actor: Actor): Promise<string> {
  const cached = opaqueTokens.get(actor.id)
  if (cached) return cached
  const res = await server.request('POST', '/auth/login', {
    auth: null,
    body: { email: actor.email, password: PASSWORD, token_format: 'opaque' },
  })
  assert.equal(res.status, 200, res.text)
  assert.match(res.body.access_token, /^upa_at_/)
  opaqueTokens.set(actor.id, res.body.access_token)
  return res.body.access_token
}

/**
 * An API key stored as POST /api-keys would store it. Planted with SQL so
 * that a key may hold a scope its user's role does not allow (as after a
 * demotion): the API itself refuses to create such a key.
 */
async function plantKey(
  server: TestServer,
  userId: number,
  scopes: readonly string[],
  name = 'planted',
): Promise<{ id: number; key: string }> {
  const key = newSecret('apiKey')
  const [row] = await server.sql<Array<{ id: number }>>`
    INSERT INTO api_keys (user_id, name, prefix, key_hash, scopes)
    VALUES (${userId}, ${name}, ${displayPrefix(key)}, ${hashSecret(key)}, ${scopes as string[]}) RETURNING id`
  return { id: Number(row!.id), key }
}

const keyCache = new Map<string, string>()
async function cachedKey(server: TestServer, actor: Actor, scopes: readonly string[]): Promise<string> {
  const cacheKey = `${actor.id}:${[...scopes].sort().join(' ')}`
  let key = keyCache.get(cacheKey)
  if (!key) {
    key = (await plantKey(server, actor.id, scopes)).key
    keyCache.set(cacheKey, key)
  }
  return key
}

/**
 * Everything a request could change, as one text: every row of every table
 * (the list is read once per server, so tables added later are covered too).
 * api_keys.last_used_at is left out: it is the one write authentication
 * itself makes when a key is presented, whatever the answer (at most once a minute).
 * A write's event is part of it: a refused request or a read records none.
 */
const snapshotQueries = new Map<TestServer, string>()
async function snapshot(server: TestServer): Promise<string> {
  let query = snapshotQueries.get(server)
  if (!query) {
    const tables = await server.sql<
      Array<{ name: string }>
    >`SELECT tablename AS name FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename`
    assert.ok(tables.length >= 7, 'the snapshot sees the tables')
    const parts = tables.map(({ name }) => {
      const from =
        name === 'api_keys'
          ? '(SELECT id, user_id, name, prefix, key_hash, scopes, created_at, expires_at FROM api_keys)'
          : `"${name}"`
      return `'${name}', (SELECT coalesce(json_agg(t ORDER BY t::text), '[]') FROM ${from} t)`
    })
    query = `SELECT json_build_object(${parts.join(', ')})::text AS s`
    snapshotQueries.set(server, query)
  }
  // Events move from the outbox to the log in the background (src/events/publisher.ts): moved first, an event is in one
  // place only.
  await server.published()
  const [row] = await server.sql.unsafe<[{ s: string }]>(query)
  return row.s
}

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/)
  assert.equal(res.body.code, code, res.text)
  assert.equal(res.body.status, status)
}

const REALM = 'Bearer realm="api"'
const scopeChallenge = (scope: string) => `${REALM}, error="insufficient_scope", scope="${scope}"`

/** Asserts a refusal with its code and, where the contract has one, its challenge. */
function assertRefused(res: TestResponse, status: number, code: string, scope?: string): void {
  assertProblem(res, status, code)
  if (code === 'unauthorized') assert.equal(res.headers.get('www-authenticate'), REALM)
  if (code === 'insufficient_scope') assert.equal(res.headers.get('www-authenticate'), scopeChallenge(scope!))
}

const validProduct = () => ({ sku: unique('SKU'), name: 'Widget', price: 100, currency: 'EUR' })

async function plantProduct(): Promise<number> {
  const [row] = await api.sql<Array<{ id: number }>>`
    INSERT INTO products (sku, name, price, currency) VALUES (${unique('SKU')}, 'Planted', 100, 'EUR') RETURNING id`
  return Number(row!.id)
}

// ---------------------------------------------------------------------------
// The cast: an admin, the user an endpoint is about ("self"), another user.

const actors = {
  admin: await newActor(api, 'admin'),
  self: await newActor(api, 'user'),
  other: await newActor(api, 'user'),
}
type ActorKind = keyof typeof actors

const standingProduct = await plantProduct()
const standingKeyOfSelf = await plantKey(api, actors.self.id, ['users:read'], 'standing')
await plantKey(api, actors.other.id, ['users:read'], 'of other') // so that "only own keys" has something to leave out

// ---------------------------------------------------------------------------
// The matrix

const credentialKinds = ['none', 'JWT', 'opaque token', 'API key with the scope', 'API key without the scope'] as const
type CredentialKind = (typeof credentialKinds)[number]
const credentialLabels: Record<CredentialKind, string> = {
  none: 'no credential',
  JWT: 'a JWT',
  'opaque token': 'an opaque token',
  'API key with the scope': 'an API key with the scope',
  'API key without the scope': 'an API key without the scope',
}

interface Arranged {
  path: string
  body?: unknown
  /** The caller "self" is, when the case needs a user of its own (deleting oneself). */
  self?: Actor
}

interface Endpoint {
  method: string
  template: string
  /** The scope the credential needs; null: any credential will do. */
  scope: Scope | null
  /** public; any authenticated; admin only; admin or the user in the path; the key's owner or admin (others: 404). */
  who: 'public' | 'any' | 'admin' | 'admin-or-self' | 'owner'
  success: number
  /** Whether a successful call writes to the database. */
  writes: boolean
  /**
   * For a person, not a program: an API key (with the scope) gets
   * 403 forbidden always, or when acting on itself ('self').
   */
  interactive?: 'always' | 'self'
  arrange(): Promise<Arranged>
  /** Checks on a successful answer. */
  check?(res: TestResponse, caller: Actor, credential: CredentialKind): void
}

const endpoints: Endpoint[] = [
  {
    method: 'GET',
    template: '/healthz',
    scope: null,
    who: 'public',
    success: 200,
    writes: false,
    arrange: async () => ({ path: '/healthz' }),
  },
  {
    method: 'GET',
    template: '/readyz',
    scope: null,
    who: 'public',
    success: 200,
    writes: false,
    arrange: async () => ({ path: '/readyz' }),
  },
  {
    method: 'GET',
    template: '/auth/me',
    scope: null,
    who: 'any',
    success: 200,
    writes: false,
    arrange: async () => ({ path: '/auth/me' }),
    check(res, caller, credential) {
      assert.equal(res.body.user.id, caller.id)
      const type = { JWT: 'jwt', 'opaque token': 'token' }[credential as string] ?? 'api_key'
      assert.equal(res.body.credential.type, type)
    },
  },
  {
    method: 'GET',
    template: '/users',
    scope: 'users:read',
    who: 'admin',
    success: 200,
    writes: false,
    arrange: async () => ({ path: '/users?limit=200' }),
    check: (res) => assert.ok(res.body.some((u: { id: number }) => u.id === actors.other.id)),
  },
  {
    method: 'POST',
    template: '/users',
    scope: 'users:write',
    who: 'admin',
    success: 201,
    writes: true,
    arrange: async () => ({ path: '/users', body: { name: 'Created', email: `${unique('created')}@example.com` } }),
  },
  {
    method: 'GET',
    template: '/users/{id}',
    scope: 'users:read',
    who: 'admin-or-self',
    success: 200,
    writes: false,
    arrange: async () => ({ path: `/users/${actors.self.id}` }),
    check: (res) => assert.equal(res.body.id, actors.self.id),
  },
  {
    method: 'PUT',
    template: '/users/{id}',
    scope: 'users:write',
    who: 'admin-or-self',
    success: 200,
    writes: true,
    arrange: async () => ({
      path: `/users/${actors.self.id}`,
      body: { name: unique('Put'), email: actors.self.email },
    }),
  },
  {
    method: 'PATCH',
    template: '/users/{id}',
    scope: 'users:write',
    who: 'admin-or-self',
    success: 200,
    writes: true,
    arrange: async () => ({ path: `/users/${actors.self.id}`, body: { name: unique('Patched') } }),
  },
  {
    // Each case deletes a user of its own, which is also "self" for the case.
    method: 'DELETE',
    template: '/users/{id}',
    scope: 'users:write',
    who: 'admin-or-self',
    success: 204,
    writes: true,
    interactive: 'self',
    async arrange() {
      const target = await newActor(api, 'user')
      // Deleting oneself takes the password; an admin deleting another
      // user needs no body, and one given changes nothing.
      return { path: `/users/${target.id}`, self: target, body: { current_password: PASSWORD } }
    },
  },
  {
    method: 'GET',
    template: '/products',
    scope: 'products:read',
    who: 'any',
    success: 200,
    writes: false,
    arrange: async () => ({ path: '/products' }),
  },
  {
    method: 'GET',
    template: '/products/{id}',
    scope: 'products:read',
    who: 'any',
    success: 200,
    writes: false,
    arrange: async () => ({ path: `/products/${standingProduct}` }),
  },
  {
    method: 'POST',
    template: '/products',
    scope: 'products:write',
    who: 'admin',
    success: 201,
    writes: true,
    arrange: async () => ({ path: '/products', body: validProduct() }),
  },
  {
    method: 'PUT',
    template: '/products/{id}',
    scope: 'products:write',
    who: 'admin',
    success: 200,
    writes: true,
    arrange: async () => ({
      path: `/products/${standingProduct}`,
      body: { ...validProduct(), name: unique('Replaced') },
    }),
  },
  {
    method: 'PATCH',
    template: '/products/{id}',
    scope: 'products:write',
    who: 'admin',
    success: 200,
    writes: true,
    arrange: async () => ({ path: `/products/${standingProduct}`, body: { name: unique('Patched') } }),
  },
  {
    method: 'DELETE',
    template: '/products/{id}',
    scope: 'products:write',
    who: 'admin',
    success: 204,
    writes: true,
    arrange: async () => ({ path: `/products/${await plantProduct()}` }),
  },
  {
    method: 'GET',
    template: '/api-keys',
    scope: 'api_keys:read',
    who: 'any',
    success: 200,
    writes: false,
    arrange: async () => ({ path: '/api-keys?limit=200' }),
    check(res, caller) {
      assert.ok(res.body.length > 0)
      // Everyone sees their own keys; an admin sees everyone's.
      if (caller.role !== 'admin') for (const k of res.body) assert.equal(k.user_id, caller.id)
      else assert.ok(res.body.some((k: { user_id: number }) => k.user_id !== caller.id))
    },
  },
  {
    method: 'GET',
    template: '/api-keys?user_id={id}',
    scope: 'api_keys:read',
    who: 'admin-or-self',
    success: 200,
    writes: false,
    arrange: async () => ({ path: `/api-keys?user_id=${actors.self.id}` }),
    check(res) {
      assert.ok(res.body.some((k: { id: number }) => k.id === standingKeyOfSelf.id))
      for (const k of res.body) assert.equal(k.user_id, actors.self.id)
    },
  },
  {
    method: 'POST',
    template: '/api-keys',
    scope: 'api_keys:write',
    who: 'any',
    success: 201,
    writes: true,
    interactive: 'always',
    // The matrix's JWTs name no session, so no fresh login: the password is given.
    arrange: async () => ({
      path: '/api-keys',
      body: { name: 'Matrix key', scopes: ['api_keys:write'], current_password: PASSWORD },
    }),
    check: (res, caller) => assert.equal(res.body.user_id, caller.id),
  },
  {
    method: 'GET',
    template: '/api-keys/{id}',
    scope: 'api_keys:read',
    who: 'owner',
    success: 200,
    writes: false,
    arrange: async () => ({ path: `/api-keys/${standingKeyOfSelf.id}` }),
    check: (res) => assert.equal(res.body.id, standingKeyOfSelf.id),
  },
  {
    method: 'DELETE',
    template: '/api-keys/{id}',
    scope: 'api_keys:write',
    who: 'owner',
    success: 204,
    writes: true,
    arrange: async () => ({
      path: `/api-keys/${(await plantKey(api, actors.self.id, ['users:read'], 'to delete')).id}`,
    }),
  },
]

interface Expected {
  status: number
  code?: string
  /** The scope named in the insufficient_scope challenge. */
  scope?: string
}

/** The contract, written out once: what a caller with a credential may expect from an endpoint. */
function expected(endpoint: Endpoint, actor: ActorKind, role: Role, credential: CredentialKind): Expected {
  if (endpoint.who === 'public') return { status: endpoint.success }
  if (credential === 'none') return { status: 401, code: 'unauthorized' }
  const { scope } = endpoint
  // Effective scopes are the role's allowed scopes ∩ the credential's; the matrix's
  // JWTs, tokens and "with" keys carry the scope, the "without" keys everything else.
  if (scope && (credential === 'API key without the scope' || !roleScopes[role].includes(scope))) {
    return { status: 403, code: 'insufficient_scope', scope }
  }
  const key = credential === 'API key with the scope'
  if (key && (endpoint.interactive === 'always' || (endpoint.interactive === 'self' && actor === 'self')))
    return { status: 403, code: 'forbidden' }
  if (role !== 'admin' && actor === 'other') {
    if (endpoint.who === 'admin-or-self') return { status: 403, code: 'forbidden' }
    if (endpoint.who === 'owner') return { status: 404, code: 'not_found' }
  }
  if (role !== 'admin' && endpoint.who === 'admin') return { status: 403, code: 'forbidden' }
  return { status: endpoint.success }
}

/** The headers that present a credential of this kind for this actor. */
async function credentialHeaders(
  actor: Actor,
  credential: CredentialKind,
  scope: Scope | null,
): Promise<Record<string, string>> {
  switch (credential) {
    case 'none':
      return {}
    case 'JWT':
      return { authorization: `Bearer ${api.jwtFor(actor.id, actor.role)}` }
    case 'opaque token':
      return { authorization: `Bearer ${await opaqueToken(api, actor)}` }
    case 'API key with the scope':
      // A key may present itself either way; the matrix uses X-API-Key for these...
      return { 'x-api-key': await cachedKey(api, actor, [scope ?? 'users:read']) }
    case 'API key without the scope': {
      // ...and Authorization: Bearer for keys that hold every scope of the role but the one needed.
      const scopes = roleScopes[actor.role].filter((s) => s !== scope)
      return { authorization: `Bearer ${await cachedKey(api, actor, scopes)}` }
    }
  }
}

describe('the authorization matrix: endpoint × credential × caller', () => {
  for (const endpoint of endpoints) {
    describe(`${endpoint.method} ${endpoint.template}`, () => {
      for (const actorKind of Object.keys(actors) as ActorKind[]) {
        for (const credential of credentialKinds) {
          // Without a credential there is no caller to vary: one anonymous case per endpoint.
          if (credential === 'none' && actorKind !== 'admin') continue
          const role = actors[actorKind].role
          const want = expected(endpoint, actorKind, role, credential)
          const outcome = want.code ? `${want.status} ${want.code}` : `${want.status}`
          const caller = credential === 'none' ? 'anonymous' : `${actorKind} (${role})`
          test(`${caller} with ${credentialLabels[credential]} → ${outcome}`, async () => {
            const arranged = await endpoint.arrange()
            const actor = actorKind === 'self' && arranged.self ? arranged.self : actors[actorKind]
            const headers = await credentialHeaders(actor, credential, endpoint.scope)
            const before = await snapshot(api)
            const res = await api.request(endpoint.method, arranged.path, { body: arranged.body, headers, auth: null })
            const after = await snapshot(api)
            if (want.code) {
              assertRefused(res, want.status, want.code, want.scope)
              assert.equal(after, before, 'a refused request changed the database')
            } else {
              assert.equal(res.status, want.status, res.text)
              endpoint.check?.(res, actor, credential)
              if (endpoint.writes) assert.notEqual(after, before, 'an allowed write changed nothing')
              else assert.equal(after, before, 'a read changed the database')
            }
          })
        }
      }
    })
  }
})

// ---------------------------------------------------------------------------
// Other users' ids, existing or not

const [{ maxUserId }] = await api.sql<[{ maxUserId: string }]>`SELECT max(id)::text AS "maxUserId" FROM users`

describe("a non-admin and another user's id", () => {
  const missing = String(BigInt(maxUserId) + 100_000n)
  const requests: Array<[string, Record<string, unknown> | undefined]> = [
    ['GET', undefined],
    ['PUT', { name: 'Taken Over', email: 'taken.over@example.com' }],
    ['PATCH', { name: 'Taken Over' }],
    ['DELETE', undefined],
  ]

  for (const [method, body] of requests) {
    test(
      `${method} /users/{id} answers 403 forbidden alike for an existing and a nonexistent id, and changes ` +
        `nothing`,
      async () => {
        const token = api.jwtFor(actors.other.id, 'user')
        const before = await snapshot(api)
        const existing = await api.request(method, `/users/${actors.self.id}`, { body, auth: token })
        const absent = await api.request(method, `/users/${missing}`, { body, auth: token })
        assertRefused(existing, 403, 'forbidden')
        assertRefused(absent, 403, 'forbidden')
        assert.equal(absent.body.detail, existing.body.detail, 'the answers tell the two apart')
        assert.equal(await snapshot(api), before)
      },
    )
  }

  test('an admin asking for a nonexistent id gets 404 not_found', async () => {
    for (const [method, body] of requests) {
      assertProblem(await api.request(method, `/users/${missing}`, { body }), 404, 'not_found')
    }
  })

  test("a non-admin's other ids (another user, an admin) are forbidden too, with every credential kind", async () => {
    for (const credential of ['JWT', 'opaque token', 'API key with the scope'] as const) {
      const headers = await credentialHeaders(actors.self, credential, 'users:read')
      for (const id of [actors.other.id, actors.admin.id, api.admin.id]) {
        assertRefused(await api.request('GET', `/users/${id}`, { headers, auth: null }), 403, 'forbidden')
      }
    }
  })
})

// ---------------------------------------------------------------------------
// A non-admin and the role member

describe('a non-admin and the role member', () => {
  const self = actors.self
  const cases: Array<{ label: string; method: 'PUT' | 'PATCH'; body: () => Record<string, unknown>; status: number }> =
    [
      {
        label: 'PUT with role admin',
        method: 'PUT',
        body: () => ({ name: 'Self', email: self.email, role: 'admin' }),
        status: 403,
      },
      {
        label: 'PUT with role admin and a new name',
        method: 'PUT',
        body: () => ({ name: unique('Sneaky'), email: self.email, role: 'admin' }),
        status: 403,
      },
      {
        label: 'PUT with role admin and a new e-mail',
        method: 'PUT',
        body: () => ({ name: 'Self', email: `${unique('sneaky')}@example.com`, role: 'admin' }),
        status: 403,
      },
      { label: 'PATCH with role admin', method: 'PATCH', body: () => ({ role: 'admin' }), status: 403 },
      {
        label: 'PATCH with role admin and a new name',
        method: 'PATCH',
        body: () => ({ role: 'admin', name: unique('Sneaky') }),
        status: 403,
      },
      {
        label: 'PUT echoing its own role user',
        method: 'PUT',
        body: () => ({ name: unique('Echo'), email: self.email, role: 'user' }),
        status: 200,
      },
      { label: 'PATCH echoing its own role user', method: 'PATCH', body: () => ({ role: 'user' }), status: 200 },
    ]

  for (const credential of ['JWT', 'opaque token', 'API key with the scope'] as const) {
    for (const c of cases) {
      const outcome = c.status === 403 ? '403 forbidden and nothing changes' : `${c.status}, still a user`
      test(`${c.label} on itself with ${credentialLabels[credential]} → ${outcome}`, async () => {
        const headers = await credentialHeaders(self, credential, 'users:write')
        const before = await snapshot(api)
        const res = await api.request(c.method, `/users/${self.id}`, { body: c.body(), headers, auth: null })
        if (c.status === 403) {
          assertRefused(res, 403, 'forbidden')
          assert.equal(await snapshot(api), before)
        } else {
          assert.equal(res.status, c.status, res.text)
          assert.equal(res.body.role, 'user')
        }
        const [row] = await api.sql<Array<{ role: string }>>`SELECT role FROM users WHERE id = ${self.id}`
        assert.equal(row!.role, 'user')
      })
    }
  }

  test('setting role user on itself changes no version (nothing to change)', async () => {
    const [before] = await api.sql<Array<{ version: number }>>`SELECT version FROM users WHERE id = ${self.id}`
    const res = await api.request('PATCH', `/users/${self.id}`, {
      body: { role: 'user' },
      auth: api.jwtFor(self.id, 'user'),
    })
    assert.equal(res.status, 200, res.text)
    const [after] = await api.sql<Array<{ version: number }>>`SELECT version FROM users WHERE id = ${self.id}`
    assert.equal(after!.version, before!.version)
  })

  test('an admin may set a role (the refusal is about the caller, not the member)', async () => {
    const target = await api.createUser()
    const res = await api.request('PATCH', `/users/${target.id}`, {
      body: { role: 'admin' },
      auth: await api.loginJwtFor(actors.admin.id, 'admin'),
    })
    assert.equal(res.status, 200, res.text)
    assert.equal(res.body.role, 'admin')
    await api.sql`UPDATE users SET role = 'user' WHERE id = ${target.id}`
  })
})

// ---------------------------------------------------------------------------
// Roles and scopes seen through the credential

describe('effective scopes: the role allows, the credential narrows', () => {
  test('a key holding products:write does not let a user write products (the role does not allow it)', async () => {
    const { key } = await plantKey(api, actors.self.id, ['products:write', 'products:read'])
    const before = await snapshot(api)
    const res = await api.request('POST', '/products', {
      body: validProduct(),
      headers: { 'x-api-key': key },
      auth: null,
    })
    assertRefused(res, 403, 'insufficient_scope', 'products:write')
    assert.equal(await snapshot(api), before)
    const me = await api.request('GET', '/auth/me', { headers: { 'x-api-key': key }, auth: null })
    assert.deepEqual(me.body.credential.scopes, ['products:read'])
  })

  test("a demoted admin's opaque token and API key lose admin powers at once", async () => {
    const former = await newActor(api, 'admin')
    const token = await opaqueToken(api, former)
    const { key } = await plantKey(api, former.id, ['users:read', 'products:write'])
    for (const headers of [{ authorization: `Bearer ${token}` }, { 'x-api-key': key }] as Array<
      Record<string, string>
    >) {
      assert.equal((await api.request('GET', '/users', { headers, auth: null })).status, 200)
    }
    await api.sql`UPDATE users SET role = 'user' WHERE id = ${former.id}`
    // Changed in SQL, not through the API: the key cache hears of it by a notification, a moment after the commit.
    await api.deps.credentialChanges.caughtUp()
    for (const headers of [{ authorization: `Bearer ${token}` }, { 'x-api-key': key }] as Array<
      Record<string, string>
    >) {
      assertRefused(await api.request('GET', '/users', { headers, auth: null }), 403, 'forbidden')
    }
    const before = await snapshot(api)
    assertRefused(
      await api.request('POST', '/products', { body: validProduct(), headers: { 'x-api-key': key }, auth: null }),
      403,
      'insufficient_scope',
      'products:write',
    )
    assertRefused(
      await api.request('POST', '/products', { body: validProduct(), auth: token }),
      403,
      'insufficient_scope',
      'products:write',
    )
    assert.equal(await snapshot(api), before)
  })

  const narrowed: Array<[string, Scope[], string, string, Scope]> = [
    ['a users:read JWT cannot write itself', ['users:read'], 'PATCH', 'self', 'users:write'],
    ['a users:write JWT cannot read itself', ['users:write'], 'GET', 'self', 'users:read'],
    ['an api_keys:read JWT cannot create keys', ['api_keys:read'], 'POST', '/api-keys', 'api_keys:write'],
    ['a products:read admin JWT cannot list users', ['products:read'], 'GET', '/users', 'users:read'],
    ['a users:read admin JWT cannot create products', ['users:read'], 'POST', '/products', 'products:write'],
  ]
  for (const [label, scopes, method, where, needed] of narrowed) {
    test(`${label}: 403 insufficient_scope naming ${needed}`, async () => {
      const admin = where === '/users' || where === '/products'
      const actor = admin ? actors.admin : actors.self
      const token = api.jwtFor(actor.id, actor.role, scopes)
      const path = where === 'self' ? `/users/${actor.id}` : where
      const body =
        method === 'GET'
          ? undefined
          : where === '/products'
            ? validProduct()
            : where === '/api-keys'
              ? { name: 'k', scopes: ['api_keys:read'] }
              : { name: 'Narrowed' }
      const before = await snapshot(api)
      assertRefused(await api.request(method, path, { body, auth: token }), 403, 'insufficient_scope', needed)
      assert.equal(await snapshot(api), before)
    })
  }

  test('a JWT whose scope claim names no known scope may still call /auth/me, and nothing else', async () => {
    const token = api.jwtFor(actors.self.id, 'user', ['nonsense'])
    const me = await api.request('GET', '/auth/me', { auth: token })
    assert.equal(me.status, 200, me.text)
    assert.deepEqual(me.body.credential.scopes, [])
    assertRefused(
      await api.request('GET', `/users/${actors.self.id}`, { auth: token }),
      403,
      'insufficient_scope',
      'users:read',
    )
  })

  test('public endpoints ignore a credential, even a broken one', async () => {
    for (const path of ['/healthz', '/readyz']) {
      const res = await api.request('GET', path, { auth: 'not-a-real-token' })
      assert.equal(res.status, 200, res.text)
    }
  })

  test('an invalid credential is 401 invalid_token, not treated as anonymous', async () => {
    for (const auth of ['garbage', `upa_ak_${'A'.repeat(43)}`, `upa_at_${'A'.repeat(43)}`]) {
      const res = await api.request('GET', '/products', { auth })
      assertProblem(res, 401, 'invalid_token')
      assert.equal(res.headers.get('www-authenticate'), `${REALM}, error="invalid_token"`)
    }
  })
})

// ---------------------------------------------------------------------------
// Self sign-up

describe('POST /users and ALLOW_SIGNUP', () => {
  const userCount = async (server: TestServer) =>
    (await server.sql<[{ n: number }]>`SELECT count(*)::int AS n FROM users`)[0].n

  test('by default (ALLOW_SIGNUP unset) an anonymous POST /users is 401 unauthorized and inserts nothing', async () => {
    const email = `${unique('anon')}@example.com`
    const before = await snapshot(api)
    const res = await api.request('POST', '/users', { body: { name: 'Anonymous', email }, auth: null })
    assertRefused(res, 401, 'unauthorized')
    assert.equal(await snapshot(api), before)
  })

  describe('with ALLOW_SIGNUP=true', async () => {
    const open = await startServer({ ALLOW_SIGNUP: 'true' })

    test('an anonymous POST /users creates a plain user: 201, role user, and the row', async () => {
      const before = await userCount(open)
      const email = `${unique('signup')}@example.com`
      const res = await open.request('POST', '/users', {
        body: { name: 'Signed Up', email, password: 'a good long password' },
        auth: null,
      })
      assert.equal(res.status, 201, res.text)
      assert.equal(res.body.role, 'user')
      assert.equal(await userCount(open), before + 1)
      const [row] = await open.sql<
        Array<{ role: string; email: string; password_hash: string | null }>
      >`SELECT role, email, password_hash FROM users WHERE id = ${res.body.id}`
      assert.equal(row!.role, 'user')
      assert.equal(row!.email, email)
      assert.match(row!.password_hash ?? '', /^scrypt\$/)
    })

    test('an anonymous POST /users with role user explicitly is 201', async () => {
      const res = await open.request('POST', '/users', {
        body: { name: 'Explicit', email: `${unique('signup')}@example.com`, role: 'user' },
        auth: null,
      })
      assert.equal(res.status, 201, res.text)
      assert.equal(res.body.role, 'user')
    })

    test('an anonymous POST /users with role admin is 403 forbidden and inserts nothing', async () => {
      const email = `${unique('climber')}@example.com`
      const before = await snapshot(open)
      const res = await open.request('POST', '/users', { body: { name: 'Climber', email, role: 'admin' }, auth: null })
      assertRefused(res, 403, 'forbidden')
      assert.equal(await snapshot(open), before)
    })

    test(
      'a non-admin with a credential POSTing /users is 403 forbidden, with or without a role, and inserts ' + 'nothing',
      async () => {
        const user = await open.createUser()
        const key = (await plantKey(open, user.id, ['users:write'])).key
        for (const headers of [{ authorization: `Bearer ${user.token}` }, { 'x-api-key': key }] as Array<
          Record<string, string>
        >) {
          for (const role of [undefined, 'user', 'admin']) {
            const before = await snapshot(open)
            const res = await open.request('POST', '/users', {
              body: { name: 'Via User', email: `${unique('via')}@example.com`, role },
              headers,
              auth: null,
            })
            assertRefused(res, 403, 'forbidden')
            assert.equal(await snapshot(open), before)
          }
        }
      },
    )

    test('an invalid credential is 401 invalid_token even where anonymous callers are admitted', async () => {
      const before = await snapshot(open)
      const res = await open.request('POST', '/users', {
        body: { name: 'Broken', email: `${unique('broken')}@example.com` },
        auth: 'garbage',
      })
      assertProblem(res, 401, 'invalid_token')
      assert.equal(await snapshot(open), before)
    })

    test('an admin may still create an admin', async () => {
      const res = await open.request('POST', '/users', {
        body: { name: 'Second Admin', email: `${unique('admin')}@example.com`, role: 'admin' },
      })
      assert.equal(res.status, 201, res.text)
      assert.equal(res.body.role, 'admin')
    })

    test('sign-up opens POST /users only: anonymous GET /users and GET /users/{id} stay 401', async () => {
      assertRefused(await open.request('GET', '/users', { auth: null }), 401, 'unauthorized')
      assertRefused(await open.request('GET', `/users/${open.admin.id}`, { auth: null }), 401, 'unauthorized')
    })
  })
})
