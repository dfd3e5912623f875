import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { describe, test } from 'node:test'
import { testPasswords } from './helpers/passwords.js'
import { applicationRegistry } from './helpers/registry.js'
import { startServer, type TestResponse } from './helpers/server.js'

// API keys: creation (what is returned, what is stored), use (both headers,
// last_used_at), expiry and deletion taking effect at once, the limits on a
// key's scopes, listing (own keys only, paging and filters through the shared
// collection mechanism), hostile bodies, and keys and sessions going with
// their user.
//
// Top-level tests run one after another (node:test's default).

const api = await startServer()
const { sql } = api

// ---------------------------------------------------------------------------
// Helpers

const RFC3339_MS_UTC = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/
const KEY_SHAPE = /^upa_ak_[A-Za-z0-9_-]{43}$/
const KEY_MEMBERS = ['created_at', 'expires_at', 'id', 'last_used_at', 'name', 'prefix', 'scopes', 'user_id']
const REALM = 'Bearer realm="api"'

let sequence = 0
const unique = (tag: string) => `${tag}-${process.pid}-${++sequence}`

interface KeyRow {
  id: number
  user_id: number
  name: string
  prefix: string
  key_hash: Buffer
  scopes: string[]
  created_at: string
  expires_at: string | null
  last_used_at: string | null
}

const keyRow = async (id: number): Promise<KeyRow | undefined> =>
  (await sql<KeyRow[]>`SELECT * FROM api_keys WHERE id = ${id}`)[0]
const keyCount = async (): Promise<number> => (await sql<[{ n: number }]>`SELECT count(*)::int AS n FROM api_keys`)[0].n

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/)
  assert.equal(res.body.code, code, res.text)
}

function assertValidation(res: TestResponse, path: string): void {
  assertProblem(res, 422, 'validation_failed')
  assert.ok(
    res.body.errors.some((e: { path: string }) => e.path === path),
    `expected an error at ${path}, got ${JSON.stringify(res.body.errors)}`,
  )
}

function assertInvalidToken(res: TestResponse): void {
  assertProblem(res, 401, 'invalid_token')
  assert.equal(res.headers.get('www-authenticate'), `${REALM}, error="invalid_token"`)
}

/** Creates a key through the API with the given credential (default: the file's admin). */
async function createKey(
  body: Record<string, unknown>,
  auth?: string,
): Promise<TestResponse & { key: string; id: number }> {
  const res = await api.request('POST', '/api-keys', {
    body: { name: unique('key'), scopes: ['users:read'], ...body },
    auth,
  })
  assert.equal(res.status, 201, res.text)
  return Object.assign(res, { key: res.body.key as string, id: res.body.id as number })
}

const me = (headers: Record<string, string>) => api.request('GET', '/auth/me', { headers, auth: null })

/** The random part of a key (what must never be stored). */
const secretOf = (key: string) => key.slice('upa_ak_'.length)

/** Every row of every table of this file's database, as text (bytea as hex). */
async function databaseText(): Promise<string> {
  const tables = await sql<Array<{ name: string }>>`SELECT tablename AS name FROM pg_tables WHERE schemaname = 'public'`
  assert.ok(tables.some((t) => t.name === 'api_keys'))
  let text = ''
  for (const { name } of tables) {
    const [{ dump }] = await sql<
      [{ dump: string }]
    >`SELECT coalesce(string_agg(t::text, '|'), '') AS dump FROM ${sql(name)} t`
    text += dump
  }
  return text
}

// ---------------------------------------------------------------------------
// Creation

describe('POST /api-keys', () => {
  test('answers 201 with the key once, its metadata, Location and no-store', async () => {
    const user = await api.createUser({ session: true })
    const name = unique('Deploy key')
    const res = await api.request('POST', '/api-keys', {
      body: { name, scopes: ['users:read', 'api_keys:read'] },
      auth: user.token,
    })
    assert.equal(res.status, 201, res.text)
    assert.deepEqual(Object.keys(res.body).sort(), [...KEY_MEMBERS, 'key'].sort())
    assert.match(res.body.key, KEY_SHAPE)
    assert.equal(res.body.prefix, res.body.key.slice(0, 'upa_ak_'.length + 6))
    assert.equal(res.body.name, name)
    assert.deepEqual(res.body.scopes, ['users:read', 'api_keys:read'])
    assert.equal(res.body.user_id, user.id)
    assert.equal(res.body.expires_at, null)
    assert.equal(res.body.last_used_at, null)
    assert.match(res.body.created_at, RFC3339_MS_UTC)
    assert.equal(res.headers.get('location'), `/api-keys/${res.body.id}`)
    assert.equal(res.headers.get('cache-control'), 'no-store')

    const row = await keyRow(res.body.id)
    assert.ok(row)
    assert.equal(Number(row.user_id), user.id)
    assert.equal(row.created_at, res.body.created_at)
  })

  test('stores only the SHA-256 of the key: the key appears nowhere in the table', async () => {
    const { key, id } = await createKey({})
    const row = (await keyRow(id))!
    assert.deepEqual(row.key_hash, createHash('sha256').update(key).digest())
    assert.notEqual(row.key_hash.toString('utf8'), key)
    const dump = await databaseText()
    assert.ok(dump.includes(row.prefix), 'the search sees the api_keys rows')
    assert.ok(!dump.includes(secretOf(key)), 'the key is stored in clear')
    assert.ok(!dump.includes(Buffer.from(key).toString('hex')), 'the key is stored as its bytes')
    // The prefix shown (13 characters) is not enough to rebuild the key.
    assert.ok(row.prefix.length < key.length / 3)
  })

  test('with an Idempotency-Key, too, the key is stored nowhere in clear', async () => {
    const res = await api.request('POST', '/api-keys', {
      body: { name: unique('idempotent'), scopes: ['users:read'] },
      headers: { 'idempotency-key': unique('idem') },
    })
    assert.equal(res.status, 201, res.text)
    assert.ok(!(await databaseText()).includes(secretOf(res.body.key)), 'the key is stored in clear')
  })

  test('an expires_at in the future is stored and returned', async () => {
    const expires = new Date(Date.now() + 86_400_000)
    const res = await createKey({ expires_at: expires.toISOString() })
    assert.equal(res.body.expires_at, expires.toISOString())
    assert.equal((await keyRow(res.id))!.expires_at, expires.toISOString())
    assert.equal((await me({ 'x-api-key': res.key })).status, 200, 'a key before its expiry works')
  })

  test('expires_at null means no expiry', async () => {
    const res = await createKey({ expires_at: null })
    assert.equal(res.body.expires_at, null)
  })

  test('an admin may give a key every scope it holds, however many the resources declare', async () => {
    const every = [...applicationRegistry.scopes.byRole.admin]
    assert.ok(every.length > 6, `${every.length} scopes`)
    const res = await createKey({ scopes: every })
    assert.deepEqual([...res.body.scopes].sort(), [...every].sort())
    const seen = await me({ 'x-api-key': res.key })
    assert.equal(seen.status, 200)
    assert.deepEqual([...seen.body.credential.scopes].sort(), [...every].sort())
  })

  // A key can never do more than the credential that creates it.
  const beyond: Array<{ label: string; credential: () => Promise<string>; scopes: string[]; missing: string }> = [
    {
      label: 'a user creating products:write',
      credential: async () => (await api.createUser({ session: true })).token,
      scopes: ['products:write'],
      missing: 'products:write',
    },
    {
      label: 'a user creating users:read and products:write',
      credential: async () => (await api.createUser({ session: true })).token,
      scopes: ['users:read', 'products:write'],
      missing: 'products:write',
    },
    {
      label: 'a JWT narrowed to api_keys:write creating users:read',
      credential: async () => api.loginJwtFor((await api.createUser()).id, 'user', ['api_keys:write']),
      scopes: ['users:read'],
      missing: 'users:read',
    },
    {
      label:
        'an admin JWT narrowed to api_keys:write and users:read creating users:read, products:write and products:read',
      credential: async () => api.loginJwtFor(api.admin.id, 'admin', ['api_keys:write', 'users:read']),
      scopes: ['users:read', 'products:write', 'products:read'],
      missing: 'products:write products:read',
    },
  ]
  for (const c of beyond) {
    test(`scopes beyond the creator's are refused: ${c.label} → 403 insufficient_scope, no row`, async () => {
      const credential = await c.credential()
      const before = await keyCount()
      const res = await api.request('POST', '/api-keys', {
        body: { name: 'Too much', scopes: c.scopes },
        auth: credential,
      })
      assertProblem(res, 403, 'insufficient_scope')
      assert.equal(res.headers.get('www-authenticate'), `${REALM}, error="insufficient_scope", scope="${c.missing}"`)
      assert.equal(await keyCount(), before)
    })
  }

  test(
    'a key never creates a key, whatever its scopes: 403 forbidden, no row (test/reauth.test.ts has the ' + 'rest)',
    async () => {
      const parent = await createKey({ scopes: ['api_keys:write', 'products:read'] })
      const before = await keyCount()
      const res = await api.request('POST', '/api-keys', {
        body: { name: 'Child', scopes: ['products:read'] },
        headers: { 'x-api-key': parent.key },
        auth: null,
      })
      assertProblem(res, 403, 'forbidden')
      assert.equal(await keyCount(), before)
    },
  )

  const invalid: Array<{ label: string; body: Record<string, unknown>; path: string }> = [
    { label: 'an unknown scope', body: { scopes: ['users:read', 'users:delete'] }, path: '/scopes/1' },
    { label: 'a scope in the wrong case', body: { scopes: ['USERS:READ'] }, path: '/scopes/0' },
    {
      label: 'expires_at in the past',
      body: { expires_at: new Date(Date.now() - 60_000).toISOString() },
      path: '/expires_at',
    },
    { label: 'expires_at that is not a timestamp', body: { expires_at: 'tomorrow' }, path: '/expires_at' },
    { label: 'expires_at as a number', body: { expires_at: Date.now() + 60_000 }, path: '/expires_at' },
    // RFC 3339 all three, but no instant a timestamp holds: a leap second, year 10000 once in UTC, a zone suffix.
    { label: 'expires_at on a leap second', body: { expires_at: '2030-06-30T23:59:60Z' }, path: '/expires_at' },
    {
      label: 'expires_at past year 9999 in UTC',
      body: { expires_at: '9999-12-31T23:59:59-23:59' },
      path: '/expires_at',
    },
    {
      label: 'expires_at with an RFC 9557 zone suffix',
      body: { expires_at: '2030-01-01T00:00:00Z[Europe/Paris]' },
      path: '/expires_at',
    },
  ]
  for (const c of invalid) {
    test(`${c.label} → 422 naming ${c.path}, no row`, async () => {
      const before = await keyCount()
      const res = await api.request('POST', '/api-keys', {
        body: { name: 'Invalid', scopes: ['users:read'], ...c.body },
      })
      assertValidation(res, c.path)
      assert.equal(await keyCount(), before)
    })
  }
})

// ---------------------------------------------------------------------------
// Use

describe('using a key', () => {
  test('works as X-API-Key and as Authorization: Bearer, as its user with its scopes', async () => {
    const user = await api.createUser({ session: true })
    const { key } = await createKey({ scopes: ['users:read', 'products:read'] }, user.token)
    for (const headers of [{ 'x-api-key': key }, { authorization: `Bearer ${key}` }] as Array<Record<string, string>>) {
      const res = await me(headers)
      assert.equal(res.status, 200, res.text)
      assert.equal(res.body.user.id, user.id)
      assert.equal(res.body.credential.type, 'api_key')
      assert.deepEqual(res.body.credential.scopes, ['products:read', 'users:read'])
      assert.equal((await api.request('GET', `/users/${user.id}`, { headers, auth: null })).status, 200)
    }
  })

  test('sets last_used_at on use', async () => {
    const res = await createKey({})
    assert.equal((await keyRow(res.id))!.last_used_at, null)
    const started = Date.now()
    assert.equal((await me({ 'x-api-key': res.key })).status, 200)
    const used = (await keyRow(res.id))!.last_used_at
    assert.ok(used, 'last_used_at is set')
    assert.ok(Math.abs(Date.parse(used) - started) < 5_000, `last_used_at ${used} is not now`)
    const got = await api.request('GET', `/api-keys/${res.id}`)
    assert.equal(got.body.last_used_at, used)
  })

  test('an expired key is refused at once: 401 invalid_token', async () => {
    const { key, id } = await createKey({ expires_at: new Date(Date.now() + 3_600_000).toISOString() })
    assert.equal((await me({ 'x-api-key': key })).status, 200)
    await sql`UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE id = ${id}`
    // A change made in SQL, not through the API, reaches the instance's
    // key cache by a notification, a moment after the commit.
    await api.deps.credentialChanges.caughtUp()
    assertInvalidToken(await me({ 'x-api-key': key }))
    assertInvalidToken(await me({ authorization: `Bearer ${key}` }))
  })

  test('DELETE answers 204, and the key is refused at once', async () => {
    const user = await api.createUser({ session: true })
    const { key, id } = await createKey({ scopes: ['api_keys:write', 'api_keys:read'] }, user.token)
    assert.equal((await me({ 'x-api-key': key })).status, 200)
    const res = await api.request('DELETE', `/api-keys/${id}`, { auth: user.token })
    assert.equal(res.status, 204, res.text)
    assert.equal(await keyRow(id), undefined)
    assertInvalidToken(await me({ 'x-api-key': key }))
    assertInvalidToken(await me({ authorization: `Bearer ${key}` }))
    assertProblem(await api.request('GET', `/api-keys/${id}`, { auth: user.token }), 404, 'not_found')
    assertProblem(await api.request('DELETE', `/api-keys/${id}`, { auth: user.token }), 404, 'not_found')
  })

  test('a key may delete itself, and is refused from then on', async () => {
    const { key, id } = await createKey({ scopes: ['api_keys:write'] })
    const res = await api.request('DELETE', `/api-keys/${id}`, { headers: { 'x-api-key': key }, auth: null })
    assert.equal(res.status, 204, res.text)
    assertInvalidToken(await me({ 'x-api-key': key }))
  })

  test('a key that differs in one character, or is cut short, is 401 invalid_token', async () => {
    const { key } = await createKey({})
    const last = key.at(-1) === 'A' ? 'B' : 'A'
    for (const wrong of [key.slice(0, -1) + last, key.slice(0, -1), `${key}A`, key.toUpperCase()]) {
      assertInvalidToken(await me({ 'x-api-key': wrong }))
    }
  })
})

// ---------------------------------------------------------------------------
// Reading and listing

describe('GET /api-keys and /api-keys/{id}', async () => {
  const owner = await api.createUser({ session: true })
  const stranger = await api.createUser({ session: true })
  const ownKeys: Array<{ id: number; key: string; name: string }> = []
  for (const name of ['alpha', 'bravo', 'charlie', 'delta']) {
    const res = await createKey({ name: `${name}-${owner.id}`, scopes: ['users:read'] }, owner.token)
    ownKeys.push({ id: res.id, key: res.key, name: res.body.name })
  }
  const strangerKey = await createKey({ name: `stranger-${stranger.id}` }, stranger.token)

  test('never include the secret: no key member, and neither the key nor its hash in the text', async () => {
    const { key, id } = ownKeys[0]!
    const hashHex = createHash('sha256').update(key).digest('hex')
    for (const path of [`/api-keys/${id}`, '/api-keys?limit=200', `/api-keys?user_id=${owner.id}`]) {
      for (const auth of [owner.token, api.admin.token]) {
        const res = await api.request('GET', path, { auth })
        assert.equal(res.status, 200, res.text)
        for (const item of Array.isArray(res.body) ? res.body : [res.body])
          assert.deepEqual(Object.keys(item).sort(), KEY_MEMBERS)
        assert.ok(!res.text.includes(key.slice('upa_ak_'.length)), `${path} shows the key`)
        assert.ok(!res.text.includes(hashHex), `${path} shows the hash`)
        assert.ok(!/key_hash/.test(res.text))
      }
    }
  })

  test('a user sees only its own keys, and X-Total-Count counts only those', async () => {
    const res = await api.request('GET', '/api-keys?count=true&limit=200', { auth: owner.token })
    assert.equal(res.status, 200, res.text)
    assert.deepEqual(
      res.body.map((k: { id: number }) => k.id),
      ownKeys.map((k) => k.id),
    )
    assert.equal(res.headers.get('x-total-count'), String(ownKeys.length))
  })

  test('?user_id=<another user> is 403 forbidden for a user; ?user_id=<itself> works', async () => {
    assertProblem(await api.request('GET', `/api-keys?user_id=${stranger.id}`, { auth: owner.token }), 403, 'forbidden')
    assertProblem(
      await api.request('GET', `/api-keys?user_id=${api.admin.id}`, { auth: owner.token }),
      403,
      'forbidden',
    )
    const own = await api.request('GET', `/api-keys?user_id=${owner.id}`, { auth: owner.token })
    assert.equal(own.status, 200, own.text)
    assert.equal(own.body.length, ownKeys.length)
  })

  test("filter operators on user_id do not reach another user's keys", async () => {
    for (const query of [
      `user_id[in]=${stranger.id},${owner.id}`,
      `user_id[ne]=${owner.id}`,
      `user_id[gte]=1`,
      `q=stranger`,
      `name=stranger-${stranger.id}`,
    ]) {
      const res = await api.request('GET', `/api-keys?${query}&limit=200`, { auth: owner.token })
      assert.equal(res.status, 200, `${query}: ${res.text}`)
      for (const k of res.body) assert.equal(k.user_id, owner.id, `${query} shows a key of user ${k.user_id}`)
    }
  })

  test("an admin sees everyone's keys, and one user's with ?user_id=", async () => {
    const all = await api.request('GET', '/api-keys?limit=200')
    assert.equal(all.status, 200)
    const ids = all.body.map((k: { id: number }) => k.id)
    assert.ok(ids.includes(strangerKey.id) && ids.includes(ownKeys[0]!.id))
    const one = await api.request('GET', `/api-keys?user_id=${stranger.id}`)
    assert.equal(one.status, 200)
    assert.deepEqual(
      one.body.map((k: { id: number }) => k.id),
      [strangerKey.id],
    )
  })

  test('pages with ?limit=1 and Link rel=next through exactly the own keys', async () => {
    const seen: number[] = []
    let path: string | undefined = '/api-keys?limit=1'
    let pages = 0
    while (path) {
      const res = await api.request('GET', path, { auth: owner.token })
      assert.equal(res.status, 200, res.text)
      assert.ok(res.body.length <= 1)
      seen.push(...res.body.map((k: { id: number }) => k.id))
      const link = res.headers.get('link')
      path = link ? /^<([^>]+)>; rel="next"$/.exec(link)![1] : undefined
      if (++pages === 1) assert.ok(link, 'the first page links to the next')
      assert.ok(pages <= ownKeys.length + 1, 'paging does not end')
    }
    assert.deepEqual(
      seen,
      ownKeys.map((k) => k.id),
    )
  })

  test("a cursor from an admin's listing shows a user nothing but its own keys", async () => {
    const adminPage = await api.request('GET', '/api-keys?limit=1')
    const next = /^<([^>]+)>/.exec(adminPage.headers.get('link') ?? '')?.[1]
    assert.ok(next)
    const res = await api.request('GET', next, { auth: owner.token })
    assert.equal(res.status, 200, res.text)
    for (const k of res.body) assert.equal(k.user_id, owner.id)
  })

  test('filters, search, sort and fields work on the own keys', async () => {
    const byName = await api.request('GET', `/api-keys?name=bravo-${owner.id}`, { auth: owner.token })
    assert.deepEqual(
      byName.body.map((k: { id: number }) => k.id),
      [ownKeys[1]!.id],
    )
    const search = await api.request('GET', '/api-keys?q=CHARL', { auth: owner.token })
    assert.deepEqual(
      search.body.map((k: { id: number }) => k.id),
      [ownKeys[2]!.id],
    )
    const sorted = await api.request('GET', '/api-keys?sort=-id', { auth: owner.token })
    assert.deepEqual(
      sorted.body.map((k: { id: number }) => k.id),
      ownKeys.map((k) => k.id).reverse(),
    )
    const fields = await api.request('GET', '/api-keys?fields=id,name&limit=1', { auth: owner.token })
    assert.deepEqual(fields.body, [{ id: ownKeys[0]!.id, name: ownKeys[0]!.name }])
    assertProblem(
      await api.request('GET', '/api-keys?fields=key_hash', { auth: owner.token }),
      400,
      'invalid_parameter',
    )
    assertProblem(await api.request('GET', '/api-keys?sort=key_hash', { auth: owner.token }), 400, 'invalid_parameter')
  })

  test("another user's key is 404 not_found, like a missing one, and DELETE leaves it", async () => {
    const [{ max }] = await sql<[{ max: string }]>`SELECT max(id)::text AS max FROM api_keys`
    const missing = String(BigInt(max) + 1000n)
    for (const method of ['GET', 'DELETE']) {
      const other = await api.request(method, `/api-keys/${strangerKey.id}`, { auth: owner.token })
      const absent = await api.request(method, `/api-keys/${missing}`, { auth: owner.token })
      assertProblem(other, 404, 'not_found')
      assertProblem(absent, 404, 'not_found')
      assert.equal(other.body.detail, absent.body.detail)
    }
    assert.ok(await keyRow(strangerKey.id), 'the key is still there')
    assert.equal((await me({ 'x-api-key': strangerKey.key })).status, 200)
  })

  test("an admin reads and deletes another user's key", async () => {
    const victim = await createKey({}, stranger.token)
    const got = await api.request('GET', `/api-keys/${victim.id}`)
    assert.equal(got.status, 200)
    assert.equal(got.body.user_id, stranger.id)
    assert.equal((await api.request('DELETE', `/api-keys/${victim.id}`)).status, 204)
    assert.equal(await keyRow(victim.id), undefined)
    assertInvalidToken(await me({ 'x-api-key': victim.key }))
  })
})

// ---------------------------------------------------------------------------
// Hostile bodies

describe('hostile bodies are refused with no row', () => {
  const cases: Array<{ label: string; body: unknown; status?: number; code?: string; path?: string }> = [
    { label: 'an unknown member', body: { name: 'k', scopes: ['users:read'], user_id: 1 }, path: '/user_id' },
    {
      label: 'a key member (choosing the secret)',
      body: { name: 'k', scopes: ['users:read'], key: `upa_ak_${'A'.repeat(43)}` },
      path: '/key',
    },
    { label: 'a 201-character name', body: { name: 'n'.repeat(201), scopes: ['users:read'] }, path: '/name' },
    { label: 'an empty name', body: { name: '', scopes: ['users:read'] }, path: '/name' },
    { label: 'a name of spaces', body: { name: '   ', scopes: ['users:read'] }, path: '/name' },
    { label: 'a NUL in the name', body: { name: 'bad\u0000name', scopes: ['users:read'] }, path: '/name' },
    { label: 'a NUL in a scope', body: { name: 'k', scopes: ['users:read\u0000'] } },
    { label: 'scopes as a string', body: { name: 'k', scopes: 'users:read' }, path: '/scopes' },
    { label: 'scopes as an object', body: { name: 'k', scopes: { 0: 'users:read' } }, path: '/scopes' },
    { label: 'scopes empty', body: { name: 'k', scopes: [] }, path: '/scopes' },
    {
      label: '100 scopes',
      body: { name: 'k', scopes: Array.from({ length: 100 }, (_, i) => `scope:${i}`) },
      path: '/scopes',
    },
    { label: 'a scope listed twice', body: { name: 'k', scopes: ['users:read', 'users:read'] }, path: '/scopes' },
    { label: 'a scope that is not a string', body: { name: 'k', scopes: [1] }, path: '/scopes/0' },
    { label: 'a huge scope string', body: { name: 'k', scopes: ['x'.repeat(100_000)] }, path: '/scopes/0' },
    { label: 'no scopes', body: { name: 'k' }, path: '/scopes' },
    { label: 'no name', body: { scopes: ['users:read'] }, path: '/name' },
    { label: 'an array body', body: [] },
    { label: 'malformed JSON', body: '{"name":', status: 400, code: 'malformed_json' },
    {
      label: 'a duplicate member',
      body: '{"name":"a","name":"b","scopes":["users:read"]}',
      status: 400,
      code: 'malformed_json',
    },
    {
      label: 'a __proto__ member',
      body: '{"__proto__":{"user_id":1},"name":"a","scopes":["users:read"]}',
      status: 400,
      code: 'malformed_json',
    },
  ]
  for (const c of cases) {
    const outcome = c.status ? `${c.status} ${c.code}` : '422'
    test(`${c.label} → ${outcome}`, async () => {
      const before = await keyCount()
      const res = await api.request('POST', '/api-keys', { body: c.body })
      if (c.status) assertProblem(res, c.status, c.code!)
      else if (c.path) assertValidation(res, c.path)
      else assertProblem(res, 422, 'validation_failed')
      assert.equal(await keyCount(), before)
    })
  }
})

// ---------------------------------------------------------------------------
// Keys and sessions go with their user

describe('deleting a user', async () => {
  const password = 'api-keys-test-password'
  const passwordHash = await testPasswords.hash(password)

  async function userWithCredentials(role: 'admin' | 'user') {
    const user = await api.createUser({ role, passwordHash })
    const logins = []
    for (const token_format of ['jwt', 'opaque']) {
      const res = await api.request('POST', '/auth/login', {
        auth: null,
        body: { email: user.email, password, token_format },
      })
      assert.equal(res.status, 200, res.text)
      logins.push(res.body as { access_token: string; refresh_token: string })
    }
    // With the token of a password login: a key is made by a fresh login.
    const key = await createKey({ scopes: ['users:read'] }, logins[0]!.access_token)
    return { ...user, logins, key }
  }

  const rowsOf = async (userId: number) => {
    const [counts] = await sql<[{ sessions: number; refresh_tokens: number; access_tokens: number; api_keys: number }]>`
      SELECT (SELECT count(*)::int FROM sessions WHERE user_id = ${userId}) AS sessions,
             (SELECT count(*)::int FROM refresh_tokens r JOIN sessions s ON s.id = r.session_id
               WHERE s.user_id = ${userId}) AS refresh_tokens,
             (SELECT count(*)::int FROM access_tokens a JOIN sessions s ON s.id = a.session_id
               WHERE s.user_id = ${userId}) AS access_tokens,
             (SELECT count(*)::int FROM api_keys WHERE user_id = ${userId}) AS api_keys`
    return counts
  }

  test(
    'to the trash: its sessions end and its API keys go, all refused at once; its purge deletes the ' + 'rest',
    async () => {
      const user = await userWithCredentials('user')
      const sessionIds = (await sql<Array<{ id: number }>>`SELECT id FROM sessions WHERE user_id = ${user.id}`).map(
        (r) => r.id,
      )
      assert.deepEqual(await rowsOf(user.id), { sessions: 2, refresh_tokens: 2, access_tokens: 1, api_keys: 1 })
      const opaque = user.logins[1]!.access_token
      assert.equal((await me({ authorization: `Bearer ${opaque}` })).status, 200)

      assert.equal((await api.request('DELETE', `/users/${user.id}`)).status, 204)
      assert.deepEqual(await rowsOf(user.id), { sessions: 2, refresh_tokens: 2, access_tokens: 1, api_keys: 0 })
      const [live] = await sql`
        SELECT count(*)::int AS n FROM sessions WHERE user_id = ${user.id} AND revoked_at IS NULL`
      assert.equal(live!.n, 0)
      assertInvalidToken(await me({ authorization: `Bearer ${opaque}` }))
      assertInvalidToken(await me({ 'x-api-key': user.key.key }))
      for (const { refresh_token } of user.logins) {
        assertInvalidToken(await api.request('POST', '/auth/refresh', { auth: null, body: { refresh_token } }))
      }

      assert.equal((await api.request('DELETE', `/users/${user.id}?permanent=true`)).status, 204)
      assert.deepEqual(await rowsOf(user.id), { sessions: 0, refresh_tokens: 0, access_tokens: 0, api_keys: 0 })
      const [{ n }] = await sql<
        [{ n: number }]
      >`SELECT count(*)::int AS n FROM refresh_tokens WHERE session_id IN ${sql(sessionIds)}`
      assert.equal(n, 0)
    },
  )

  test('a refused deletion (the last admin) leaves its sessions and keys', async () => {
    await sql`UPDATE users SET role = 'user' WHERE role = 'admin' AND id <> ${api.admin.id}`
    const admin = await userWithCredentials('admin')
    await sql`UPDATE users SET role = 'user' WHERE id = ${api.admin.id}`
    try {
      const before = await rowsOf(admin.id)
      const own = { auth: api.jwtFor(admin.id, 'admin'), body: { current_password: password } }
      assertProblem(await api.request('DELETE', `/users/${admin.id}`, own), 409, 'last_admin')
      assert.deepEqual(await rowsOf(admin.id), before)
      assert.equal((await me({ 'x-api-key': admin.key.key })).status, 200)
    } finally {
      await sql`UPDATE users SET role = 'admin' WHERE id = ${api.admin.id}`
      // Its role changed twice: the JWTs issued before are void.
      await api.renewAdminToken()
    }
  })

  test('a JWT that outlived its user cannot create an API key: 401 invalid_token, no row', async () => {
    const user = await api.createUser()
    assert.equal((await api.request('DELETE', `/users/${user.id}`)).status, 204)
    const before = await keyCount()
    const res = await api.request('POST', '/api-keys', {
      body: { name: 'Orphan', scopes: ['users:read'] },
      auth: user.token,
    })
    assertInvalidToken(res)
    assert.equal(await keyCount(), before)
  })
})
