import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { createServer } from 'node:net'
import { after, before, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Sql } from 'postgres'
import { ApiKeyCache, MAX_AGE_MS, type CachedApiKey } from '../src/auth/api-keys/key-cache.js'
import { applyKeyChange } from '../src/auth/api-keys/key-changes.js'
import {
  CATCH_UP_TIMEOUT_MS,
  CHANGES_CHANNEL as KEY_CHANGES_CHANNEL,
} from '../src/auth/revocation/credential-changes.js'
import { LastUsedWrites } from '../src/auth/api-keys/last-used.js'
import { testPasswords } from './helpers/passwords.js'
import { connect } from '../src/core/db/connect.js'
import { createLogger } from '../src/core/log.js'
import { createService } from '../src/service.js'
import { createOrResetAdmin } from '../src/users/admin-bootstrap.js'
import { SECOND } from '../src/core/lib/durations.js'
import { freezeBackend } from './helpers/freeze.js'
import { startServer, type TestResponse, type TestServer } from './helpers/server.js'
import { boundFrom, timed } from './helpers/time-bounds.js'

// API keys without a database read per request, revocation across instances:
// two instances, A and B, of the real server on one database. A key is read
// once per instance and then costs no statement (last_used_at is still
// written, once a minute). Whatever revokes or changes a key through one
// instance (deleting it, deleting its user, changing the user's role), or
// directly in SQL, reaches both through PostgreSQL notifications sent by
// triggers at commit: the instance that made the change refuses the key from
// its answer on, the other as soon as it has heard (a moment later). When the
// connection that listens is lost, nothing is served from the cache until it
// is back, and then the cache starts empty, so revocations made meanwhile hold
// too; a listener that stops delivering is noticed too. Also: what the
// triggers announce (and what they do not), the cache's own rules, shutdown,
// and the listener with no database at all. Expiries come by moving the
// instances' clocks (and the rows, for the database's time), not by waiting.
//
// Top-level tests run one after another (node:test's default).

const A = await startServer()
const B = await startServer({}, {}, { databaseUrl: A.databaseUrl })
const { sql } = A

// ---------------------------------------------------------------------------
// Helpers

const REALM = 'Bearer realm="api"'
let sequence = 0
const unique = (tag: string) => `${tag}-${process.pid}-${++sequence}`

async function until(what: string, condition: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`)
    await sleep(10)
  }
}

await until('both instances listen for key changes', () => A.deps.apiKeyCache.active && B.deps.apiKeyCache.active)

function assertInvalidToken(res: TestResponse): void {
  assert.equal(res.status, 401, res.text)
  assert.equal(res.body.code, 'invalid_token')
  assert.equal(res.headers.get('www-authenticate'), `${REALM}, error="invalid_token"`)
}

/**
 * db_queries_total of an instance, scraped with A's admin JWT (a cached JWT:
 * no statement). A's admin stays admin throughout; B's is demoted below,
 * which ends its JWT.
 */
async function statements(server: TestServer): Promise<number> {
  const res = await server.request('GET', '/metrics', { auth: A.admin.token })
  assert.equal(res.status, 200)
  const m = /^db_queries_total ([0-9]+)$/m.exec(res.text)
  assert.ok(m, 'db_queries_total is exposed')
  return Number(m[1])
}

/** The statements `server` sent while `fn` ran. */
async function statementsDuring(server: TestServer, fn: () => Promise<void>): Promise<number> {
  const before = await statements(server)
  await fn()
  return (await statements(server)) - before
}

/**
 * Returns once `server` has applied every key change committed before the
 * call. A notification reaches each instance a moment after the commit; the
 * instance that made a change waits for it before answering, another instance
 * gets it at the same moment, but not in lockstep with a
 * client (src/auth/revocation/credential-changes.ts).
 */
const heard = (server: TestServer) => server.deps.credentialChanges.caughtUp()

const me = (server: TestServer, key: string) => server.request('GET', '/auth/me', { headers: { 'x-api-key': key } })

/** A key created through A for `auth` (default: A's admin). */
async function createKey(body: Record<string, unknown> = {}, auth?: string): Promise<{ key: string; id: number }> {
  const res = await A.request('POST', '/api-keys', {
    body: { name: unique('key'), scopes: ['users:read'], ...body },
    auth,
  })
  assert.equal(res.status, 201, res.text)
  return { key: res.body.key, id: res.body.id }
}

/** Uses the key on A and B, so that both have it cached; checks that a second use costs no statement for the key. */
async function cacheOnBoth(key: string): Promise<void> {
  // Changes announced by earlier steps (a deletion, a TRUNCATE) reach each instance asynchronously;
  // one arriving between the two uses below would empty the cache and make the second a read.
  // An `all` suspends the cache until the heartbeat has reloaded the revocations, and while it
  // is suspended `heard` returns at once (nothing remembered is trusted): wait for both.
  await until('both instances trust their cache again', () => A.deps.apiKeyCache.active && B.deps.apiKeyCache.active)
  await Promise.all([heard(A), heard(B)])
  for (const server of [A, B]) {
    assert.equal((await me(server, key)).status, 200)
    const handlerOnly = await statementsDuring(
      server,
      async () => void assert.equal((await me(server, key)).status, 200),
    )
    assert.equal(handlerOnly, 1, "the key came from the cache: only /auth/me's own query ran")
  }
}

const keyRow = async (id: number) =>
  (
    await sql<
      Array<{ id: number; last_used_at: string | null; expires_at: string | null }>
    >`SELECT id, last_used_at, expires_at FROM api_keys WHERE id = ${id}`
  )[0]

// ---------------------------------------------------------------------------

describe('a key in use costs no statement of its own', () => {
  test(
    "10 requests with a cached key send the statements of 10 with a JWT: the handler's, none for the " + 'key',
    async () => {
      const user = await A.createUser({ session: true })
      const { key } = await createKey({}, user.token)
      for (const server of [A, B]) {
        assert.equal((await me(server, key)).status, 200)
        const withKey = await statementsDuring(server, async () => {
          for (let i = 0; i < 10; i++) assert.equal((await me(server, key)).status, 200)
        })
        const withJwt = await statementsDuring(server, async () => {
          for (let i = 0; i < 10; i++)
            assert.equal((await server.request('GET', '/auth/me', { auth: user.token })).status, 200)
        })
        assert.equal(withKey, withJwt, `key: ${withKey} statements, JWT: ${withJwt}`)
        assert.equal(withKey, 10)
      }
    },
  )

  test(
    'the first use reads the key and writes last_used_at; the next uses within the minute write ' + 'nothing',
    async () => {
      const { key, id } = await createKey()
      assert.equal((await keyRow(id))!.last_used_at, null)
      const before = Date.now()
      const first = await statementsDuring(B, async () => void assert.equal((await me(B, key)).status, 200))
      const after = Date.now()
      assert.equal(first, 3, "the key lookup, the last_used_at write, /auth/me's query")
      const written = (await keyRow(id))!.last_used_at
      assert.ok(written, 'last_used_at is written')
      // The database's time of the write, which the request's span
      // holds (give or take the millisecond it is stored to).
      const span = `the request from ${new Date(before).toISOString()} to ${new Date(after).toISOString()}`
      assert.ok(
        Date.parse(written) >= before - 1 && Date.parse(written) <= after + 1,
        `last_used_at ${written}, ${span}`,
      )
      const next = await statementsDuring(B, async () => {
        for (let i = 0; i < 10; i++) assert.equal((await me(B, key)).status, 200)
      })
      assert.equal(next, 10)
      assert.equal((await keyRow(id))!.last_used_at, written)
      const listed = await A.request('GET', `/api-keys/${id}`)
      assert.equal(listed.body.last_used_at, written, 'GET /api-keys/{id} shows it')
    },
  )

  test(
    "another instance's first use within the minute sends the write, which the SQL guard makes change " + 'nothing',
    async () => {
      const { key, id } = await createKey()
      assert.equal((await me(A, key)).status, 200)
      const written = (await keyRow(id))!.last_used_at!
      await sleep(5)
      assert.equal((await me(B, key)).status, 200)
      assert.equal((await keyRow(id))!.last_used_at, written)
    },
  )

  test('a key unknown to the database is refused on every request, and never cached', async () => {
    const key = `upa_ak_${randomBytes(32).toString('base64url')}`
    const size = B.deps.apiKeyCache.size
    for (let i = 0; i < 3; i++) assertInvalidToken(await me(B, key))
    assert.equal(B.deps.apiKeyCache.size, size)
  })
})

describe('revocation through one instance holds at once on both', () => {
  test(
    'a key deleted through A: the very next request on A is 401, and on B once it has heard (the moment A ' +
      'answered)',
    async () => {
      const { key, id } = await createKey()
      await cacheOnBoth(key)
      assert.equal((await A.request('DELETE', `/api-keys/${id}`)).status, 204)
      assertInvalidToken(await me(A, key))
      await heard(B)
      assertInvalidToken(await me(B, key))
      assert.equal(await keyRow(id), undefined)
    },
  )

  test(
    "a user's role lowered through A: role user at once (403 where admin is needed), on A and on B; raised again, " +
      'admin',
    async () => {
      const admin = await A.createUser({ role: 'admin', session: true })
      const { key } = await createKey({ scopes: ['users:read', 'users:write'] }, admin.token)
      await cacheOnBoth(key)
      const listUsers = (server: TestServer) =>
        server.request('GET', '/users?limit=1', { headers: { 'x-api-key': key } })
      assert.equal((await listUsers(B)).status, 200)

      const demoted = await A.request('PATCH', `/users/${admin.id}`, { body: { role: 'user' } })
      assert.equal(demoted.status, 200, demoted.text)
      const denied = await listUsers(A)
      assert.equal(denied.status, 403, denied.text)
      assert.equal(denied.body.code, 'forbidden')
      await heard(B)
      assert.equal((await listUsers(B)).status, 403)
      assert.equal((await me(B, key)).body.user.role, 'user')
      const [{ role }] = await sql<[{ role: string }]>`SELECT role FROM users WHERE id = ${admin.id}`
      assert.equal(role, 'user')

      const promoted = await A.request('PUT', `/users/${admin.id}`, {
        body: { name: 'Again Admin', email: admin.email, role: 'admin' },
      })
      assert.equal(promoted.status, 200, promoted.text)
      assert.equal((await listUsers(A)).status, 200)
      await heard(B)
      assert.equal((await listUsers(B)).status, 200)
    },
  )

  test('a user deleted through A: its key is 401 at once, on A and on B', async () => {
    const user = await A.createUser({ session: true })
    const { key, id } = await createKey({}, user.token)
    await cacheOnBoth(key)
    assert.equal((await A.request('DELETE', `/users/${user.id}`)).status, 204)
    assertInvalidToken(await me(A, key))
    await heard(B)
    assertInvalidToken(await me(B, key))
    assert.equal(await keyRow(id), undefined)
  })

  test(
    'a request that revokes answers only once its instance has heard the change: one statement more, a ' + 'marker',
    async () => {
      const { key, id } = await createKey()
      await cacheOnBoth(key)
      // DELETE /api-keys/{id}: the delete (scoped to the key's owner
      // unless an admin asks), and pg_notify of the marker.
      const sent = await statementsDuring(
        A,
        async () => void assert.equal((await A.request('DELETE', `/api-keys/${id}`)).status, 204),
      )
      assert.equal(sent, 2)
      assertInvalidToken(await me(A, key))
    },
  )

  test(
    "`make admin` does not promote an existing user: refused, and its key keeps its user's rights on " + 'both',
    async () => {
      const user = await A.createUser({ session: true })
      const { key } = await createKey({}, user.token)
      await cacheOnBoth(key)
      assert.equal((await B.request('GET', '/users?limit=1', { headers: { 'x-api-key': key } })).status, 403)
      await assert.rejects(
        createOrResetAdmin(sql, testPasswords, user.email, 'a-new-password-for-the-admin'),
        /not an admin/,
      )
      await heard(B)
      for (const server of [A, B])
        assert.equal((await server.request('GET', '/users?limit=1', { headers: { 'x-api-key': key } })).status, 403)
    },
  )

  test(
    'changes made in SQL, not through the API, hold at once too: expiry moved back, scopes narrowed, role ' + 'changed',
    async () => {
      const admin = await A.createUser({ role: 'admin', session: true })
      const { key, id } = await createKey({ scopes: ['users:read', 'api_keys:read'] }, admin.token)
      await cacheOnBoth(key)

      await sql`UPDATE api_keys SET scopes = ${['users:read']} WHERE id = ${id}`
      await heard(B)
      assert.deepEqual((await me(B, key)).body.credential.scopes, ['users:read'])
      await cacheOnBoth(key)
      await sql`UPDATE users SET role = 'user' WHERE id = ${admin.id}`
      await heard(B)
      assert.equal((await B.request('GET', '/users?limit=1', { headers: { 'x-api-key': key } })).status, 403)
      await cacheOnBoth(key)
      await sql`UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE id = ${id}`
      await Promise.all([heard(A), heard(B)])
      assertInvalidToken(await me(B, key))
      assertInvalidToken(await me(A, key))
    },
  )

  test(
    'a change rolled back notifies nobody: the key is still served from the cache, with no statement of its ' + 'own',
    async () => {
      const { key, id } = await createKey()
      await cacheOnBoth(key)
      await assert.rejects(
        sql.begin(async (tx) => {
          await tx`DELETE FROM api_keys WHERE id = ${id}`
          throw new Error('roll back')
        }),
        /roll back/,
      )
      await heard(B)
      const handlerOnly = await statementsDuring(B, async () => void assert.equal((await me(B, key)).status, 200))
      assert.equal(handlerOnly, 1)
      assert.ok(await keyRow(id))
    },
  )
})

describe('expiry', () => {
  test('a cached key is refused once its expires_at passes, without a database read; the row stays', async () => {
    // Far enough ahead for the key to be cached on both before, on a busy machine too.
    const expires = new Date(A.clock.now() + 30 * SECOND)
    const { key, id } = await createKey({ expires_at: expires.toISOString() })
    await cacheOnBoth(key)
    // Both instances' clocks at its expires_at; the database's time is not there yet, so a refusal is the cache's.
    for (const server of [A, B]) server.clock.advance(expires.getTime() - server.clock.now())
    for (const server of [A, B]) {
      const refusedFromCache = await statementsDuring(server, async () => assertInvalidToken(await me(server, key)))
      assert.equal(refusedFromCache, 0, 'refused from the cached expires_at')
    }
    assert.equal((await keyRow(id))!.expires_at, expires.toISOString())
    // An instance that has not cached it refuses it from the database, once the database's time has passed it as well.
    const passed = B.clock.now() - Date.now()
    await sql`UPDATE api_keys SET expires_at = expires_at - ${passed} * interval '1 millisecond' WHERE id = ${id}`
    B.deps.apiKeyCache.clear()
    assertInvalidToken(await me(B, key))
  })
})

describe('the listener', () => {
  /**
   * The backends listening for key changes on this database, but `except` (e.g. an observer of this file): an
   * instance's listening connection (its last statement a LISTEN: of this channel, or of `events`, which it listens to
   * on the same connection), not its webhook worker's (test/helpers/freeze.ts tells them apart the same way).
   */
  const listeners = async (except: number[] = []) =>
    (
      await sql<Array<{ pid: number }>>`
      SELECT pid FROM pg_stat_activity
      WHERE datname = current_database() AND (query
      ILIKE ${'listen %' + KEY_CHANGES_CHANNEL + '%'} OR query ILIKE 'listen "events"')
        AND pid <> ALL(${except})`
    ).map((r) => r.pid)

  test(
    'listener backends killed while no connection may be opened: nothing served from the cache, revocations made ' +
      'meanwhile hold; back, the cache starts empty',
    async () => {
      const revoked = await createKey()
      const kept = await createKey()
      await cacheOnBoth(revoked.key)
      await cacheOnBoth(kept.key)
      assert.equal((await listeners()).length, 2, 'A and B listen')

      const [{ db }] = await sql<[{ db: string }]>`SELECT current_database() AS db`
      // From another database: PostgreSQL refuses this for the database one is connected to.
      const server = connect(process.env.TEST_SERVER_URL!, { max: 1, statementTimeoutMs: 10_000 })
      after(() => server.end({ timeout: 5 }))
      await server`ALTER DATABASE ${server(db)} ALLOW_CONNECTIONS false`
      try {
        const killed = await sql<
          Array<{ ok: boolean }>
        >`SELECT pg_terminate_backend(pid, 5000) AS ok FROM pg_stat_activity WHERE pid = ANY(${await listeners()})`
        assert.deepEqual(
          killed.map((k) => k.ok),
          [true, true],
        )
        await until('both caches are off', () => !A.deps.apiKeyCache.active && !B.deps.apiKeyCache.active)
        assert.equal(B.deps.apiKeyCache.size, 0)

        // Revoked through A while nobody listens: the notification is lost, the revocation must hold anyway.
        assert.equal((await A.request('DELETE', `/api-keys/${revoked.id}`)).status, 204)
        assertInvalidToken(await me(B, revoked.key))
        const read = await statementsDuring(B, async () => void assert.equal((await me(B, kept.key)).status, 200))
        // Nothing remembered is trusted while nobody listens: the JWT
        // that scrapes /metrics is checked in the database too.
        assert.equal(
          read,
          3,
          "the kept key is read from the database (and /auth/me's query, and the scraping JWT's revocation check)",
        )
        assert.equal(B.deps.apiKeyCache.size, 0, 'nothing is cached while away')
      } finally {
        await server`ALTER DATABASE ${server(db)} ALLOW_CONNECTIONS true`
      }

      await until('both caches are on again', () => A.deps.apiKeyCache.active && B.deps.apiKeyCache.active)
      assert.equal((await listeners()).length, 2)
      assertInvalidToken(await me(B, revoked.key))
      assertInvalidToken(await me(A, revoked.key))
      await cacheOnBoth(kept.key)
      for (const server of [A, B]) {
        assert.ok(
          server.logs.some((l) => l.level === 'warn' && /not listening for credential changes/.test(String(l.msg))),
        )
        assert.ok(server.logs.some((l) => l.level === 'info' && /credential changes heard again/.test(String(l.msg))))
      }
    },
  )

  test(
    'a listener backend killed and back at once: the cache is emptied, and a key deleted in between is ' + 'refused',
    async () => {
      const { key, id } = await createKey()
      await cacheOnBoth(key)
      const reconnects = (server: TestServer) =>
        server.logs.filter((l) => /credential changes heard again/.test(String(l.msg))).length
      const before = [reconnects(A), reconnects(B)]
      // Killed and the key deleted in one transaction: its notification is sent at commit, after the listener is gone.
      await sql.begin(async (tx) => {
        await tx`SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE pid = ANY(${await listeners()})`
        await tx`DELETE FROM api_keys WHERE id = ${id}`
      })
      assertInvalidToken(await me(B, key))
      await until('B listens again', () => reconnects(B) > before[1]! && B.deps.apiKeyCache.active)
      assertInvalidToken(await me(B, key))
      // A's listener was killed too: the next test counts listener backends, and must not see A's come back during it.
      await until('A listens again', () => reconnects(A) > before[0]! && A.deps.apiKeyCache.active)
    },
  )

  test('shutdown ends the listener with the pool, within its bound, without a warning', async () => {
    const before = await listeners()
    const logs: Array<Record<string, unknown>> = []
    const service = createService(
      { ...A.deps.config, poolMax: 2, statementTimeoutMs: 10_000, shutdownTimeoutMs: 3000 },
      { log: createLogger('debug', (line) => void logs.push(JSON.parse(line))) },
    )
    await service.listen(0, '127.0.0.1')
    await until('the new instance listens', () => service.deps.apiKeyCache.active)
    assert.equal((await listeners(before)).length, 1)
    const started = performance.now()
    await service.shutdown()
    assert.ok(performance.now() - started < 3000, 'within SHUTDOWN_TIMEOUT')
    await until('its listener backend is gone', async () => (await listeners(before)).length === 0)
    assert.deepEqual(
      logs.filter((l) => l.level === 'warn' || l.level === 'error'),
      [],
    )
  })

  test(
    'a listener that stops delivering (its backend frozen): the revoking request answers after the time-out, the ' +
      'cache is off until a marker of its comes back',
    async (t) => {
      const before = await listeners()
      const C = await startServer({}, {}, { databaseUrl: A.databaseUrl })
      await until('C listens', () => C.deps.apiKeyCache.active)
      const [pid] = await listeners(before)
      assert.ok(pid)
      const { key, id } = await createKey()
      // The baseline: a revoking request through C while its listener delivers.
      const other = await createKey()
      const revoke = async (keyId: number) =>
        assert.equal((await C.request('DELETE', `/api-keys/${keyId}`)).status, 204)
      const baseline = await timed(() => revoke(other.id))
      const thaw = await freezeBackend(sql, pid)
      if (!thaw) return t.skip('the database server is not a process of this machine')
      try {
        assert.equal((await me(C, key)).status, 200)
        assert.equal((await me(C, key)).status, 200)
        const started = performance.now()
        await revoke(id)
        const waited = performance.now() - started
        // Never before the time-out; after it, within a second, or five times what the request took with nothing wrong.
        const bound = CATCH_UP_TIMEOUT_MS + boundFrom(baseline)
        assert.ok(
          waited >= CATCH_UP_TIMEOUT_MS - 50 && waited < bound,
          `answered after ${Math.round(waited)} ms (bound ${Math.round(bound)} ms)`,
        )
        assert.equal(C.deps.apiKeyCache.active, false)
        assertInvalidToken(await me(C, key))
        assert.ok(C.logs.some((l) => l.level === 'warn' && /did not hear this instance/.test(String(l.msg))))
      } finally {
        thaw()
      }
      await until('C caught up', () => C.deps.apiKeyCache.active)
      assert.ok(C.logs.some((l) => l.level === 'info' && /heard again/.test(String(l.msg))))
      assertInvalidToken(await me(C, key))
    },
  )

  test(
    'with no database at all: no exception, no unhandled rejection, one warning, the cache stays off; the pool ' +
      'ends',
    async () => {
      const problems: unknown[] = []
      const onProblem = (err: unknown) => void problems.push(err)
      process.on('unhandledRejection', onProblem)
      process.on('uncaughtException', onProblem)
      // Where the database would be, nothing but a socket that resets every connection at once, counting them.
      let attempts = 0
      const nothing = createServer((socket) => {
        attempts++
        socket.resetAndDestroy()
      })
      await new Promise<void>((resolve) => nothing.listen(0, '127.0.0.1', resolve))
      try {
        const logs: Array<Record<string, unknown>> = []
        const databaseUrl = `postgres://postgres@127.0.0.1:${(nothing.address() as { port: number }).port}/none`
        const service = createService(
          { ...A.deps.config, databaseUrl, poolMax: 1, statementTimeoutMs: 1000 },
          { log: createLogger('debug', (line) => void logs.push(JSON.parse(line))) },
        )
        const { deps } = service
        // The listener alone: listen() would fail at once (the pool's
        // first connection), which is what start-up should do.
        deps.credentialChanges.start()
        await until('several attempts to connect', () => attempts >= 3)
        assert.equal(deps.apiKeyCache.active, false)
        assert.equal(logs.filter((l) => l.level === 'warn').length, 1, JSON.stringify(logs))
        assert.equal(logs.filter((l) => l.level === 'error').length, 0)
        const hung = sleep(7000, undefined, { ref: false }).then(() => assert.fail('close() hung'))
        await Promise.race([service.close(), hung])
        // A rejection left behind would come with postgres.js's next
        // attempt, at most 250 ms away (this pool's backoff).
        await sleep(500)
      } finally {
        nothing.close()
        process.off('unhandledRejection', onProblem)
        process.off('uncaughtException', onProblem)
      }
      assert.deepEqual(problems.map(String), [])
    },
  )
})

describe('what the triggers announce', () => {
  // An observer of its own, and a sentinel on another channel: notifications
  // reach a session in commit order, so when the sentinel arrives, whatever
  // the statement before it announced has arrived too.
  let observer: Sql
  const seen: string[] = []
  let sentinels = 0

  /** Returns once the observer has every notification committed before this call. */
  async function caughtUp(): Promise<void> {
    const n = ++sentinels
    await sql`SELECT pg_notify('api_key_cache_test_sentinel', ${String(n)})`
    await until(`sentinel ${n}`, () => seen.includes(`sentinel ${n}`))
  }

  /** What `change` announced on the channel. */
  async function announced(change: () => Promise<unknown>): Promise<string[]> {
    await caughtUp()
    seen.length = 0
    await change()
    await caughtUp()
    // Leaves out the markers of the instances' caughtUp and heartbeats (see 'a request that revokes answers only
    // once…'), and the revocations of sessions and JWTs, which test/revocation.test.ts follows.
    return seen.filter(
      (s) =>
        !s.startsWith('sentinel ') && !s.startsWith('sync ') && !s.startsWith('sessions ') && !s.startsWith('epochs '),
    )
  }

  before(async () => {
    observer = connect(A.databaseUrl, { max: 1, statementTimeoutMs: 10_000 })
    await observer.listen(KEY_CHANGES_CHANNEL, (payload) => void seen.push(payload))
    await observer.listen('api_key_cache_test_sentinel', (payload) => void seen.push(`sentinel ${payload}`))
  })
  after(() => observer.end({ timeout: 5 }))

  test('a key deleted: keys <id>; several in one statement: one notification', async () => {
    const one = await createKey()
    assert.deepEqual(await announced(() => sql`DELETE FROM api_keys WHERE id = ${one.id}`), [`keys ${one.id}`])
    const two = [await createKey(), await createKey()].map((k) => k.id)
    const [payload, ...more] = await announced(() => sql`DELETE FROM api_keys WHERE id = ANY(${two})`)
    assert.deepEqual(more, [])
    assert.deepEqual(
      payload!
        .replace(/^keys /, '')
        .split(',')
        .map(Number)
        .sort(),
      [...two].sort(),
    )
  })

  test('last_used_at, name or nothing changed: no notification; scopes, expiry or owner: keys <id>', async () => {
    const { id } = await createKey()
    assert.deepEqual(await announced(() => sql`UPDATE api_keys SET last_used_at = now() WHERE id = ${id}`), [])
    assert.deepEqual(await announced(() => sql`UPDATE api_keys SET name = 'renamed' WHERE id = ${id}`), [])
    assert.deepEqual(await announced(() => sql`UPDATE api_keys SET scopes = scopes WHERE id = ${id}`), [])
    assert.deepEqual(await announced(() => sql`UPDATE api_keys SET scopes = ${['api_keys:read']} WHERE id = ${id}`), [
      `keys ${id}`,
    ])
    assert.deepEqual(
      await announced(() => sql`UPDATE api_keys SET expires_at = now() + interval '1 day' WHERE id = ${id}`),
      [`keys ${id}`],
    )
    const other = await A.createUser({ session: true })
    assert.deepEqual(await announced(() => sql`UPDATE api_keys SET user_id = ${other.id} WHERE id = ${id}`), [
      `keys ${id}`,
    ])
  })

  test("a user's name changed: nothing; its role: users <id>; the same role again: nothing", async () => {
    const user = await A.createUser({ session: true })
    assert.deepEqual(await announced(() => sql`UPDATE users SET name = 'Renamed' WHERE id = ${user.id}`), [])
    assert.deepEqual(await announced(() => sql`UPDATE users SET role = 'admin' WHERE id = ${user.id}`), [
      `users ${user.id}`,
    ])
    assert.deepEqual(await announced(() => sql`UPDATE users SET role = 'admin' WHERE id = ${user.id}`), [])
    assert.deepEqual(
      await announced(() => createOrResetAdmin(sql, testPasswords, user.email, 'yet-another-password')),
      [],
      'already an admin',
    )
    await sql`UPDATE users SET role = 'user' WHERE id = ${user.id}`
    assert.deepEqual(
      await announced(() =>
        assert.rejects(createOrResetAdmin(sql, testPasswords, user.email, 'yet-another-password'), /not an admin/),
      ),
      [],
      'a plain user is not promoted',
    )
  })

  test('a user deleted through the API: its keys and the user', async () => {
    const user = await A.createUser({ session: true })
    const { id } = await createKey({}, user.token)
    const payloads = await announced(() => A.request('DELETE', `/users/${user.id}`))
    assert.deepEqual(payloads.sort(), [`keys ${id}`, `users ${user.id}`])
  })

  test(
    'a refused change (409 last_admin) and a rolled-back one: nothing; several users demoted in one statement: ' +
      'one notification',
    async () => {
      const admins = (
        await sql<Array<{ id: number }>>`SELECT id FROM users WHERE role = 'admin' AND id <> ${A.admin.id} ORDER BY id`
      ).map((r) => r.id)
      assert.ok(admins.length >= 2)
      assert.deepEqual(
        await announced(() => sql`UPDATE users SET role = 'user' WHERE role = 'admin' AND id <> ${A.admin.id}`),
        [`users ${admins.join(',')}`],
      )
      // Deleting oneself takes the password: the file's admin is given one (which voids its JWTs: a new one).
      const password = 'api-key-cache-admin-password'
      await sql`UPDATE users SET password_hash = ${await A.deps.passwords.hash(password)} WHERE id = ${A.admin.id}`
      await A.renewAdminToken()
      const deleteSelf = () => A.request('DELETE', `/users/${A.admin.id}`, { body: { current_password: password } })
      assert.deepEqual(await announced(async () => assert.equal((await deleteSelf()).status, 409)), [])
      const { id } = await createKey()
      const rolledBack = () =>
        sql.begin(async (tx) => {
          await tx`DELETE FROM api_keys WHERE id = ${id}`
          throw new Error('roll back')
        })
      assert.deepEqual(await announced(() => assert.rejects(rolledBack(), /roll back/)), [])
      assert.ok(await keyRow(id))
    },
  )

  test('too many ids for one payload: all, and every instance forgets every key', async () => {
    const owner = await A.createUser({ session: true })
    await sql`
      INSERT INTO api_keys (user_id, name, prefix, key_hash, scopes)
      SELECT ${owner.id}, 'bulk ' || g, 'upa_ak_bulk', sha256(convert_to('bulk-' || g || '-'
        || ${unique('bulk')}, 'UTF8')), '{users:read}'
      FROM generate_series(1, 2000) g`
    const { key } = await createKey()
    await cacheOnBoth(key)
    assert.deepEqual(await announced(() => sql`DELETE FROM api_keys WHERE name LIKE 'bulk %'`), ['all'])
    await Promise.all([heard(A), heard(B)])
    assert.equal(A.deps.apiKeyCache.size, 0)
    assert.equal(B.deps.apiKeyCache.size, 0)
    assert.equal((await me(B, key)).status, 200, 'a key not deleted is read again')
  })

  test('TRUNCATE: all; every key is refused', async () => {
    const { key } = await createKey()
    await cacheOnBoth(key)
    assert.deepEqual(await announced(() => sql`TRUNCATE api_keys`), ['all'])
    await heard(B)
    assertInvalidToken(await me(B, key))
  })
})

// ---------------------------------------------------------------------------
// The parts on their own

describe('ApiKeyCache', () => {
  const entry = (apiKeyId: number, userId: number, expiresAt: number | null = null): CachedApiKey => ({
    principal: {
      kind: 'user',
      userId: String(userId),
      role: 'user',
      scopes: new Set(),
      credential: { type: 'api_key', expiresAt: null, apiKeyId },
    },
    userId,
    apiKeyId,
    expiresAt,
  })
  const active = (max = 10) => {
    const cache = new ApiKeyCache(max)
    cache.resume()
    return cache
  }

  test('an entry is served for MAX_AGE_MS, then read again', () => {
    let now = 1_000_000
    const cache = new ApiKeyCache(10, () => now)
    cache.resume()
    cache.remember('h', entry(1, 1), cache.generation)
    now += MAX_AGE_MS - 1
    assert.ok(typeof cache.lookup('h', now) === 'object')
    now += 1
    assert.equal(cache.lookup('h', now), undefined)
    assert.equal(cache.size, 0)
  })

  test('serves nothing and keeps nothing until resumed, and again once suspended', () => {
    const cache = new ApiKeyCache(10)
    cache.remember('h1', entry(1, 1), cache.generation)
    assert.equal(cache.lookup('h1', 0), undefined)
    assert.equal(cache.size, 0)
    cache.resume()
    cache.remember('h1', entry(1, 1), cache.generation)
    assert.ok(cache.lookup('h1', 0))
    cache.suspend()
    assert.equal(cache.lookup('h1', 0), undefined)
    assert.equal(cache.size, 0)
    cache.resume()
    assert.equal(cache.lookup('h1', 0), undefined, 'resumed empty')
  })

  test('a read that began before an eviction is not kept (it may hold a revoked key)', () => {
    const cache = active()
    const generation = cache.generation
    cache.evictKeys([1])
    cache.remember('h1', entry(1, 1), generation)
    assert.equal(cache.size, 0)
    const beforeReconnect = cache.generation
    cache.suspend()
    cache.resume()
    cache.remember('h1', entry(1, 1), beforeReconnect)
    assert.equal(cache.size, 0)
  })

  test('evicts by key id and by user id, and only those', () => {
    const cache = active()
    cache.remember('a', entry(1, 10), cache.generation)
    cache.remember('b', entry(2, 10), cache.generation)
    cache.remember('c', entry(3, 20), cache.generation)
    cache.evictKeys([3, 99])
    assert.deepEqual(
      ['a', 'b', 'c'].map((h) => cache.lookup(h, 0) !== undefined),
      [true, true, false],
    )
    cache.evictUsers([10])
    assert.equal(cache.size, 0)
  })

  test("expired: 'expired' from expires_at on, and the entry stays", () => {
    const cache = active()
    cache.remember('h', entry(1, 1, 5000), cache.generation)
    assert.ok(typeof cache.lookup('h', 4999) === 'object')
    assert.equal(cache.lookup('h', 5000), 'expired')
    assert.equal(cache.lookup('h', 9000), 'expired')
    assert.equal(cache.size, 1)
  })

  test('keeps at most max entries, the oldest leaving first, with its indexes', () => {
    const cache = active(3)
    for (let i = 1; i <= 5; i++) cache.remember(`h${i}`, entry(i, 100 + i), cache.generation)
    assert.equal(cache.size, 3)
    assert.deepEqual(
      [1, 2, 3, 4, 5].map((i) => cache.lookup(`h${i}`, 0) !== undefined),
      [false, false, true, true, true],
    )
    cache.remember('h5', entry(5, 105), cache.generation)
    assert.equal(cache.size, 3, 'the same key again takes no second place')
    cache.evictUsers([101, 102])
    assert.equal(cache.size, 3)
    assert.throws(() => new ApiKeyCache(0), RangeError)
  })

  const payloads: Array<[string, string[]]> = [
    ['keys 1', ['b', 'c']],
    ['keys 1,3', ['b']],
    ['users 10', ['c']],
    ['users 10,20', []],
    ['all', []],
    ['something new', []],
    ['keys', []],
    ['keys 1;DROP', []],
  ]
  for (const [payload, left] of payloads) {
    test(`notification ${JSON.stringify(payload)} leaves ${JSON.stringify(left)}`, () => {
      const cache = active()
      cache.remember('a', entry(1, 10), cache.generation)
      cache.remember('b', entry(2, 10), cache.generation)
      cache.remember('c', entry(3, 20), cache.generation)
      applyKeyChange(cache, payload)
      assert.deepEqual(
        ['a', 'b', 'c'].filter((h) => cache.lookup(h, 0) !== undefined),
        left,
      )
    })
  }
})

describe('LastUsedWrites', () => {
  test('once a minute per key: at 0, not at 59.999 s, again at 60 s', () => {
    const writes = new LastUsedWrites(10)
    assert.equal(writes.claim(1, 0), true)
    assert.equal(writes.claim(1, 59_999), false)
    assert.equal(writes.claim(2, 59_999), true, 'another key')
    assert.equal(writes.claim(1, 60_000), true)
    assert.equal(writes.claim(1, 60_001), false)
  })

  test('a failed write is tried again at the next use', () => {
    const writes = new LastUsedWrites(10)
    assert.equal(writes.claim(1, 0), true)
    writes.failed(1)
    assert.equal(writes.claim(1, 1), true)
  })

  test('keeps at most max keys, forgetting the one written longest ago', () => {
    const writes = new LastUsedWrites(2)
    writes.claim(1, 0)
    writes.claim(2, 1)
    writes.claim(3, 2)
    assert.equal(writes.size, 2)
    assert.equal(writes.claim(1, 3), true, 'key 1 was forgotten')
    assert.equal(writes.claim(3, 4), false)
  })
})
