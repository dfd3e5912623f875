import assert from 'node:assert/strict'
import { beforeEach, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import type { UserRow } from '../src/accounts/queries.js'
import { startServer, type TestResponse } from './helpers/server.js'

// The users resource: its contract (members, validation, ETags and
// preconditions, the last-admin rule, concurrency), checked through HTTP and
// against the rows in this file's own database. Auth does not exist yet, so
// every endpoint is called without credentials.
//
// Top-level tests run one after another (node:test's default), so a test may
// rely on the state it arranged; the last-admin tests reset the admins first.

const api = await startServer()
/** The admins of "the last admin" delete themselves, which takes their password: one hash for all (scrypt is slow). */
const ADMIN_PASSWORD = 'users-test-admin-password'
const adminPasswordHash = await api.deps.passwords.hash(ADMIN_PASSWORD)

// ---------------------------------------------------------------------------
// Helpers

const RFC3339_MS_UTC = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/
const SCRYPT_HASH = /^scrypt\$(\d+)\$(\d+)\$(\d+)\$([A-Za-z0-9+/]+={0,2})\$([A-Za-z0-9+/]+={0,2})$/
const USER_MEMBERS = ['created_at', 'email', 'email_verified_at', 'id', 'name', 'role', 'updated_at']
/**
 * A syntactically valid scrypt hash, planted with SQL where a test
 * only needs "some password" (real hashing costs ~100 ms).
 */
const PLANTED_HASH =
  `scrypt$32768$8$3$${Buffer.alloc(16, 1).toString('base64')}` + `$${Buffer.alloc(32, 2).toString('base64')}`

let sequence = 0
const uniqueEmail = (tag = 'user') => `${tag}.${++sequence}@example.com`

/** An e-mail address that matches the pattern and is exactly `length` characters long (length 133..317). */
function emailOfLength(length: number, tag = 'long'): string {
  const local = (tag + ++sequence).padEnd(64, 'l')
  const domain = `${'a'.repeat(63)}.${'b'.repeat(63)}.${'c'.repeat(length - 64 - 1 - 63 - 1 - 63 - 1 - 4)}.com`
  const email = `${local}@${domain}`
  assert.equal(email.length, length)
  return email
}

/** Every password this file sends; none may ever appear in a log line. */
const passwordsSent = new Set<string>()
const password = (tag: string, length = 16) => {
  const value = `pw-${tag}-${++sequence}-`.padEnd(length, 'x').slice(0, length)
  passwordsSent.add(value)
  return value
}

interface NewUser {
  name?: string
  email?: string
  role?: 'admin' | 'user'
  password?: string
}

async function createUser(fields: NewUser = {}): Promise<{ id: number; etag: string; body: Record<string, unknown> }> {
  const res = await api.request('POST', '/users', { body: { name: 'Test User', email: uniqueEmail(), ...fields } })
  assert.equal(res.status, 201, res.text)
  return { id: res.body.id, etag: res.headers.get('etag')!, body: res.body }
}

// Live rows: a deleted user waits in the trash (test/trash-users.test.ts).
async function dbRow(id: number): Promise<UserRow | undefined> {
  const [row] = await api.sql<UserRow[]>`SELECT * FROM users WHERE id = ${id} AND deleted_at IS NULL`
  return row
}

async function mustRow(id: number): Promise<UserRow> {
  const row = await dbRow(id)
  assert.ok(row, `user ${id} should exist`)
  return row
}

async function userCount(): Promise<number> {
  const [{ n }] = await api.sql<[{ n: number }]>`SELECT count(*)::int AS n FROM users WHERE deleted_at IS NULL`
  return n
}

async function adminIds(): Promise<number[]> {
  const rows = await api.sql<
    Array<{ id: number }>
  >`SELECT id FROM users WHERE role = 'admin' AND deleted_at IS NULL ORDER BY id`
  return rows.map((r) => r.id)
}

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/)
  assert.equal(res.body.code, code)
  assert.equal(res.body.status, status)
}

function assertValidation(res: TestResponse, path: string): void {
  assertProblem(res, 422, 'validation_failed')
  assert.ok(Array.isArray(res.body.errors), 'errors[] is present')
  assert.ok(
    res.body.errors.some((e: { path: string }) => e.path === path),
    `expected an error at ${path}, got ${JSON.stringify(res.body.errors)}`,
  )
}

/** The public representation: exactly these members, timestamps in RFC 3339 UTC with milliseconds. */
function assertUserShape(body: Record<string, unknown>): void {
  assert.deepEqual(Object.keys(body).sort(), USER_MEMBERS)
  assert.equal(typeof body.id, 'number')
  assert.match(String(body.created_at), RFC3339_MS_UTC)
  assert.match(String(body.updated_at), RFC3339_MS_UTC)
}

function assertMatchesRow(body: Record<string, unknown>, row: UserRow): void {
  assertUserShape(body)
  assert.deepEqual(body, {
    id: row.id,
    name: row.name,
    email: row.email,
    role: row.role,
    email_verified_at: row.email_verified_at,
    created_at: row.created_at,
    updated_at: row.updated_at,
  })
}

const isStrongEtag = (etag: string | null) => etag !== null && /^"[^"]*"$/.test(etag)

/** updated_at has millisecond precision: let the clock move before a write whose new updated_at is compared. */
const tick = () => sleep(3)

// ---------------------------------------------------------------------------
// POST /users

describe('POST /users', () => {
  test('creates a user: 201, the user as body, Location and ETag, and the row as sent', async () => {
    const before = await userCount()
    const email = uniqueEmail('create')
    const res = await api.request('POST', '/users', { body: { name: 'Ann Example', email } })
    assert.equal(res.status, 201, res.text)
    assert.match(res.headers.get('content-type') ?? '', /^application\/json/)
    assertUserShape(res.body)
    assert.equal(res.body.name, 'Ann Example')
    assert.equal(res.body.email, email)
    assert.equal(res.body.role, 'user', 'role defaults to user')
    assert.equal(res.body.created_at, res.body.updated_at)
    assert.equal(res.headers.get('location'), `/users/${res.body.id}`)
    assert.ok(isStrongEtag(res.headers.get('etag')), `strong ETag, got ${res.headers.get('etag')}`)

    assert.equal(await userCount(), before + 1)
    const row = await mustRow(res.body.id)
    assertMatchesRow(res.body, row)
    assert.equal(row.password_hash, null, 'no password given: none stored')
    assert.equal(row.version, 1)
  })

  test('the Location and ETag of a created user are what GET answers', async () => {
    const created = await api.request('POST', '/users', { body: { name: 'Located', email: uniqueEmail() } })
    assert.equal(created.status, 201)
    const got = await api.request('GET', created.headers.get('location')!)
    assert.equal(got.status, 200)
    assert.deepEqual(got.body, created.body)
    assert.equal(got.headers.get('etag'), created.headers.get('etag'))
  })

  test('role admin is accepted and stored', async () => {
    const { id, body } = await createUser({ role: 'admin' })
    assert.equal(body.role, 'admin')
    assert.equal((await mustRow(id)).role, 'admin')
    // Leave no extra admin behind for anybody counting admins later.
    await api.sql`UPDATE users SET role = 'user' WHERE id = ${id}`
  })

  test('the e-mail address is returned and stored exactly as sent (case kept)', async () => {
    const email = `Mixed.Case${++sequence}@Example.COM`
    const { id, body } = await createUser({ email })
    assert.equal(body.email, email)
    assert.equal((await mustRow(id)).email, email)
  })

  test('boundaries: a 200-character name and a 254-character e-mail are accepted', async () => {
    const name = 'n'.repeat(200)
    const email = emailOfLength(254)
    const { id } = await createUser({ name, email })
    const row = await mustRow(id)
    assert.equal(row.name, name)
    assert.equal(row.email, email)
  })

  test('name length counts characters, not UTF-16 units: 200 astral characters are accepted', async () => {
    const name = '😀'.repeat(200)
    const { id } = await createUser({ name })
    assert.equal((await mustRow(id)).name, name)
  })

  test('a non-ASCII name round-trips unchanged', async () => {
    const name = 'Zoë Ångström-李'
    const { id, body } = await createUser({ name })
    assert.equal(body.name, name)
    assert.equal((await mustRow(id)).name, name)
  })

  for (const member of ['id', 'created_at', 'updated_at'] as const) {
    test(`a read-only member (${member}) in the body is refused with 422 naming it, nothing inserted`, async () => {
      const before = await userCount()
      const value = member === 'id' ? 12345 : '2026-01-01T00:00:00.000Z'
      const email = uniqueEmail()
      const res = await api.request('POST', '/users', { body: { name: 'Read Only', email, [member]: value } })
      assertValidation(res, `/${member}`)
      assert.equal(await userCount(), before)
    })
  }

  test('an unknown member is refused with 422 whose errors[] names it', async () => {
    const before = await userCount()
    const res = await api.request('POST', '/users', { body: { name: 'Unknown', email: uniqueEmail(), x: 1 } })
    assertValidation(res, '/x')
    assert.equal(res.body.errors.find((e: { path: string }) => e.path === '/x').message, 'is not a known member')
    assert.equal(await userCount(), before)
  })

  test('missing name or e-mail is refused with 422 naming the member', async () => {
    const before = await userCount()
    assertValidation(await api.request('POST', '/users', { body: { email: uniqueEmail() } }), '/name')
    assertValidation(await api.request('POST', '/users', { body: { name: 'No Mail' } }), '/email')
    const both = await api.request('POST', '/users', { body: {} })
    assertValidation(both, '/name')
    assertValidation(both, '/email')
    assert.equal(await userCount(), before)
  })

  test('a duplicate e-mail in any case is refused with 409 email_taken and nothing is inserted', async () => {
    const n = ++sequence
    const { id } = await createUser({ email: `Ann${n}@X.com` })
    const original = await mustRow(id)
    const before = await userCount()
    for (const email of [`Ann${n}@X.com`, `ann${n}@x.com`, `ANN${n}@X.COM`, `aNn${n}@x.CoM`]) {
      const res = await api.request('POST', '/users', { body: { name: 'Duplicate', email } })
      assertProblem(res, 409, 'email_taken')
    }
    assert.equal(await userCount(), before)
    const [{ n: same }] = await api.sql<
      [{ n: number }]
    >`SELECT count(*)::int AS n FROM users WHERE lower(email) = ${`ann${n}@x.com`}`
    assert.equal(same, 1)
    assert.deepEqual(await mustRow(id), original, 'the existing user is untouched')
  })
})

// ---------------------------------------------------------------------------
// GET /users/{id} and GET /users

describe('GET /users/{id}', () => {
  test('answers 200 with the user and a strong ETag', async () => {
    const { id, etag } = await createUser({ name: 'Getter' })
    const res = await api.request('GET', `/users/${id}`)
    assert.equal(res.status, 200)
    assertMatchesRow(res.body, await mustRow(id))
    assert.ok(isStrongEtag(res.headers.get('etag')), `strong ETag, got ${res.headers.get('etag')}`)
    assert.equal(res.headers.get('etag'), etag)
  })

  test('If-None-Match with the current ETag answers 304 with the ETag and no body', async () => {
    const { id } = await createUser()
    const first = await api.request('GET', `/users/${id}`)
    const etag = first.headers.get('etag')!
    const res = await api.request('GET', `/users/${id}`, { headers: { 'if-none-match': etag } })
    assert.equal(res.status, 304)
    assert.equal(res.headers.get('etag'), etag)
    assert.equal(res.text, '')
  })

  test('If-None-Match with an outdated ETag answers 200 with the current user', async () => {
    const { id, etag } = await createUser()
    assert.equal((await api.request('PATCH', `/users/${id}`, { body: { name: 'Renamed' } })).status, 200)
    const res = await api.request('GET', `/users/${id}`, { headers: { 'if-none-match': etag } })
    assert.equal(res.status, 200)
    assert.equal(res.body.name, 'Renamed')
    assert.notEqual(res.headers.get('etag'), etag)
  })

  test('an unknown id answers 404 not_found', async () => {
    const [{ max }] = await api.sql<[{ max: number }]>`SELECT coalesce(max(id), 0)::int8 AS max FROM users`
    for (const id of [max + 1000, '9223372036854775807']) {
      assertProblem(await api.request('GET', `/users/${id}`), 404, 'not_found')
    }
  })

  test('a path segment that cannot be an id answers 404 not_found', async () => {
    for (const id of ['abc', '0', '-1', '1.5', '01', '9223372036854775808', '1e3']) {
      assertProblem(await api.request('GET', `/users/${id}`), 404, 'not_found')
    }
  })
})

describe('GET /users', () => {
  test('answers a JSON array of users without password_hash or version', async () => {
    const { id } = await createUser({ name: 'Listed', password: undefined })
    await api.sql`UPDATE users SET password_hash = ${PLANTED_HASH} WHERE id = ${id}`
    const res = await api.request('GET', '/users?limit=200')
    assert.equal(res.status, 200)
    assert.ok(Array.isArray(res.body), 'the body is an array')
    assert.ok(res.body.length > 0)
    for (const user of res.body) assertUserShape(user)
    assert.ok(!res.text.includes('password'), 'no password member anywhere')
    assert.ok(!res.text.includes('version'), 'no version member anywhere')
    const listed = res.body.find((u: { id: number }) => u.id === id)
    assert.ok(listed, 'the new user is listed')
    assertMatchesRow(listed, await mustRow(id))
  })
})

// ---------------------------------------------------------------------------
// PUT /users/{id}

describe('PUT /users/{id}', () => {
  test('replaces name and e-mail; role and password left out stay as they are', async () => {
    const { id } = await createUser({ role: 'admin' })
    await createUser({ role: 'admin' }) // so that nothing here is about the last admin
    await api.sql`UPDATE users SET password_hash = ${PLANTED_HASH} WHERE id = ${id}`
    const before = await mustRow(id)
    await tick()
    const email = uniqueEmail('replaced')
    const res = await api.request('PUT', `/users/${id}`, { body: { name: 'Replaced', email } })
    assert.equal(res.status, 200, res.text)
    const after = await mustRow(id)
    assertMatchesRow(res.body, after)
    assert.equal(after.name, 'Replaced')
    assert.equal(after.email, email)
    assert.equal(after.role, 'admin', 'role kept')
    assert.equal(after.password_hash, PLANTED_HASH, 'password kept')
    assert.equal(after.version, before.version + 1)
    assert.deepEqual(after.created_at, before.created_at)
    assert.ok(after.updated_at > before.updated_at, 'updated_at moves on')
    assert.notEqual(res.headers.get('etag'), `"v${before.version}"`)
    // The file's admin stays: demoting it would end its JWT, which every test here uses.
    await api.sql`UPDATE users SET role = 'user' WHERE role = 'admin' AND id <> ${api.admin.id}`
  })

  test('a given role is set', async () => {
    const { id } = await createUser()
    const res = await api.request('PUT', `/users/${id}`, {
      body: { name: 'Promoted', email: uniqueEmail(), role: 'admin' },
    })
    assert.equal(res.status, 200, res.text)
    assert.equal(res.body.role, 'admin')
    assert.equal((await mustRow(id)).role, 'admin')
    await api.sql`UPDATE users SET role = 'user' WHERE id = ${id}`
  })

  test('echoed id, created_at and updated_at are ignored (a GET-modify-PUT round trip works)', async () => {
    const { id } = await createUser({ name: 'Round Trip' })
    const before = await mustRow(id)
    const got = await api.request('GET', `/users/${id}`)
    await tick()
    const body = {
      ...got.body,
      name: 'Round Tripped',
      created_at: '1999-01-01T00:00:00.000Z',
      updated_at: '1999-01-01T00:00:00.000Z',
    }
    const res = await api.request('PUT', `/users/${id}`, { body })
    assert.equal(res.status, 200, res.text)
    const after = await mustRow(id)
    assert.equal(after.name, 'Round Tripped')
    assert.deepEqual(after.created_at, before.created_at, 'created_at is not taken from the body')
    assert.ok(after.updated_at > before.updated_at, 'updated_at is the server time, not the echo')
    assertMatchesRow(res.body, after)
  })

  test('an echoed id that differs from the path is refused with 422 at /id, nothing changed', async () => {
    const { id } = await createUser()
    const other = await createUser()
    const before = await mustRow(id)
    const res = await api.request('PUT', `/users/${id}`, {
      body: { id: other.id, name: 'Wrong Target', email: uniqueEmail() },
    })
    assertValidation(res, '/id')
    assert.deepEqual(await mustRow(id), before)
    assert.deepEqual((await mustRow(other.id)).name, other.body.name)
  })

  test('a PUT of the same content changes nothing: same ETag, same updated_at, same version', async () => {
    const { id, body, etag } = await createUser()
    const before = await mustRow(id)
    await tick()
    const res = await api.request('PUT', `/users/${id}`, { body: { name: body.name, email: body.email } })
    assert.equal(res.status, 200)
    assert.equal(res.headers.get('etag'), etag)
    assert.deepEqual(await mustRow(id), before)
  })

  test('a nonexistent id answers 404 not_found and creates nothing', async () => {
    const before = await userCount()
    const [{ max }] = await api.sql<[{ max: number }]>`SELECT coalesce(max(id), 0)::int8 AS max FROM users`
    const res = await api.request('PUT', `/users/${max + 1000}`, { body: { name: 'Ghost', email: uniqueEmail() } })
    assertProblem(res, 404, 'not_found')
    assert.equal(await userCount(), before)
  })

  test('missing name or e-mail is refused with 422, nothing changed', async () => {
    const { id } = await createUser()
    const before = await mustRow(id)
    assertValidation(await api.request('PUT', `/users/${id}`, { body: { email: uniqueEmail() } }), '/name')
    assertValidation(await api.request('PUT', `/users/${id}`, { body: { name: 'Only Name' } }), '/email')
    assertValidation(await api.request('PUT', `/users/${id}`, { body: { role: 'user' } }), '/name')
    assert.deepEqual(await mustRow(id), before)
  })

  test("another user's e-mail in any case is refused with 409 email_taken, nothing changed", async () => {
    const n = ++sequence
    await createUser({ email: `Taken${n}@Example.com` })
    const { id } = await createUser()
    const before = await mustRow(id)
    const res = await api.request('PUT', `/users/${id}`, { body: { name: 'Thief', email: `taken${n}@EXAMPLE.COM` } })
    assertProblem(res, 409, 'email_taken')
    assert.deepEqual(await mustRow(id), before)
  })

  test('changing only the case of its own e-mail is allowed and stored as sent', async () => {
    const n = ++sequence
    const { id } = await createUser({ email: `case${n}@example.com` })
    const res = await api.request('PUT', `/users/${id}`, { body: { name: 'Case', email: `Case${n}@Example.com` } })
    assert.equal(res.status, 200, res.text)
    assert.equal((await mustRow(id)).email, `Case${n}@Example.com`)
  })

  test('a given password replaces the stored hash; it is never returned', async () => {
    const { id } = await createUser()
    await api.sql`UPDATE users SET password_hash = ${PLANTED_HASH} WHERE id = ${id}`
    const pw = password('put')
    const res = await api.request('PUT', `/users/${id}`, {
      body: { name: 'With Password', email: uniqueEmail(), password: pw },
    })
    assert.equal(res.status, 200, res.text)
    assertUserShape(res.body)
    assert.ok(!res.text.includes(pw))
    const row = await mustRow(id)
    assert.match(row.password_hash ?? '', SCRYPT_HASH)
    assert.notEqual(row.password_hash, PLANTED_HASH)
    assert.equal(await api.deps.passwords.verify(pw, row.password_hash!), true)
  })
})

// ---------------------------------------------------------------------------
// PATCH /users/{id}

describe('PATCH /users/{id}', () => {
  test('sets the members present and leaves the others', async () => {
    const { id } = await createUser({ name: 'Before Patch' })
    await api.sql`UPDATE users SET password_hash = ${PLANTED_HASH} WHERE id = ${id}`
    const before = await mustRow(id)
    await tick()
    const res = await api.request('PATCH', `/users/${id}`, { body: { name: 'After Patch' } })
    assert.equal(res.status, 200, res.text)
    const after = await mustRow(id)
    assertMatchesRow(res.body, after)
    assert.deepEqual(
      { ...after, updated_at: null, version: null },
      { ...before, name: 'After Patch', updated_at: null, version: null },
    )
    assert.equal(after.version, before.version + 1)
    assert.ok(after.updated_at > before.updated_at)
    assert.notEqual(res.headers.get('etag'), `"v${before.version}"`)

    const email = uniqueEmail('patched')
    const second = await api.request('PATCH', `/users/${id}`, { body: { email, role: 'admin' } })
    assert.equal(second.status, 200, second.text)
    const final = await mustRow(id)
    assert.equal(final.name, 'After Patch')
    assert.equal(final.email, email)
    assert.equal(final.role, 'admin')
    assert.equal(final.password_hash, PLANTED_HASH)
    await api.sql`UPDATE users SET role = 'user' WHERE id = ${id}`
  })

  test('an empty patch {} changes nothing: same ETag, same updated_at, same version', async () => {
    const { id, etag } = await createUser()
    const before = await mustRow(id)
    await tick()
    const res = await api.request('PATCH', `/users/${id}`, { body: {} })
    assert.equal(res.status, 200, res.text)
    assert.equal(res.headers.get('etag'), etag)
    assert.equal(res.body.updated_at, before.updated_at)
    assert.deepEqual(await mustRow(id), before)
  })

  test('a patch that sets the current values changes nothing', async () => {
    const { id, etag, body } = await createUser()
    const before = await mustRow(id)
    await tick()
    const res = await api.request('PATCH', `/users/${id}`, {
      body: { name: body.name, email: body.email, role: body.role },
    })
    assert.equal(res.status, 200, res.text)
    assert.equal(res.headers.get('etag'), etag)
    assert.deepEqual(await mustRow(id), before)
  })

  test('plain application/json is accepted for a merge patch', async () => {
    const { id } = await createUser()
    const res = await api.request('PATCH', `/users/${id}`, {
      body: { name: 'Json Patch' },
      headers: { 'content-type': 'application/json' },
    })
    assert.equal(res.status, 200, res.text)
    assert.equal((await mustRow(id)).name, 'Json Patch')
  })

  for (const member of ['name', 'email', 'role'] as const) {
    test(`${member}: null is refused with 422 at /${member}, nothing changed`, async () => {
      const { id } = await createUser()
      const before = await mustRow(id)
      assertValidation(await api.request('PATCH', `/users/${id}`, { body: { [member]: null } }), `/${member}`)
      assert.deepEqual(await mustRow(id), before)
    })
  }

  test('a password is stored as a scrypt hash that verifies; it is never returned', async () => {
    const { id } = await createUser()
    const pw = password('patch')
    const res = await api.request('PATCH', `/users/${id}`, { body: { password: pw } })
    assert.equal(res.status, 200, res.text)
    assertUserShape(res.body)
    assert.ok(!res.text.includes(pw))
    const row = await mustRow(id)
    assert.equal(row.version, 2, 'setting a password is a change')
    const [, N, r, p, salt] =
      SCRYPT_HASH.exec(row.password_hash ?? '') ?? assert.fail(`not a scrypt hash: ${row.password_hash}`)
    // The configured cost (the suite's is the lowest, test/helpers/passwords.ts;
    // production's floor is test/config.test.ts's).
    assert.deepEqual(
      [Number(N), Number(r), Number(p)],
      [2 ** api.deps.config.passwordHashCost, 8, 3],
      `scrypt parameters ${N}/${r}/${p}`,
    )
    assert.ok(Buffer.from(salt!, 'base64').length >= 16, 'a salt of at least 16 bytes')
    assert.equal(await api.deps.passwords.verify(pw, row.password_hash!), true)
    assert.equal(await api.deps.passwords.verify(pw + 'x', row.password_hash!), false)
  })

  test('password: null removes the password (password_hash becomes NULL) and is a change', async () => {
    const { id, etag } = await createUser()
    await api.sql`UPDATE users SET password_hash = ${PLANTED_HASH} WHERE id = ${id}`
    const before = await mustRow(id)
    await tick()
    const res = await api.request('PATCH', `/users/${id}`, { body: { password: null } })
    assert.equal(res.status, 200, res.text)
    const after = await mustRow(id)
    assert.equal(after.password_hash, null)
    assert.equal(after.version, before.version + 1)
    assert.ok(after.updated_at > before.updated_at)
    assert.notEqual(res.headers.get('etag'), etag)
  })

  test('password: null on a user without a password changes nothing', async () => {
    const { id, etag } = await createUser()
    const before = await mustRow(id)
    const res = await api.request('PATCH', `/users/${id}`, { body: { password: null } })
    assert.equal(res.status, 200, res.text)
    assert.equal(res.headers.get('etag'), etag)
    assert.deepEqual(await mustRow(id), before)
  })

  test('a patch without password keeps the stored hash', async () => {
    const { id } = await createUser()
    await api.sql`UPDATE users SET password_hash = ${PLANTED_HASH} WHERE id = ${id}`
    assert.equal((await api.request('PATCH', `/users/${id}`, { body: { name: 'Keeps Password' } })).status, 200)
    assert.equal((await mustRow(id)).password_hash, PLANTED_HASH)
  })

  test("another user's e-mail in any case is refused with 409 email_taken, nothing changed", async () => {
    const n = ++sequence
    await createUser({ email: `Other${n}@Example.com` })
    const { id } = await createUser()
    const before = await mustRow(id)
    assertProblem(
      await api.request('PATCH', `/users/${id}`, { body: { email: `OTHER${n}@example.com` } }),
      409,
      'email_taken',
    )
    assert.deepEqual(await mustRow(id), before)
  })

  test('an echoed id equal to the path is accepted; a different one is refused with 422', async () => {
    const { id } = await createUser()
    assert.equal((await api.request('PATCH', `/users/${id}`, { body: { id, name: 'Same Id' } })).status, 200)
    const before = await mustRow(id)
    assertValidation(await api.request('PATCH', `/users/${id}`, { body: { id: id + 1, name: 'Other Id' } }), '/id')
    assert.deepEqual(await mustRow(id), before)
  })

  test('a nonexistent id answers 404 not_found', async () => {
    const [{ max }] = await api.sql<[{ max: number }]>`SELECT coalesce(max(id), 0)::int8 AS max FROM users`
    assertProblem(await api.request('PATCH', `/users/${max + 1000}`, { body: { name: 'Ghost' } }), 404, 'not_found')
  })
})

// ---------------------------------------------------------------------------
// DELETE /users/{id}

describe('DELETE /users/{id}', () => {
  test('answers 204 without a body; the row leaves the live ones (to the trash) and GET answers 404', async () => {
    const { id } = await createUser()
    const before = await userCount()
    const res = await api.request('DELETE', `/users/${id}`)
    assert.equal(res.status, 204)
    assert.equal(res.text, '')
    assert.equal(await dbRow(id), undefined)
    assert.equal(await userCount(), before - 1)
    assertProblem(await api.request('GET', `/users/${id}`), 404, 'not_found')
  })

  test('a second DELETE, or one of an unknown id, answers 404 not_found', async () => {
    const { id } = await createUser()
    assert.equal((await api.request('DELETE', `/users/${id}`)).status, 204)
    const before = await userCount()
    assertProblem(await api.request('DELETE', `/users/${id}`), 404, 'not_found')
    assertProblem(await api.request('DELETE', '/users/9223372036854775807'), 404, 'not_found')
    assert.equal(await userCount(), before)
  })

  test('the e-mail address of a deleted user can be used again', async () => {
    const email = uniqueEmail('reuse')
    const { id } = await createUser({ email })
    assert.equal((await api.request('DELETE', `/users/${id}`)).status, 204)
    await createUser({ email: email.toUpperCase() })
  })
})

// ---------------------------------------------------------------------------
// ETags and If-Match

describe('ETag and If-Match', () => {
  test('every change changes the ETag and updated_at', async () => {
    const { id, etag } = await createUser()
    const seen = new Set([etag])
    let last = (await mustRow(id)).updated_at
    const changes: Array<[string, unknown]> = [
      ['PATCH', { name: 'Change 1' }],
      ['PUT', { name: 'Change 2', email: uniqueEmail() }],
      ['PATCH', { email: uniqueEmail() }],
      ['PUT', { name: 'Change 2', email: uniqueEmail() }],
    ]
    for (const [method, body] of changes) {
      await tick()
      const res = await api.request(method, `/users/${id}`, { body })
      assert.equal(res.status, 200, res.text)
      const tag = res.headers.get('etag')!
      assert.ok(isStrongEtag(tag))
      assert.ok(!seen.has(tag), `${method} gave a new ETag (got ${tag} again)`)
      seen.add(tag)
      const row = await mustRow(id)
      assert.ok(row.updated_at > last, `${method} moved updated_at`)
      last = row.updated_at
      assert.equal((await api.request('GET', `/users/${id}`)).headers.get('etag'), tag, 'GET answers the new ETag')
    }
  })

  const writes: Array<{ method: 'PUT' | 'PATCH' | 'DELETE'; body?: () => unknown }> = [
    { method: 'PUT', body: () => ({ name: 'Conditional Put', email: uniqueEmail() }) },
    { method: 'PATCH', body: () => ({ name: 'Conditional Patch' }) },
    { method: 'DELETE' },
  ]

  for (const { method, body } of writes) {
    test(`${method} with a stale If-Match answers 412 precondition_failed and changes nothing`, async () => {
      const { id, etag: stale } = await createUser()
      assert.equal((await api.request('PATCH', `/users/${id}`, { body: { name: 'Moved On' } })).status, 200)
      const before = await mustRow(id)
      const res = await api.request(method, `/users/${id}`, { body: body?.(), headers: { 'if-match': stale } })
      assertProblem(res, 412, 'precondition_failed')
      assert.equal(res.headers.get('etag'), `"v${before.version}"`, 'the 412 carries the current ETag')
      assert.deepEqual(await mustRow(id), before)
    })

    test(`${method} with a weak If-Match never matches (strong comparison): 412, nothing changed`, async () => {
      const { id, etag } = await createUser()
      const before = await mustRow(id)
      const res = await api.request(method, `/users/${id}`, { body: body?.(), headers: { 'if-match': `W/${etag}` } })
      assertProblem(res, 412, 'precondition_failed')
      assert.deepEqual(await mustRow(id), before)
    })

    test(`${method} with the current ETag in If-Match succeeds`, async () => {
      const { id, etag } = await createUser()
      const res = await api.request(method, `/users/${id}`, { body: body?.(), headers: { 'if-match': etag } })
      assert.equal(res.status, method === 'DELETE' ? 204 : 200, res.text)
      if (method === 'DELETE') assert.equal(await dbRow(id), undefined)
      else assert.equal((await mustRow(id)).version, 2)
    })

    test(`${method} with If-Match: * succeeds`, async () => {
      const { id } = await createUser()
      const res = await api.request(method, `/users/${id}`, { body: body?.(), headers: { 'if-match': '*' } })
      assert.equal(res.status, method === 'DELETE' ? 204 : 200, res.text)
      if (method === 'DELETE') assert.equal(await dbRow(id), undefined)
      else assert.equal((await mustRow(id)).version, 2)
    })

    test(`${method} with If-Match listing the current ETag among others succeeds`, async () => {
      const { id, etag } = await createUser()
      const res = await api.request(method, `/users/${id}`, {
        body: body?.(),
        headers: { 'if-match': `"v999", ${etag}` },
      })
      assert.equal(res.status, method === 'DELETE' ? 204 : 200, res.text)
    })
  }
})

// ---------------------------------------------------------------------------
// Hostile input on POST, PUT and PATCH

interface HostileCase {
  label: string
  /** Members merged over a valid body, or a raw JSON text that replaces it. */
  members?: Record<string, unknown>
  raw?: (valid: Record<string, unknown>) => string
  /** The error path for a 422; or a different status and code. */
  path?: string
  status?: number
  code?: string
  /** Which methods the case applies to (default all). */
  only?: Array<'POST' | 'PUT' | 'PATCH'>
}

const hostileCases: HostileCase[] = [
  { label: 'name of the wrong type (number)', members: { name: 5 }, path: '/name' },
  { label: 'email of the wrong type (array)', members: { email: [] }, path: '/email' },
  { label: 'role of the wrong type (boolean)', members: { role: true }, path: '/role' },
  { label: 'password of the wrong type (number)', members: { password: 12345678 }, path: '/password' },
  { label: 'name as an object', members: { name: { first: 'a' } }, path: '/name' },
  { label: 'name of 201 characters', members: { name: 'n'.repeat(201) }, path: '/name' },
  { label: 'empty name', members: { name: '' }, path: '/name' },
  { label: 'email of 255 characters', members: { email: emailOfLength(255, 'hostile') }, path: '/email' },
  { label: 'password of 7 characters', members: { password: password('short', 7) }, path: '/password' },
  { label: 'password of 257 characters', members: { password: password('long', 257) }, path: '/password' },
  { label: 'empty password', members: { password: '' }, path: '/password' },
  { label: 'whitespace-only name', members: { name: '   ' }, path: '/name' },
  { label: 'tab/newline-only name', members: { name: ' \t\n ' }, path: '/name' },
  { label: 'Unicode-space-only name', members: { name: '\u00a0\u2003\u3000' }, path: '/name' },
  { label: 'newline in name', members: { name: 'a\nb' }, path: '/name' },
  { label: 'BEL in name', members: { name: 'a\u0007b' }, path: '/name' },
  { label: 'DEL in name', members: { name: 'a\u007fb' }, path: '/name' },
  { label: 'C1 control (NEL) in name', members: { name: 'a\u0085b' }, path: '/name' },
  { label: 'C1 control (U+009B CSI) in name', members: { name: 'a\u009b31mb' }, path: '/name' },
  { label: 'NUL in name', members: { name: 'a\u0000b' }, path: '/name' },
  { label: 'NUL in email', members: { email: 'a\u0000b@example.com' }, path: '/email' },
  { label: 'NUL in password', members: { password: 'password\u0000' }, path: '/password' },
  { label: 'lone surrogate in name', members: { name: '\ud800' }, path: '/name' },
  { label: 'lone surrogate in email', members: { email: 'a\udc00@example.com' }, path: '/email' },
  { label: 'email without a dot in the domain (a@b)', members: { email: 'a@b' }, path: '/email' },
  { label: 'email with a space (a b@c.d)', members: { email: 'a b@c.d' }, path: '/email' },
  { label: 'email without a local part (@x.com)', members: { email: '@x.com' }, path: '/email' },
  { label: 'email without @', members: { email: 'ann.example.com' }, path: '/email' },
  { label: 'email with two @', members: { email: 'a@b@example.com' }, path: '/email' },
  { label: 'email with a trailing dot', members: { email: 'a@example.com.' }, path: '/email' },
  { label: 'email with a newline', members: { email: 'a@example.com\n' }, path: '/email' },
  { label: 'role outside the enum ("root")', members: { role: 'root' }, path: '/role' },
  { label: 'role in the wrong case ("Admin")', members: { role: 'Admin' }, path: '/role' },
  { label: 'unknown member', members: { x: 1 }, path: '/x' },
  {
    label: 'unknown member password_hash',
    members: { password_hash: 'scrypt$1$1$1$AA==$AA==' },
    path: '/password_hash',
  },
  { label: 'unknown member version', members: { version: 1 }, path: '/version' },
  {
    label: 'id echo of 1e400 (Infinity)',
    raw: (valid) => JSON.stringify(valid).replace(/^\{/, '{"id":1e400,'),
    path: '/id',
  },
  { label: 'id echo of a fraction', members: { id: 1.5 }, path: '/id' },
  { label: 'id echo as a string', members: { id: '1' }, path: '/id' },
  { label: 'id echo of 0', members: { id: 0 }, path: '/id' },
  {
    label: 'created_at echo of the wrong type',
    members: { created_at: 5 },
    path: '/created_at',
    only: ['PUT', 'PATCH'],
  },
  { label: 'name null', members: { name: null }, path: '/name' },
  { label: 'email null', members: { email: null }, path: '/email' },
  { label: 'role null', members: { role: null }, path: '/role' },
  {
    label: 'a duplicate member',
    raw: (valid) => JSON.stringify(valid).replace(/^\{/, '{"name":"Shadow",'),
    status: 400,
    code: 'malformed_json',
  },
  {
    label: 'a __proto__ member',
    raw: (valid) => JSON.stringify(valid).replace(/^\{/, '{"__proto__":{"role":"admin"},'),
    status: 400,
    code: 'malformed_json',
  },
  { label: 'an array instead of an object', raw: () => '[]', status: 422, code: 'validation_failed' },
  { label: 'malformed JSON', raw: () => '{"name":', status: 400, code: 'malformed_json' },
]

describe('hostile input', () => {
  for (const method of ['POST', 'PUT', 'PATCH'] as const) {
    describe(method, () => {
      for (const c of hostileCases) {
        if (c.only && !c.only.includes(method)) continue
        test(`${c.label} is refused and changes nothing`, async () => {
          let target: number | undefined
          let valid: Record<string, unknown>
          if (method === 'POST') {
            valid = { name: 'Hostile', email: uniqueEmail('hostile') }
          } else {
            target = (await createUser({ name: 'Target' })).id
            await api.sql`UPDATE users SET password_hash = ${PLANTED_HASH} WHERE id = ${target}`
            valid = method === 'PUT' ? { name: 'Target', email: uniqueEmail('hostile') } : { name: 'Target Renamed' }
          }
          // The id echo cases send the right id type only where it is echoed; on POST any id is refused.
          const body = c.raw ? c.raw(valid) : { ...valid, ...c.members }
          const countBefore = await userCount()
          const before = target === undefined ? undefined : await mustRow(target)
          const path = method === 'POST' ? '/users' : `/users/${target}`
          const res = await api.request(method, path, { body })
          if (c.status && c.status !== 422) assertProblem(res, c.status, c.code!)
          else if (c.path) assertValidation(res, c.path)
          else assertProblem(res, 422, 'validation_failed')
          assert.equal(await userCount(), countBefore, 'no row added or removed')
          if (target !== undefined) assert.deepEqual(await mustRow(target), before, 'the row is unchanged')
          else {
            const [{ n }] = await api.sql<
              [{ n: number }]
            >`SELECT count(*)::int AS n FROM users WHERE lower(email) = lower(${String(valid.email)})`
            assert.equal(n, 0, 'nothing inserted')
          }
        })
      }
    })
  }

  test('a huge invalid name is refused quickly (no catastrophic regex backtracking)', async () => {
    const { id } = await createUser()
    const before = await mustRow(id)
    const name = 'a'.repeat(100_000) + '\n'
    for (const [method, path, body] of [
      ['POST', '/users', { name, email: uniqueEmail() }],
      ['PATCH', `/users/${id}`, { name }],
    ] as const) {
      // Answered at all (within the request's time-out) and refused: its time is a figure, not an assertion.
      assertValidation(await api.request(method, path, { body }), '/name')
    }
    assert.deepEqual(await mustRow(id), before)
  })
})

// ---------------------------------------------------------------------------
// Passwords: write-only, hashed, never logged

describe('passwords', () => {
  test('POST with a password stores a verifiable scrypt hash and never returns it', async () => {
    const pw = password('create')
    const res = await api.request('POST', '/users', {
      body: { name: 'Has Password', email: uniqueEmail(), password: pw },
    })
    assert.equal(res.status, 201, res.text)
    assertUserShape(res.body)
    assert.ok(!res.text.includes(pw), 'not in the response')
    assert.ok(!res.text.includes('password'), 'no password member in the response')
    const row = await mustRow(res.body.id)
    assert.match(row.password_hash ?? '', SCRYPT_HASH)
    assert.ok(!row.password_hash!.includes(pw), 'not stored in clear')
    assert.equal(await api.deps.passwords.verify(pw, row.password_hash!), true)

    const got = await api.request('GET', `/users/${res.body.id}`)
    assert.ok(!got.text.includes('password'))
  })

  test('two users with the same password get different hashes (salted)', async () => {
    const pw = password('same')
    const [a, b] = await Promise.all([createUser({ password: pw }), createUser({ password: pw })])
    const [ra, rb] = [await mustRow(a.id), await mustRow(b.id)]
    assert.match(ra.password_hash ?? '', SCRYPT_HASH)
    assert.notEqual(ra.password_hash, rb.password_hash)
  })

  test('boundaries: passwords of 8 and of 256 characters are accepted', async () => {
    const [short, long] = [password('b8', 8), password('b256', 256)]
    const users = await Promise.all([createUser({ password: short }), createUser({ password: long })])
    assert.equal(await api.deps.passwords.verify(short, (await mustRow(users[0].id)).password_hash!), true)
    assert.equal(await api.deps.passwords.verify(long, (await mustRow(users[1].id)).password_hash!), true)
  })

  test('no password sent by this file appears in any log line', async () => {
    // Make sure there is something to search: the server logs every request.
    assert.ok(api.logs.length > 0, 'the server wrote log lines')
    assert.ok(
      api.logs.some((l) => l.route === '/users' && l.method === 'POST'),
      'requests are logged',
    )
    assert.ok(passwordsSent.size >= 5)
    const logText = JSON.stringify(api.logs)
    for (const pw of passwordsSent) assert.ok(!logText.includes(pw), `password ${pw.slice(0, 12)}… found in the log`)
    // Nor any stored hash.
    const hashes = await api.sql<
      Array<{ h: string }>
    >`SELECT password_hash AS h FROM users WHERE password_hash IS NOT NULL`
    for (const { h } of hashes) assert.ok(!logText.includes(h.split('$')[5]!), 'a password hash found in the log')
  })
})

// ---------------------------------------------------------------------------
// Concurrency

describe('concurrency', () => {
  test('10 concurrent POSTs with one e-mail: exactly one 201, the rest 409 email_taken, one row', async () => {
    const email = uniqueEmail('race')
    const before = await userCount()
    const results = await Promise.all(
      Array.from({ length: 10 }, (_, i) => api.request('POST', '/users', { body: { name: `Racer ${i}`, email } })),
    )
    assert.deepEqual(results.map((r) => r.status).sort(), [201, ...Array(9).fill(409)])
    for (const r of results.filter((r) => r.status === 409)) assert.equal(r.body.code, 'email_taken')
    assert.equal(await userCount(), before + 1)
    const rows = await api.sql`SELECT id FROM users WHERE lower(email) = lower(${email})`
    assert.equal(rows.length, 1)
    assert.equal(rows[0]!.id, results.find((r) => r.status === 201)!.body.id)
  })

  test('10 concurrent POSTs with one e-mail in different cases: exactly one row', async () => {
    const n = ++sequence
    const before = await userCount()
    const variants = [`race${n}@x.com`, `RACE${n}@X.COM`, `Race${n}@x.com`, `rAcE${n}@X.com`, `race${n}@X.COM`]
    const results = await Promise.all(
      Array.from({ length: 10 }, (_, i) =>
        api.request('POST', '/users', { body: { name: `Case Racer ${i}`, email: variants[i % variants.length] } }),
      ),
    )
    assert.deepEqual(results.map((r) => r.status).sort(), [201, ...Array(9).fill(409)])
    assert.equal(await userCount(), before + 1)
  })

  test('10 concurrent PATCHes with the same If-Match: exactly one 200, the rest 412, one new version', async () => {
    const { id, etag } = await createUser({ name: 'Contended' })
    const results = await Promise.all(
      Array.from({ length: 10 }, (_, i) =>
        api.request('PATCH', `/users/${id}`, { body: { name: `Writer ${i}` }, headers: { 'if-match': etag } }),
      ),
    )
    assert.deepEqual(results.map((r) => r.status).sort(), [200, ...Array(9).fill(412)])
    for (const r of results.filter((r) => r.status === 412)) assert.equal(r.body.code, 'precondition_failed')
    const winner = results.find((r) => r.status === 200)!
    const row = await mustRow(id)
    assert.equal(row.version, 2, 'exactly one write happened')
    assert.equal(row.name, winner.body.name)
    assert.equal(winner.headers.get('etag'), `"v${row.version}"`)
  })

  test(
    '10 concurrent PATCHes without If-Match all apply, one after another (no lost update of the ' + 'version)',
    async () => {
      const { id } = await createUser({ name: 'Serial' })
      const results = await Promise.all(
        Array.from({ length: 10 }, (_, i) => api.request('PATCH', `/users/${id}`, { body: { name: `Serial ${i}` } })),
      )
      assert.deepEqual(
        results.map((r) => r.status),
        Array(10).fill(200),
      )
      assert.equal(new Set(results.map((r) => r.headers.get('etag'))).size, 10, 'each write got its own version')
      assert.equal((await mustRow(id)).version, 11)
    },
  )
})

// ---------------------------------------------------------------------------
// The last admin

describe('the last admin', () => {
  // Each test arranges exactly the admins it needs: none but its own. They act
  // themselves (an admin may delete or change itself): demoting the file's
  // admin ends its JWT (a role change revokes), as it should.
  beforeEach(async () => {
    await api.sql`UPDATE users SET role = 'user' WHERE role = 'admin'`
  })

  /** An admin inserted directly (the file's admin may be demoted by now) and its JWT. */
  const directAdmin = (name: string) => api.createUser({ role: 'admin', name, passwordHash: adminPasswordHash })
  const as = (admin: { token: string }) => ({ auth: admin.token })
  /** Deleting one's own account takes the password. */
  const asSelf = (admin: { token: string }) => ({ auth: admin.token, body: { current_password: ADMIN_PASSWORD } })

  async function onlyAdmin(): Promise<{ id: number; token: string }> {
    const admin = await directAdmin('Sole Admin')
    assert.deepEqual(await adminIds(), [admin.id], 'exactly one admin before the test')
    return admin
  }

  async function twoAdmins(): Promise<[{ id: number; token: string }, { id: number; token: string }]> {
    const a = await directAdmin('Admin A')
    const b = await directAdmin('Admin B')
    assert.deepEqual(await adminIds(), [a.id, b.id], 'exactly two admins before the test')
    return [a, b]
  }

  test('deleting the last admin answers 409 last_admin and changes nothing', async () => {
    const admin = await onlyAdmin()
    const before = await mustRow(admin.id)
    const count = await userCount()
    assertProblem(await api.request('DELETE', `/users/${admin.id}`, asSelf(admin)), 409, 'last_admin')
    assert.deepEqual(await mustRow(admin.id), before)
    assert.equal(await userCount(), count)
  })

  test('demoting the last admin with PATCH role user answers 409 last_admin and changes nothing', async () => {
    const admin = await onlyAdmin()
    const before = await mustRow(admin.id)
    assertProblem(
      await api.request('PATCH', `/users/${admin.id}`, { ...as(admin), body: { role: 'user' } }),
      409,
      'last_admin',
    )
    assertProblem(
      await api.request('PATCH', `/users/${admin.id}`, { ...as(admin), body: { role: 'user', name: 'Also Renamed' } }),
      409,
      'last_admin',
    )
    assert.deepEqual(await mustRow(admin.id), before, 'not even the name changed')
  })

  test('demoting the last admin with PUT role user answers 409 last_admin and changes nothing', async () => {
    const admin = await onlyAdmin()
    const before = await mustRow(admin.id)
    const res = await api.request('PUT', `/users/${admin.id}`, {
      ...as(admin),
      body: { name: 'Put Demoted', email: before.email, role: 'user' },
    })
    assertProblem(res, 409, 'last_admin')
    assert.deepEqual(await mustRow(admin.id), before)
  })

  test('the last admin may still be edited in other ways, and PUT without role keeps it admin', async () => {
    const admin = await onlyAdmin()
    const { email } = await mustRow(admin.id)
    assert.equal(
      (await api.request('PATCH', `/users/${admin.id}`, { ...as(admin), body: { name: 'Still Admin', role: 'admin' } }))
        .status,
      200,
    )
    assert.equal(
      (await api.request('PUT', `/users/${admin.id}`, { ...as(admin), body: { name: 'Still Admin 2', email } })).status,
      200,
    )
    assert.deepEqual(await adminIds(), [admin.id])
  })

  test('with two admins one may be demoted; then the other is the last', async () => {
    const [a, b] = await twoAdmins()
    const res = await api.request('PATCH', `/users/${a.id}`, { ...as(b), body: { role: 'user' } })
    assert.equal(res.status, 200, res.text)
    assert.equal(res.body.role, 'user')
    assert.deepEqual(await adminIds(), [b.id])
    const before = await mustRow(b.id)
    assertProblem(await api.request('PATCH', `/users/${b.id}`, { ...as(b), body: { role: 'user' } }), 409, 'last_admin')
    assert.deepEqual(await mustRow(b.id), before)
  })

  test('with two admins one may be deleted; then the other cannot be', async () => {
    const [a, b] = await twoAdmins()
    assert.equal((await api.request('DELETE', `/users/${a.id}`, as(b))).status, 204)
    assert.deepEqual(await adminIds(), [b.id])
    assertProblem(await api.request('DELETE', `/users/${b.id}`, asSelf(b)), 409, 'last_admin')
    assert.ok(await dbRow(b.id))
  })

  test('a user who is not an admin can be deleted or patched to role user while one admin exists', async () => {
    const admin = await onlyAdmin()
    const { id } = await api.createUser()
    assert.equal((await api.request('PATCH', `/users/${id}`, { ...as(admin), body: { role: 'user' } })).status, 200)
    assert.equal((await api.request('DELETE', `/users/${id}`, as(admin))).status, 204)
    assert.deepEqual(await adminIds(), [admin.id])
  })

  test(
    'two concurrent demotions of the only two admins (each of itself): exactly one succeeds, one 409 last_admin, ' +
      'one admin remains',
    async () => {
      for (let round = 0; round < 5; round++) {
        await api.sql`UPDATE users SET role = 'user' WHERE role = 'admin'`
        const admins = await twoAdmins()
        const results = await Promise.all(
          admins.map((admin) => api.request('PATCH', `/users/${admin.id}`, { ...as(admin), body: { role: 'user' } })),
        )
        assert.deepEqual(results.map((r) => r.status).sort(), [200, 409], `round ${round}`)
        assert.equal(results.find((r) => r.status === 409)!.body.code, 'last_admin')
        const loser = admins[results.findIndex((r) => r.status === 409)]!.id
        assert.deepEqual(await adminIds(), [loser], 'the refused one is still admin')
        assert.equal((await mustRow(loser)).version, 1, 'the refused one is unchanged')
      }
    },
  )

  test(
    'two concurrent deletions of the only two admins (each of itself): exactly one 204, one 409 ' + 'last_admin',
    async () => {
      for (let round = 0; round < 3; round++) {
        await api.sql`UPDATE users SET role = 'user' WHERE role = 'admin'`
        const admins = await twoAdmins()
        const results = await Promise.all(
          admins.map((admin) => api.request('DELETE', `/users/${admin.id}`, asSelf(admin))),
        )
        assert.deepEqual(results.map((r) => r.status).sort(), [204, 409], `round ${round}`)
        assert.equal((await adminIds()).length, 1)
      }
    },
  )

  test('a concurrent deletion and demotion of the only two admins leave one admin', async () => {
    for (let round = 0; round < 3; round++) {
      await api.sql`UPDATE users SET role = 'user' WHERE role = 'admin'`
      const [a, b] = await twoAdmins()
      const results = await Promise.all([
        api.request('DELETE', `/users/${a.id}`, asSelf(a)),
        api.request('PATCH', `/users/${b.id}`, { ...as(b), body: { role: 'user' } }),
      ])
      const [deleted, demoted] = results.map((r) => r.status)
      assert.ok(
        (deleted === 204 && demoted === 409) || (deleted === 409 && demoted === 200),
        `round ${round}: DELETE ${deleted}, PATCH ${demoted}`,
      )
      assert.equal(results.find((r) => r.status === 409)!.body.code, 'last_admin')
      assert.equal((await adminIds()).length, 1)
    }
  })
})
