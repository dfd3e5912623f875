import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { describe, test } from 'node:test'
import { loadConfig } from '../src/config.js'
import { passwordAccount, passwordLogin, type Account } from './helpers/accounts.js'
import { refusedEverywhere } from './helpers/refused.js'
import { startServer, type TestResponse, type TestServer } from './helpers/server.js'
import { propagationBound } from './helpers/time-bounds.js'
import { waitUntil } from './helpers/wait.js'

// Authority follows its owner, for API keys and sessions (docs/auth.md):
// a key is made only by a login, with the password fresh (REAUTH_WINDOW) or
// given again; a key never makes a key; the owner taking the account back
// (logout-all with api_keys, an admin's password reset) ends the keys too,
// on every instance (within a second, or five times what hearing a change
// takes when nothing is wrong, measured first, on a slower machine); a key
// cannot manage sessions or delete its owner; and deleting one's own account
// takes the password. Each attack is made as an attacker holding the
// credential would, over HTTP against two instances on one database, and the
// database is checked after.
//
// Top-level tests run one after another (node:test's default).

const A = await startServer()
const B = await startServer({}, {}, { databaseUrl: A.databaseUrl })
const { sql } = A
const both = [A, B]

const unique = () => randomBytes(5).toString('hex')

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/)
  assert.equal(res.body.code, code, res.text)
}

const account = (role: 'admin' | 'user' = 'user') => passwordAccount(A, role)
const login = (who: Account, format: 'jwt' | 'opaque' = 'jwt', on: TestServer = A) => passwordLogin(on, who, format)

/**
 * The sessions of a user logged in with the password this long ago
 * (what an attacker's stolen token looks like after a while).
 */
const backdateLogins = (userId: number, minutes: number) =>
  sql`UPDATE sessions SET created_at = created_at - ${minutes} * interval '1 minute' WHERE user_id = ${userId}`

const createKey = (auth: string, body: Record<string, unknown> = {}, on: TestServer = A) =>
  on.request('POST', '/api-keys', { auth, body: { name: `key ${unique()}`, scopes: ['users:read'], ...body } })

/** A new key; with `currentPassword`, made with the password in its request (not bound to the session). */
async function newKey(
  auth: string,
  scopes: string[] = ['users:read'],
  currentPassword?: string,
): Promise<{ key: string; id: number }> {
  const res = await createKey(auth, { scopes, ...(currentPassword ? { current_password: currentPassword } : {}) })
  assert.equal(res.status, 201, res.text)
  return { key: res.body.key, id: res.body.id }
}

const keysOf = async (userId: number) =>
  (await sql<[{ n: number }]>`SELECT count(*)::int AS n FROM api_keys WHERE user_id = ${userId}`)[0].n
const liveSessionsOf = async (userId: number) =>
  (
    await sql<[{ n: number }]>`SELECT count(*)::int AS n FROM sessions WHERE user_id = ${userId} AND revoked_at IS NULL`
  )[0].n
/**
 * Failed password checks counted against the account from this client's address, not the account-wide rows ('*',
 * '*known'); a success clears them, as a login's does.
 */
const failuresOf = async (email: string) =>
  (
    await sql<[{ n: number }]>`SELECT coalesce(sum(failures), 0)::int AS n FROM login_failures
      WHERE email = ${email.toLowerCase()} AND address NOT LIKE '*%'`
  )[0].n
// A live user: a deleted one waits in the trash (test/trash-users.test.ts).
const userExists = async (id: number) =>
  (await sql`SELECT 1 FROM users WHERE id = ${id} AND deleted_at IS NULL`).length === 1

/** A body a hostile client sends, and the status it must get. */
interface HostileCase {
  body: unknown
  status: number
  contentType?: string
}

async function sendHostile(method: string, path: string, auth: string, cases: readonly HostileCase[]): Promise<void> {
  for (const c of cases) {
    const headers = c.contentType ? { 'content-type': c.contentType } : undefined
    const res = await A.request(method, path, { auth, body: c.body, headers })
    assert.equal(res.status, c.status, `${JSON.stringify(c.body).slice(0, 80)}: ${res.text}`)
  }
}

const withKey = (key: string) => ({ auth: null, headers: { 'x-api-key': key } })
const me = (server: TestServer, key: string) => server.request('GET', '/auth/me', withKey(key))

/** The key is refused at once on `atOnce`, which made the change, and everywhere within `withinMs`. */
async function keyRefusedEverywhere(key: string, atOnce: TestServer, withinMs: number): Promise<void> {
  assertProblem(await me(atOnce, key), 401, 'invalid_token')
  await refusedEverywhere(both, (server) => me(server, key), withinMs)
}

/** Uses a key on both instances, so that both have it cached. */
async function usedOnBoth(key: string): Promise<void> {
  for (const server of both) assert.equal((await me(server, key)).status, 200)
}

// ---------------------------------------------------------------------------

describe('creating an API key: a login with its password fresh, or given again', () => {
  test(
    'a stolen JWT of a session that logged in 11 minutes ago cannot mint a key without the password: 403, no ' + 'row',
    async () => {
      const owner = await account()
      const stolen = await login(owner)
      await backdateLogins(owner.id, 11)
      const res = await createKey(stolen.access_token)
      assertProblem(res, 403, 'current_password_required')
      assert.match(res.body.detail, /REAUTH_WINDOW/)
      assert.equal(await keysOf(owner.id), 0)
    },
  )

  test('a wrong current_password is 403 and counts as a failed login; the right one creates the key', async () => {
    const owner = await account()
    const { access_token } = await login(owner, 'opaque')
    await backdateLogins(owner.id, 11)
    assertProblem(
      await createKey(access_token, { current_password: 'not-the-password' }),
      403,
      'current_password_required',
    )
    assert.equal(await keysOf(owner.id), 0)
    assert.ok((await failuresOf(owner.email)) >= 1, 'the wrong password counted against the account')
    const res = await createKey(access_token, { current_password: owner.password })
    assert.equal(res.status, 201, res.text)
    assert.equal(await keysOf(owner.id), 1)
    assert.equal(await failuresOf(owner.email), 0, 'a right password clears the failures, as a login does')
  })

  test(
    'refreshing does not renew the window: the new access token of an old login still needs the ' + 'password',
    async () => {
      const owner = await account()
      for (const format of ['jwt', 'opaque'] as const) {
        const first = await login(owner, format)
        await backdateLogins(owner.id, 11)
        const refreshed = await A.request('POST', '/auth/refresh', {
          auth: null,
          body: { refresh_token: first.refresh_token },
        })
        assert.equal(refreshed.status, 200, refreshed.text)
        assertProblem(await createKey(refreshed.body.access_token), 403, 'current_password_required')
      }
      assert.equal(await keysOf(owner.id), 0)
    },
  )

  test('within REAUTH_WINDOW of a password login no password is needed; one given is still checked', async () => {
    const owner = await account()
    const { access_token } = await login(owner)
    assertProblem(
      await createKey(access_token, { current_password: 'wrong-password' }),
      403,
      'current_password_required',
    )
    assert.equal(await keysOf(owner.id), 0)
    assert.equal((await createKey(access_token, {}, B)).status, 201)
    assert.equal(await keysOf(owner.id), 1)
  })

  test('a JWT that names no session (not from a login) needs the password', async () => {
    const owner = await account()
    assertProblem(await createKey(A.jwtFor(owner.id, 'user')), 403, 'current_password_required')
    assert.equal((await createKey(A.jwtFor(owner.id, 'user'), { current_password: owner.password })).status, 201)
  })

  test(
    'an API key never creates a key, whatever its scopes, with the password or not: 403 forbidden, no ' + 'row',
    async () => {
      const admin = await account('admin')
      const { access_token } = await login(admin)
      const everything = await newKey(access_token, [
        'api_keys:write',
        'api_keys:read',
        'users:read',
        'users:write',
        'products:read',
        'metrics:read',
      ])
      const before = await keysOf(admin.id)
      for (const body of [{}, { current_password: admin.password }]) {
        for (const headers of [{ 'x-api-key': everything.key }, { authorization: `Bearer ${everything.key}` }] as Array<
          Record<string, string>
        >) {
          const res = await A.request('POST', '/api-keys', {
            auth: null,
            headers,
            body: { name: 'child', scopes: ['users:read'], ...body },
          })
          assertProblem(res, 403, 'forbidden')
        }
      }
      assert.equal(await keysOf(admin.id), before)
    },
  )

  test('hostile bodies: 4xx, no row, no failed login counted', async () => {
    const owner = await account()
    const { access_token } = await login(owner)
    await backdateLogins(owner.id, 11)
    const cases: HostileCase[] = [
      { body: { name: 'k', scopes: ['users:read'], current_password: 12345678 }, status: 422 },
      { body: { name: 'k', scopes: ['users:read'], current_password: '' }, status: 422 },
      { body: { name: 'k', scopes: ['users:read'], current_password: 'x'.repeat(257) }, status: 422 },
      { body: { name: 'k', scopes: ['users:read'], current_password: `${owner.password}\u0000` }, status: 422 },
      { body: { name: 'k', scopes: ['users:read'], current_password: owner.password, user_id: 1 }, status: 422 },
      { body: { name: 'k', scopes: ['users:read'], current_password: null }, status: 422 },
      { body: `{"name":"k","scopes":["users:read"],"current_password":"${'a'.repeat(1_100_000)}"}`, status: 413 },
      { body: '{"name":"k",', status: 400 },
      {
        body: JSON.stringify({ name: 'k', scopes: ['users:read'], current_password: owner.password }),
        status: 415,
        contentType: 'text/plain',
      },
    ]
    await sendHostile('POST', '/api-keys', access_token, cases)
    assert.equal(await keysOf(owner.id), 0)
    assert.equal(await failuresOf(owner.email), 0)
  })

  test('REAUTH_WINDOW is read from the environment: default 600, 0 to 86400', () => {
    assert.equal(loadConfig({}).reauthWindow, 600)
    assert.equal(loadConfig({ REAUTH_WINDOW: '0' }).reauthWindow, 0)
    assert.throws(() => loadConfig({ REAUTH_WINDOW: '-1' }), /REAUTH_WINDOW/)
    assert.throws(() => loadConfig({ REAUTH_WINDOW: '86401' }), /REAUTH_WINDOW/)
  })
})

describe('POST /auth/logout-all with {"api_keys": true}', () => {
  test(
    'revokes every key of the caller, at once on this instance and within a second on the other; other users keep ' +
      'theirs',
    async () => {
      const owner = await account()
      const bystander = await account()
      const session = await login(owner)
      const keys = [await newKey(session.access_token), await newKey(session.access_token, ['products:read'])]
      const theirs = await newKey((await login(bystander)).access_token)
      for (const { key } of [...keys, theirs]) await usedOnBoth(key)
      const within = await propagationBound(both)

      const res = await A.request('POST', '/auth/logout-all', { auth: session.access_token, body: { api_keys: true } })
      assert.equal(res.status, 204, res.text)
      for (const { key } of keys) await keyRefusedEverywhere(key, A, within)
      assert.equal(await keysOf(owner.id), 0)
      assert.equal(await liveSessionsOf(owner.id), 0)
      assertProblem(await A.request('GET', '/auth/me', { auth: session.access_token }), 401, 'invalid_token')
      await usedOnBoth(theirs.key)
      assert.equal(await keysOf(bystander.id), 1)

      await A.published()
      const revoked = await sql<
        Array<{ subject_id: string }>
      >`SELECT subject_id::text FROM events WHERE type = 'api_key.revoked' AND actor_id = ${owner.id}`
      assert.deepEqual(
        revoked.map((r) => Number(r.subject_id)).sort(),
        keys.map((k) => k.id).sort(),
        'one api_key.revoked event per key',
      )
    },
  )

  test(
    "a key whose creation waited behind a logout-all is not made: the creator is checked again under the user's " +
      'lock, 401 and no row',
    async () => {
      for (const format of ['jwt', 'opaque'] as const) {
        const owner = await account()
        const { access_token } = await login(owner, format)
        // A logout-all (or an admin's password reset) under way: the user's row locked, the sessions ended and the
        // epoch raised, not yet committed.
        let commit!: () => void
        const committed = new Promise<void>((resolve) => (commit = resolve))
        let locked!: () => void
        const isLocked = new Promise<void>((resolve) => (locked = resolve))
        const revocation = sql.begin(async (tx) => {
          await tx`UPDATE users SET credential_epoch = credential_epoch + 1 WHERE id = ${owner.id}`
          await tx`UPDATE sessions SET revoked_at = now() WHERE user_id = ${owner.id} AND revoked_at IS NULL`
          locked()
          await committed
        })
        await isLocked
        // Authenticated and past the window's check before the revocation
        // commits, the creation waits on the user's row.
        const creating = createKey(access_token)
        await waitUntil(
          'the creation waits on the lock',
          async () =>
            (
              await sql`SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'
              AND query ILIKE '%FROM users WHERE id%'`
            ).length > 0,
        )
        commit()
        await revocation
        assertProblem(await creating, 401, 'invalid_token')
        assert.equal(await keysOf(owner.id), 0, `${format}: a key slipped in behind the revocation`)
      }
    },
  )

  test('no body, {} or {"api_keys": false}: sessions end, a key made with the password stays', async () => {
    const owner = await account()
    const { key } = await newKey((await login(owner)).access_token, ['users:read'], owner.password)
    for (const body of [undefined, {}, { api_keys: false }]) {
      const { access_token } = await login(owner)
      assert.equal((await A.request('POST', '/auth/logout-all', { auth: access_token, body })).status, 204)
      assert.equal(await liveSessionsOf(owner.id), 0)
      await usedOnBoth(key)
    }
    assert.equal(await keysOf(owner.id), 1)
  })

  test('hostile bodies: 4xx, no session ended, no key revoked', async () => {
    const owner = await account()
    const { access_token } = await login(owner)
    const { key } = await newKey(access_token)
    const cases: HostileCase[] = [
      { body: { api_keys: 'true' }, status: 422 },
      { body: { api_keys: 1 }, status: 422 },
      { body: { api_keys: null }, status: 422 },
      { body: { api_keys: true, everything: true }, status: 422 },
      { body: { 'api_keys\u0000': true }, status: 422 },
      { body: [true], status: 422 },
      { body: `{"api_keys": true, "pad": "${'a'.repeat(1_100_000)}"}`, status: 413 },
      { body: '{"api_keys": tru', status: 400 },
      { body: JSON.stringify({ api_keys: true }), status: 415, contentType: 'application/x-www-form-urlencoded' },
    ]
    await sendHostile('POST', '/auth/logout-all', access_token, cases)
    assert.equal(await liveSessionsOf(owner.id), 1)
    assert.equal(await keysOf(owner.id), 1)
    await usedOnBoth(key)
  })
})

describe('a key made on the strength of a recent login (no password in its request) ends with its session', () => {
  const ends: Array<
    [string, (owner: Account, session: { access_token: string; refresh_token: string }) => Promise<number>]
  > = [
    [
      'a plain logout-all',
      async (_, session) => (await A.request('POST', '/auth/logout-all', { auth: session.access_token })).status,
    ],
    [
      'a logout of that session (its refresh token)',
      async (_, session) =>
        (await A.request('POST', '/auth/logout', { auth: null, body: { refresh_token: session.refresh_token } }))
          .status,
    ],
    [
      'a password change from another session',
      async (owner) => {
        const other = await login(owner)
        const res = await A.request('PATCH', `/users/${owner.id}`, {
          auth: other.access_token,
          body: { password: `new-${unique()}`, current_password: owner.password },
        })
        return res.status === 200 ? 204 : res.status
      },
    ],
  ]
  for (const [what, end] of ends) {
    test(`${what}: refused on both instances; a key made with the password in its request stays`, async () => {
      const owner = await account()
      const session = await login(owner)
      const windowKey = await newKey(session.access_token)
      const passwordKey = await newKey(session.access_token, ['users:read'], owner.password)
      await usedOnBoth(windowKey.key)
      await usedOnBoth(passwordKey.key)
      const within = await propagationBound(both)
      assert.equal(await end(owner, session), 204)
      await keyRefusedEverywhere(windowKey.key, A, within)
      await usedOnBoth(passwordKey.key)
      // One statement, one snapshot: the publisher moves events from the outbox while the test reads.
      const [{ revoked }] = await sql<[{ revoked: number }]>`
        SELECT (SELECT count(*) FROM event_outbox WHERE type = 'api_key.revoked' AND subject_id = ${windowKey.id})::int
          + (SELECT count(*) FROM events WHERE type = 'api_key.revoked'
            AND subject_id = ${windowKey.id})::int AS revoked`
      assert.equal(revoked, 1, 'one api_key.revoked event')
      assert.deepEqual(
        (await sql<Array<{ id: number }>>`SELECT id FROM api_keys WHERE user_id = ${owner.id}`).map((r) =>
          Number(r.id),
        ),
        [passwordKey.id],
      )
    })
  }

  test("a refresh-token reuse ends the session and its key: a thief's copy takes the key down too", async () => {
    const owner = await account()
    const session = await login(owner)
    const windowKey = await newKey(session.access_token)
    const first = await A.request('POST', '/auth/refresh', {
      auth: null,
      body: { refresh_token: session.refresh_token },
    })
    assert.equal(first.status, 200, first.text)
    const replay = await A.request('POST', '/auth/refresh', {
      auth: null,
      body: { refresh_token: session.refresh_token },
    })
    assertProblem(replay, 401, 'invalid_token')
    for (const server of both)
      await waitUntil('the key refused', async () => (await me(server, windowKey.key)).status === 401)
    assert.equal(await keysOf(owner.id), 0)
  })
})

describe("an admin setting another user's password (account recovery)", () => {
  test("ends that user's sessions, JWTs and API keys on both instances", async () => {
    const user = await account()
    const session = await login(user)
    const { key } = await newKey(session.access_token)
    await usedOnBoth(key)
    const within = await propagationBound(both)
    const res = await A.request('PATCH', `/users/${user.id}`, { body: { password: `new-${unique()}` } })
    assert.equal(res.status, 200, res.text)
    await keyRefusedEverywhere(key, A, within)
    for (const server of both)
      assertProblem(await server.request('GET', '/auth/me', { auth: session.access_token }), 401, 'invalid_token')
    assert.equal(await keysOf(user.id), 0)
    assert.equal(await liveSessionsOf(user.id), 0)
  })

  test("an admin's change that sets no password (a name) leaves the keys", async () => {
    const user = await account()
    const { key } = await newKey((await login(user)).access_token)
    assert.equal((await A.request('PATCH', `/users/${user.id}`, { body: { name: 'Renamed' } })).status, 200)
    await usedOnBoth(key)
    assert.equal(await keysOf(user.id), 1)
  })
})

describe("an API key, whatever its scopes, is refused session management and its owner's account", () => {
  test(
    'GET /auth/sessions, DELETE /auth/sessions/{id}, POST /auth/logout-all: 403 forbidden, nothing ' + 'ended',
    async () => {
      const owner = await account()
      const session = await login(owner)
      const [{ id: sessionId }] = await sql<[{ id: number }]>`SELECT id FROM sessions WHERE user_id = ${owner.id}`
      for (const scopes of [
        ['products:read'],
        ['users:read', 'users:write', 'products:read', 'api_keys:read', 'api_keys:write'],
      ]) {
        const { key } = await newKey(session.access_token, scopes)
        const listed = await A.request('GET', '/auth/sessions', withKey(key))
        assertProblem(listed, 403, 'forbidden')
        assert.doesNotMatch(listed.text, /client_address|user_agent/)
        assertProblem(await A.request('DELETE', `/auth/sessions/${sessionId}`, withKey(key)), 403, 'forbidden')
        assertProblem(
          await A.request('POST', '/auth/logout-all', { ...withKey(key), body: { api_keys: true } }),
          403,
          'forbidden',
        )
      }
      assert.equal(await liveSessionsOf(owner.id), 1)
      assert.equal(await keysOf(owner.id), 2)
      assert.equal((await A.request('GET', '/auth/me', { auth: session.access_token })).status, 200)
    },
  )

  test(
    "a users:write key cannot change its owner's password or e-mail, even with current_password: 403 forbidden, " +
      'nothing changed',
    async () => {
      const owner = await account()
      const { key } = await newKey((await login(owner)).access_token, ['users:read', 'users:write'])
      const [before] = await sql`SELECT email, password_hash, version FROM users WHERE id = ${owner.id}`
      for (const body of [
        { password: 'taken-over-password', current_password: owner.password },
        { email: `taken-${unique()}@example.com`, current_password: owner.password },
      ]) {
        assertProblem(await A.request('PATCH', `/users/${owner.id}`, { ...withKey(key), body }), 403, 'forbidden')
      }
      assert.deepEqual((await sql`SELECT email, password_hash, version FROM users WHERE id = ${owner.id}`)[0], before)
    },
  )

  test(
    "a users:write key cannot test guesses of its owner's password through current_password on another change: " +
      '403 for right and wrong alike, nothing counted or changed',
    async () => {
      const owner = await account()
      const { key } = await newKey((await login(owner)).access_token, ['users:read', 'users:write'])
      const [before] = await sql`SELECT name, version FROM users WHERE id = ${owner.id}`
      for (const guess of ['wrong-guess', owner.password]) {
        assertProblem(
          await A.request('PATCH', `/users/${owner.id}`, {
            ...withKey(key),
            body: { name: 'Renamed', current_password: guess },
          }),
          403,
          'forbidden',
        )
      }
      assert.deepEqual((await sql`SELECT name, version FROM users WHERE id = ${owner.id}`)[0], before)
      assert.equal(await failuresOf(owner.email), 0, 'a guess through a key was checked')
    },
  )

  test(
    'a users:write key cannot delete its own user, with or without the password: 403 forbidden, the user ' + 'stays',
    async () => {
      const owner = await account()
      const { key } = await newKey((await login(owner)).access_token, ['users:read', 'users:write'])
      for (const body of [undefined, { current_password: owner.password }]) {
        assertProblem(await A.request('DELETE', `/users/${owner.id}`, { ...withKey(key), body }), 403, 'forbidden')
      }
      assert.ok(await userExists(owner.id))
      assert.equal(await keysOf(owner.id), 1)
    },
  )

  test("an admin's key may still delete another user (that is not its owner's account)", async () => {
    const admin = await account('admin')
    const { key } = await newKey((await login(admin)).access_token, ['users:read', 'users:write'])
    const victim = await account()
    assert.equal((await A.request('DELETE', `/users/${victim.id}`, withKey(key))).status, 204)
    assert.ok(!(await userExists(victim.id)))
  })
})

describe("deleting one's own account takes current_password", () => {
  test(
    'with a JWT: no body 403, wrong 403 (a failed login), right 204: the user in the trash, its sessions ended, ' +
      'its keys gone',
    async () => {
      const owner = await account()
      const { access_token } = await login(owner)
      await newKey(access_token)
      const path = `/users/${owner.id}`
      assertProblem(await A.request('DELETE', path, { auth: access_token }), 403, 'current_password_required')
      assertProblem(await A.request('DELETE', path, { auth: access_token, body: {} }), 403, 'current_password_required')
      assertProblem(
        await A.request('DELETE', path, { auth: access_token, body: { current_password: 'wrong-password' } }),
        403,
        'current_password_required',
      )
      assert.ok(await userExists(owner.id))
      assert.ok((await failuresOf(owner.email)) >= 1)
      const res = await A.request('DELETE', path, { auth: access_token, body: { current_password: owner.password } })
      assert.equal(res.status, 204, res.text)
      assert.ok(!(await userExists(owner.id)))
      assert.equal(await keysOf(owner.id), 0)
      assert.equal((await sql`SELECT 1 FROM sessions WHERE user_id = ${owner.id} AND revoked_at IS NULL`).length, 0)
    },
  )

  test('even a fresh login needs it (REAUTH_WINDOW is for API keys only)', async () => {
    const owner = await account()
    const { access_token } = await login(owner, 'opaque')
    assertProblem(
      await A.request('DELETE', `/users/${owner.id}`, { auth: access_token }),
      403,
      'current_password_required',
    )
    assert.ok(await userExists(owner.id))
  })

  test(
    'If-Match: a stale ETag with the right password is 412 and nothing changes; the current one ' + 'deletes',
    async () => {
      const owner = await account()
      const { access_token } = await login(owner)
      const got = await A.request('GET', `/users/${owner.id}`, { auth: access_token })
      const etag = got.headers.get('etag')!
      assert.equal(
        (await A.request('PATCH', `/users/${owner.id}`, { auth: access_token, body: { name: 'Moved On' } })).status,
        200,
      )
      const body = { current_password: owner.password }
      assertProblem(
        await A.request('DELETE', `/users/${owner.id}`, { auth: access_token, body, headers: { 'if-match': etag } }),
        412,
        'precondition_failed',
      )
      assert.ok(await userExists(owner.id))
      const current = (await A.request('GET', `/users/${owner.id}`, { auth: access_token })).headers.get('etag')!
      assert.equal(
        (
          await A.request('DELETE', `/users/${owner.id}`, {
            auth: access_token,
            body,
            headers: { 'if-match': current },
          })
        ).status,
        204,
      )
      assert.ok(!(await userExists(owner.id)))
    },
  )

  test('an admin deleting another user needs no body', async () => {
    const user = await account()
    assert.equal((await A.request('DELETE', `/users/${user.id}`)).status, 204)
    assert.ok(!(await userExists(user.id)))
  })

  test('hostile bodies on the DELETE: 4xx, the user stays, no failed login counted', async () => {
    const owner = await account()
    const { access_token } = await login(owner)
    const cases: HostileCase[] = [
      { body: { current_password: 12345678 }, status: 422 },
      { body: { current_password: ['pw'] }, status: 422 },
      { body: { current_password: '' }, status: 422 },
      { body: { current_password: 'x'.repeat(257) }, status: 422 },
      { body: { current_password: `${owner.password}\u0000` }, status: 422 },
      { body: { current_password: owner.password, force: true }, status: 422 },
      { body: 'null', status: 422 },
      { body: `{"current_password":"${'a'.repeat(1_100_000)}"}`, status: 413 },
      { body: '{"current_password":', status: 400 },
      { body: JSON.stringify({ current_password: owner.password }), status: 415, contentType: 'text/plain' },
    ]
    await sendHostile('DELETE', `/users/${owner.id}`, access_token, cases)
    assert.ok(await userExists(owner.id))
    assert.equal(await failuresOf(owner.email), 0)
  })
})

describe('/metrics needs metrics:read', () => {
  test(
    'an admin key scoped products:read: 403 insufficient_scope; metrics:read: 200; an admin JWT with its default ' +
      'scopes: 200',
    async () => {
      const admin = await account('admin')
      const { access_token } = await login(admin)
      const narrow = await newKey(access_token, ['products:read'])
      const res = await A.request('GET', '/metrics', withKey(narrow.key))
      assertProblem(res, 403, 'insufficient_scope')
      assert.equal(
        res.headers.get('www-authenticate'),
        'Bearer realm="api", error="insufficient_scope", scope="metrics:read"',
      )
      assert.doesNotMatch(res.text, /http_requests_total/)
      const scraper = await newKey(access_token, ['metrics:read'])
      assert.equal((await A.request('GET', '/metrics', withKey(scraper.key))).status, 200)
      assert.equal((await A.request('GET', '/metrics', { auth: access_token })).status, 200)
      assertProblem(
        await A.request('GET', '/metrics', { auth: A.jwtFor(admin.id, 'admin', ['products:read']) }),
        403,
        'insufficient_scope',
      )
    },
  )
})
