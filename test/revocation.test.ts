import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { CATCH_UP_TIMEOUT_MS, HEARTBEAT_MS } from '../src/auth/revocation/credential-changes.js'
import { applyRevocation, ENTRY_LIFETIME_MS, RevocationList } from '../src/auth/revocation/revocations.js'
import { passwordAccount, passwordLogin, type Account } from './helpers/accounts.js'
import { freezeBackend, instanceAndListener } from './helpers/freeze.js'
import { assertInvalidToken, refusedEverywhere as refusedOnAll } from './helpers/refused.js'
import { startServer, type TestResponse, type TestServer } from './helpers/server.js'
import { boundFrom, hearingMs, propagationBound } from './helpers/time-bounds.js'

// Withdrawn access stops at once, for every credential, on every instance:
// two instances, A and B, of the real server on one database, as behind a
// load balancer. Each attack is made the way an attacker holding a credential
// would: a demoted or deleted admin's JWT, a JWT after logout, logout-all or a
// password change, a stolen token changing the password without knowing it.
// The instance that makes a change refuses the credential from its answer on;
// the other within a second (or five times what hearing a change takes it
// when nothing is wrong, measured first, on a slower machine). An instance that cannot prove it hears changes
// reads revocation from the database instead (it fails closed).
//
// Top-level tests run one after another (node:test's default).

const A = await startServer()
const B = await startServer({}, {}, { databaseUrl: A.databaseUrl })
const { sql } = A
const both = [A, B]

const unique = () => randomBytes(5).toString('hex')

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.equal(res.body.code, code, res.text)
}

const me = (server: TestServer, auth: string) => server.request('GET', '/auth/me', { auth })

const account = (role: 'admin' | 'user' = 'user') => passwordAccount(A, role)
const login = (who: Account, format: 'jwt' | 'opaque' = 'jwt', on: TestServer = A, userAgent = 'revocation-test') =>
  passwordLogin(on, who, format, { 'user-agent': userAgent })

const refresh = (token: string, on: TestServer = A) =>
  on.request('POST', '/auth/refresh', { auth: null, body: { refresh_token: token } })

/** Every instance refuses `auth` within `withinMs` (a propagationBound, measured before the change). */
const refusedEverywhere = (auth: string, withinMs: number) => refusedOnAll(both, (server) => me(server, auth), withinMs)

async function until(what: string, condition: () => boolean | Promise<boolean>, timeoutMs = 10_000): Promise<number> {
  const started = performance.now()
  while (!(await condition())) {
    if (performance.now() - started > timeoutMs) throw new Error(`timed out waiting until ${what}`)
    await sleep(10)
  }
  return performance.now() - started
}

/** db_queries_total of an instance, scraped with A's admin JWT (checked in memory while trusted). */
async function statements(server: TestServer): Promise<number> {
  const res = await server.request('GET', '/metrics', { auth: A.admin.token })
  assert.equal(res.status, 200, res.text)
  return Number(/^db_queries_total ([0-9]+)$/m.exec(res.text)![1])
}

// ---------------------------------------------------------------------------

describe('a demoted or deleted admin', () => {
  test(
    'demoted through A: its JWT is refused at once on A and within a second on B; it cannot promote itself back, ' +
      'create an admin or delete the admin who demoted it',
    async (t) => {
      const mallory = await account('admin')
      const { access_token: jwt } = await login(mallory)
      for (const server of both)
        assert.equal((await server.request('GET', '/users?limit=1', { auth: jwt })).status, 200)
      const within = await propagationBound(both)

      const demoted = await A.request('PATCH', `/users/${mallory.id}`, { body: { role: 'user' } })
      assert.equal(demoted.status, 200, demoted.text)
      // On A from the answer on: no retry, no wait.
      assertInvalidToken(await A.request('PATCH', `/users/${mallory.id}`, { auth: jwt, body: { role: 'admin' } }))
      const took = await refusedEverywhere(jwt, within)
      t.diagnostic(`refused on A and B ${took.toFixed(1)} ms after the demotion's answer (bound ${within} ms)`)
      for (const server of both) {
        assertInvalidToken(
          await server.request('PATCH', `/users/${mallory.id}`, { auth: jwt, body: { role: 'admin' } }),
        )
        assertInvalidToken(
          await server.request('POST', '/users', {
            auth: jwt,
            body: { name: 'Sock Puppet', email: `puppet-${unique()}@example.com`, role: 'admin' },
          }),
        )
        assertInvalidToken(await server.request('DELETE', `/users/${A.admin.id}`, { auth: jwt }))
      }
      const [row] = await sql<[{ role: string }]>`SELECT role FROM users WHERE id = ${mallory.id}`
      assert.equal(row.role, 'user')
      assert.equal((await sql`SELECT 1 FROM users WHERE name = 'Sock Puppet'`).length, 0)
      assert.equal((await sql`SELECT 1 FROM users WHERE id = ${A.admin.id}`).length, 1)
    },
  )

  test(
    'a role changed in SQL (no API involved) voids its JWTs too; a refresh then issues what the new role ' + 'allows',
    async () => {
      const user = await account('admin')
      const pair = await login(user, 'jwt', B)
      const within = await propagationBound(both)
      await sql`UPDATE users SET role = 'user' WHERE id = ${user.id}`
      await refusedEverywhere(pair.access_token, within)
      const renewed = await refresh(pair.refresh_token, B)
      assert.equal(renewed.status, 200, renewed.text)
      assert.equal((await me(A, renewed.body.access_token)).body.user.role, 'user')
      assertProblem(await A.request('GET', '/users?limit=1', { auth: renewed.body.access_token }), 403, 'forbidden')
    },
  )

  test('deleted: its JWT, opaque token and refresh token stop on both', async () => {
    const gone = await account('admin')
    const jwt = await login(gone)
    const opaque = await login(gone, 'opaque', B)
    const within = await propagationBound(both)
    assert.equal((await A.request('DELETE', `/users/${gone.id}`)).status, 204)
    assertInvalidToken(await me(A, jwt.access_token))
    await refusedEverywhere(jwt.access_token, within)
    await refusedEverywhere(opaque.access_token, within)
    for (const server of both) {
      assertInvalidToken(await refresh(jwt.refresh_token, server))
      assertInvalidToken(await refresh(opaque.refresh_token, server))
    }
  })
})

describe('logout, logout-all, sessions', () => {
  test(
    'POST /auth/logout with a JWT ends its session: the JWT and its refresh token stop on both; another session ' +
      'of the user goes on',
    async () => {
      const user = await account()
      const ended = await login(user)
      const other = await login(user, 'jwt', B)
      const within = await propagationBound(both)
      assert.equal((await B.request('POST', '/auth/logout', { auth: ended.access_token })).status, 204)
      assertInvalidToken(await me(B, ended.access_token))
      await refusedEverywhere(ended.access_token, within)
      assertInvalidToken(await refresh(ended.refresh_token))
      for (const server of both) assert.equal((await me(server, other.access_token)).status, 200)
    },
  )

  test(
    'POST /auth/logout-all ends every JWT, opaque token and refresh token of the caller on both; other users are ' +
      'untouched',
    async () => {
      const user = await account()
      const bystander = await account()
      const sessions = [await login(user), await login(user, 'opaque', B), await login(user, 'jwt', B)]
      const theirs = await login(bystander)
      const within = await propagationBound(both)
      const res = await A.request('POST', '/auth/logout-all', { auth: sessions[2]!.access_token })
      assert.equal(res.status, 204, res.text)
      assert.equal(res.headers.get('cache-control'), 'no-store')
      for (const s of sessions) {
        await refusedEverywhere(s.access_token, within)
        assertInvalidToken(await refresh(s.refresh_token, B))
      }
      const [{ live }] = await sql<
        [{ live: number }]
      >`SELECT count(*)::int AS live FROM sessions WHERE user_id = ${user.id} AND revoked_at IS NULL`
      assert.equal(live, 0)
      for (const server of both) assert.equal((await me(server, theirs.access_token)).status, 200)
      // A new login works at once: the epoch moved on, the new JWT carries it.
      const fresh = await login(user, 'jwt', B)
      for (const server of both) assert.equal((await me(server, fresh.access_token)).status, 200)
    },
  )

  test('an API key cannot log its owner out everywhere: 403, nothing ended', async () => {
    const user = await account()
    const pair = await login(user)
    const key = (
      await A.request('POST', '/api-keys', { auth: pair.access_token, body: { name: 'prog', scopes: ['users:read'] } })
    ).body.key
    assertProblem(
      await A.request('POST', '/auth/logout-all', { auth: null, headers: { 'x-api-key': key } }),
      403,
      'forbidden',
    )
    assert.equal((await me(B, pair.access_token)).status, 200)
  })

  test(
    "GET /auth/sessions lists the caller's live sessions with user agent, address and which is current; DELETE " +
      'ends one on both',
    async () => {
      const user = await account()
      const first = await login(user, 'jwt', A, 'Browser/1.0')
      const second = await login(user, 'opaque', B, 'Phone/2.0')
      const res = await B.request('GET', '/auth/sessions', { auth: second.access_token })
      assert.equal(res.status, 200, res.text)
      assert.equal(res.headers.get('cache-control'), 'no-store')
      assert.equal(res.body.length, 2)
      const [newest, oldest] = res.body
      assert.deepEqual([newest.user_agent, newest.current], ['Phone/2.0', true])
      assert.deepEqual([oldest.user_agent, oldest.current], ['Browser/1.0', false])
      assert.equal(oldest.client_address, '127.0.0.1')
      for (const s of res.body)
        for (const member of ['created_at', 'last_used_at', 'expires_at']) assert.match(s[member], /^\d{4}-\d\d-\d\dT/)

      const within = await propagationBound(both)
      assert.equal(
        (await B.request('DELETE', `/auth/sessions/${oldest.id}`, { auth: second.access_token })).status,
        204,
      )
      await refusedEverywhere(first.access_token, within)
      assertInvalidToken(await refresh(first.refresh_token))
      assert.equal((await me(A, second.access_token)).status, 200)
      const after = await A.request('GET', '/auth/sessions', { auth: second.access_token })
      assert.deepEqual(
        after.body.map((s: { id: number }) => s.id),
        [newest.id],
      )
    },
  )

  test("another user's session, an ended one, or one that does not exist: 404, and nothing is ended", async () => {
    const [user, victim] = [await account(), await account()]
    const mine = await login(user)
    const theirs = await login(victim)
    const [{ id: victimSession }] = await sql<[{ id: number }]>`SELECT id FROM sessions WHERE user_id = ${victim.id}`
    assertProblem(
      await A.request('DELETE', `/auth/sessions/${victimSession}`, { auth: mine.access_token }),
      404,
      'not_found',
    )
    assertProblem(await A.request('DELETE', '/auth/sessions/999999999', { auth: mine.access_token }), 404, 'not_found')
    assert.equal((await me(B, theirs.access_token)).status, 200)
    // Even an admin ends only its own sessions here.
    assertProblem(await A.request('DELETE', `/auth/sessions/${victimSession}`), 404, 'not_found')
    assert.equal((await me(B, theirs.access_token)).status, 200)
    assertProblem(await A.request('DELETE', '/auth/sessions/abc', { auth: mine.access_token }), 404, 'not_found')
    assertProblem(
      await A.request('GET', '/auth/sessions?limit=5', { auth: mine.access_token }),
      400,
      'unknown_parameter',
    )
    assertProblem(await A.request('GET', '/auth/sessions', { auth: null }), 401, 'unauthorized')
  })

  test('a refresh token used twice (stolen): the session ends, and its JWTs with it, on both', async () => {
    const user = await account()
    const pair = await login(user)
    const rotated = await refresh(pair.refresh_token, B)
    assert.equal(rotated.status, 200)
    const within = await propagationBound(both)
    assertInvalidToken(await refresh(pair.refresh_token, A))
    assertInvalidToken(await me(A, rotated.body.access_token))
    await refusedEverywhere(rotated.body.access_token, within)
    await refusedEverywhere(pair.access_token, within)
  })
})

describe('password and e-mail changes', () => {
  test(
    "one's own password: needs current_password (403 current_password_required without it or when wrong, nothing " +
      'changed)',
    async () => {
      const user = await account()
      const { access_token: jwt } = await login(user)
      const [before] = await sql<
        [{ password_hash: string; version: number }]
      >`SELECT password_hash, version FROM users WHERE id = ${user.id}`
      const attempts = [
        { password: 'taken-over-123' },
        { password: 'taken-over-123', current_password: 'wrong-guess' },
        { password: null },
        { password: null, current_password: '' },
        { email: `thief-${unique()}@example.com` },
        { email: `thief-${unique()}@example.com`, current_password: 'wrong-guess' },
      ]
      for (const body of attempts) {
        const res = await B.request('PATCH', `/users/${user.id}`, { auth: jwt, body })
        // An empty current_password is a validation error; the others need the proof.
        if (body.current_password === '') assertProblem(res, 422, 'validation_failed')
        else assertProblem(res, 403, 'current_password_required')
      }
      assertProblem(
        await B.request('PUT', `/users/${user.id}`, {
          auth: jwt,
          body: { name: 'Test User', email: user.email, password: 'taken-over-123' },
        }),
        403,
        'current_password_required',
      )
      const [after] = await sql<
        [{ password_hash: string; version: number; email: string }]
      >`SELECT password_hash, version, email FROM users WHERE id = ${user.id}`
      assert.deepEqual(
        { hash: after.password_hash, version: after.version, email: after.email },
        { hash: before.password_hash, version: before.version, email: user.email },
      )
      // A name needs no proof.
      assert.equal(
        (await B.request('PATCH', `/users/${user.id}`, { auth: jwt, body: { name: 'Renamed' } })).status,
        200,
      )
    },
  )

  test("an API key cannot change its owner's password or e-mail, even with the right current_password", async () => {
    const user = await account()
    const { access_token: jwt } = await login(user)
    const key = (
      await A.request('POST', '/api-keys', { auth: jwt, body: { name: 'ci', scopes: ['users:read', 'users:write'] } })
    ).body.key
    for (const body of [
      { password: 'new-password-1', current_password: user.password },
      { email: `key-${unique()}@example.com`, current_password: user.password },
      { password: null, current_password: user.password },
    ]) {
      assertProblem(
        await A.request('PATCH', `/users/${user.id}`, { auth: null, headers: { 'x-api-key': key }, body }),
        403,
        'forbidden',
      )
    }
    const [row] = await sql<[{ password_hash: string | null }]>`SELECT password_hash FROM users WHERE id = ${user.id}`
    assert.ok(row.password_hash)
  })

  test(
    "a new password with the right current_password: other sessions end on both, every older JWT (the caller's " +
      "too) stops, the caller's refresh token goes on",
    async () => {
      const user = await account()
      const caller = await login(user, 'jwt', A)
      const others = [await login(user, 'opaque', B), await login(user, 'jwt', B)]
      const within = await propagationBound(both)
      const res = await A.request('PATCH', `/users/${user.id}`, {
        auth: caller.access_token,
        body: { password: 'brand-new-password', current_password: user.password },
      })
      assert.equal(res.status, 200, res.text)
      for (const s of others) {
        await refusedEverywhere(s.access_token, within)
        assertInvalidToken(await refresh(s.refresh_token, B))
      }
      await refusedEverywhere(caller.access_token, within)
      const renewed = await refresh(caller.refresh_token, B)
      assert.equal(renewed.status, 200, renewed.text)
      for (const server of both) assert.equal((await me(server, renewed.body.access_token)).status, 200)
      // The old password no longer logs in; the new one does.
      assertProblem(
        await A.request('POST', '/auth/login', { auth: null, body: { email: user.email, password: user.password } }),
        401,
        'invalid_credentials',
      )
      await login({ ...user, password: 'brand-new-password' }, 'jwt', B)
    },
  )

  test("one's own e-mail with the right current_password: changed, sessions go on", async () => {
    const user = await account()
    const pair = await login(user)
    const email = `moved-${unique()}@example.com`
    const res = await B.request('PATCH', `/users/${user.id}`, {
      auth: pair.access_token,
      body: { email, current_password: user.password },
    })
    assert.equal(res.status, 200, res.text)
    assert.equal(res.body.email, email)
    assert.equal((await me(A, pair.access_token)).status, 200)
  })

  test(
    "an admin setting another user's password ends all that user's sessions, needing no " + 'current_password',
    async () => {
      const user = await account()
      const pairs = [await login(user), await login(user, 'opaque', B)]
      const within = await propagationBound(both)
      const res = await A.request('PATCH', `/users/${user.id}`, { body: { password: 'set-by-the-admin' } })
      assert.equal(res.status, 200, res.text)
      for (const p of pairs) {
        await refusedEverywhere(p.access_token, within)
        assertInvalidToken(await refresh(p.refresh_token))
      }
    },
  )
})

describe('what each instance remembers, and when it stops trusting it', () => {
  test('TRUNCATE users: every JWT of those users is refused', async () => {
    // On a database of its own: emptying the users table of A and B would end their admins.
    const D = await startServer()
    const user = await D.createUser()
    const products = (auth: string) => D.request('GET', '/products?limit=1', { auth })
    assert.equal((await products(user.token)).status, 200)
    await D.sql`TRUNCATE users CASCADE`
    // TRUNCATE is announced as `all`: the instance reloads, then trusts
    // its memory again, which must hold the truncated users.
    await D.deps.credentialChanges.caughtUp()
    await until('D trusts again', () => D.deps.credentialChanges.trusted)
    assertInvalidToken(await products(user.token))
    assertInvalidToken(await products(D.admin.token))
  })

  test(
    'an instance started after the revocations loads them: a JWT revoked before it started is refused, with no ' +
      'statement for it',
    async () => {
      const user = await account()
      const pair = await login(user)
      assert.equal((await A.request('POST', '/auth/logout', { auth: pair.access_token })).status, 204)
      const C = await startServer({}, {}, { databaseUrl: A.databaseUrl })
      assert.ok(C.deps.credentialChanges.trusted)
      const before = await statements(C)
      assertInvalidToken(await me(C, pair.access_token))
      assert.equal((await statements(C)) - before, 0, 'refused from memory')
    },
  )

  test(
    "the listener's backend frozen: the instance stops trusting what it remembers within the heartbeat bound, " +
      '/readyz says why, a revocation made elsewhere holds there (read from the database), and trust comes back',
    async (t) => {
      const { instance: C, listener: pid } = await instanceAndListener(A)
      const user = await account()
      const pair = await login(user)
      assert.equal((await me(C, pair.access_token)).status, 200)
      // The freeze may come just after a heartbeat: the next one's marker is sent HEARTBEAT_MS later and given up
      // CATCH_UP_TIMEOUT_MS after that. Past those, a second, or five times what a marker takes when nothing is wrong.
      const hearing = await hearingMs([C])
      const bound = HEARTBEAT_MS + CATCH_UP_TIMEOUT_MS + boundFrom(hearing)
      const thaw = await freezeBackend(sql, pid)
      if (!thaw) return t.skip('the database server is not a process of this machine')
      try {
        const took = await until('C distrusts', () => !C.deps.credentialChanges.trusted, bound)
        t.diagnostic(
          `C stopped trusting its memory ${Math.round(took)} ms after its listener froze ` +
            `(bound ${Math.round(bound)} ms; a marker took ${hearing.toFixed(1)} ms)`,
        )
        const ready = await C.request('GET', '/readyz', { auth: null })
        assert.equal(ready.status, 200)
        assert.match(ready.body.credentials, /^read from the database: .*did not come back/)
        // Revoked through A while C hears nothing: C reads it from the database.
        assert.equal((await A.request('POST', '/auth/logout-all', { auth: pair.access_token })).status, 204)
        assertInvalidToken(await me(C, pair.access_token))
        const fresh = await login(user)
        const spent = await statements(C)
        assert.equal((await me(C, fresh.access_token)).status, 200)
        assert.ok((await statements(C)) - spent >= 2, 'the JWT was checked in the database')
      } finally {
        thaw()
      }
      await until('C trusts again', () => C.deps.credentialChanges.trusted)
      assert.equal((await C.request('GET', '/readyz', { auth: null })).body.credentials, 'remembered')
      assertInvalidToken(await me(C, pair.access_token))
      assert.ok(C.logs.some((l) => l.level === 'warn' && /not trusting remembered credentials/.test(String(l.msg))))
    },
  )

  test(
    "the listener's backend terminated and a session ended before it is back: refused on both within a second, " +
      'and still after reloading',
    async () => {
      const user = await account()
      const pair = await login(user)
      const within = await propagationBound(both)
      const mine = async () =>
        (
          await sql<
            Array<{ pid: number }>
          >`SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'listen %'`
        ).map((r) => r.pid)
      await sql.begin(async (tx) => {
        await tx`SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE pid = ANY(${await mine()})`
        await tx`UPDATE sessions SET revoked_at = now() WHERE user_id = ${user.id}`
      })
      // The notification is lost with the connection; an instance may serve from memory for the moment it takes to
      // notice the drop, then reads the database, then reloads.
      await refusedEverywhere(pair.access_token, within)
      for (const server of both) await until('trusted again', () => server.deps.credentialChanges.trusted)
      for (const server of both) assertInvalidToken(await me(server, pair.access_token))
    },
  )
})

describe('the revocation list on its own', () => {
  test(
    'a session or an older epoch is revoked; later epochs and other sessions are not; a deleted user is revoked ' +
      'for good',
    () => {
      const list = new RevocationList()
      list.revokeSession(10)
      list.raiseEpoch(7, 2)
      assert.equal(list.revokes(1, 10, 0), true)
      assert.equal(list.revokes(1, 11, 0), false)
      assert.equal(list.revokes(7, 11, 1), true)
      assert.equal(list.revokes(7, 11, 2), false)
      list.raiseEpoch(7, 1)
      assert.equal(list.revokes(7, 11, 1), true, 'an epoch is never lowered')
      list.add({ kind: 'deleted', user_id: 8, session_id: null, epoch: null, expires_at: Date.now() + 1000 })
      assert.equal(list.revokes(8, 1, 1_000_000), true)
    },
  )

  test('entries leave once every JWT they concern has expired, not before', () => {
    let now = 1_000_000
    const list = new RevocationList(() => now)
    list.revokeSession(1)
    list.raiseEpoch(2, 5)
    now += ENTRY_LIFETIME_MS - 1
    list.sweep()
    assert.equal(list.size, 2)
    now += 1
    list.sweep()
    assert.equal(list.size, 0)
  })

  const payloads: Array<[string, boolean]> = [
    ['sessions 1,2,3', true],
    ['epochs 7:2,8:deleted', true],
    ['sessions ', false],
    ['sessions 1;DROP TABLE users', false],
    ['epochs 7:-1', false],
    ['epochs 7', false],
    [`sessions ${'9'.repeat(20)}`, false],
    ['revocations', false],
    ['sessions 1\u0000', false],
  ]
  for (const [payload, known] of payloads) {
    test(`notification ${JSON.stringify(payload)} is ${known ? 'applied' : 'not one (the listener reloads)'}`, () => {
      const list = new RevocationList()
      assert.equal(applyRevocation(list, payload), known)
      if (!known) assert.equal(list.size, 0)
    })
  }

  test('expired rows of the table are deleted by the heartbeat; live ones stay', async () => {
    await sql`INSERT INTO revocations (kind, user_id, session_id, expires_at) SELECT 'session', 1, g, now() -
      interval '1 minute' FROM generate_series(1, 500) g`
    await sql`INSERT INTO revocations (kind, user_id, session_id) VALUES ('session', 1, 424242)`
    // Each instance purges a batch every 10 heartbeats, the first among them: one that starts now does at once.
    await startServer({}, {}, { databaseUrl: A.databaseUrl })
    await until(
      'the expired rows are gone',
      async () => (await sql`SELECT 1 FROM revocations WHERE expires_at < now()`).length === 0,
      5_000,
    )
    assert.equal((await sql`SELECT 1 FROM revocations WHERE session_id = 424242`).length, 1)
  })
})
