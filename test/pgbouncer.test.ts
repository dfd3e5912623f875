import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { readdirSync } from 'node:fs'
import { after, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Sql } from 'postgres'
import { ConfigError } from '../src/core/config-error.js'
import { loadConfig } from '../src/config.js'
import { PREPARE_AFTER_USES } from '../src/core/collections/list-sql.js'
import { connect } from '../src/core/db/connect.js'
import { MIGRATION_LOCK } from '../src/core/db/migrate.js'
import { probe, resolvePooler } from '../src/core/db/pooler.js'
import { products } from '../src/products/resource.js'
import { launchService, runCommand } from './fault-kit.js'
import { startPgBouncer } from './helpers/pgbouncer.js'
import { createTestDatabase, startServer, TEST_JWT_SECRET, type TestServer } from './helpers/server.js'
import { SseClient } from './helpers/sse.js'
import { propagationBound } from './helpers/time-bounds.js'
import { waitUntil } from './helpers/wait.js'

// The service with DATABASE_URL through a real PgBouncer 1.18 in transaction
// mode (test/helpers/pgbouncer.ts, pools of 3 server connections) and
// DATABASE_LISTEN_URL straight to PostgreSQL: two instances serve real flows
// with no prepared statement error, hear each other's revocations through
// the direct listener, migrate an empty database together through the
// listen URL; and start-up refuses what cannot work behind the pooler.

const bouncer = await startPgBouncer()
const connections: Sql[] = []
after(() => Promise.all(connections.map((c) => c.end({ timeout: 5 }))))
const direct = (url: string) => {
  const sql = connect(url, { max: 1, statementTimeoutMs: 60_000 })
  connections.push(sql)
  return sql
}

/** What an operator does for a transaction pooler: the time-outs as the role's defaults in that database. */
async function setRoleTimeouts(databaseUrl: string, ms = 5000): Promise<void> {
  const sql = direct(databaseUrl)
  const database = sql(new URL(databaseUrl).pathname.slice(1))
  await sql`ALTER ROLE CURRENT_USER IN DATABASE ${database} SET statement_timeout = ${sql.unsafe(String(ms))}`
  await sql`ALTER ROLE CURRENT_USER IN
    DATABASE ${database} SET idle_in_transaction_session_timeout = ${sql.unsafe(String(ms))}`
}

const listenUrl = await createTestDatabase()
await setRoleTimeouts(listenUrl)
const pooledUrl = bouncer.urlFor(listenUrl)
const env = { DATABASE_URL: pooledUrl, DATABASE_LISTEN_URL: listenUrl }
// The stream reader's poll far away, so that only its notification (on the listen URL) can bring it an event in time.
const tuning = { streams: { pollMs: 60_000 } }
const a = await startServer(env, {}, { databaseUrl: pooledUrl, tuning })
const b = await startServer(env, {}, { databaseUrl: pooledUrl, tuning })

/** The entry point with `vars`, expected to refuse: how it ended. */
const runMain = (vars: Record<string, string>) =>
  runCommand([], { JWT_SECRETS: `test:${TEST_JWT_SECRET}`, PORT: '0', HOST: '127.0.0.1', LOG_LEVEL: 'info', ...vars })

/** The entry point serving (fault-kit's launchService): `listening` resolves once it listens. */
function startMain(vars: Record<string, string>) {
  const instance = launchService({ JWT_SECRETS: `test:${TEST_JWT_SECRET}`, LOG_LEVEL: 'info', ...vars })
  after(() => instance.kill('SIGKILL'))
  return instance
}

const product = (sku: string, price: number) => ({ sku, name: `Pooled ${sku}`, price, currency: 'EUR' })
const nextPath = (link: string | null) => (link ? /<([^>]+)>; rel="next"/.exec(link)?.[1] : undefined)

describe('detection', () => {
  test(
    'PgBouncer is detected by the process id it announces; a direct connection is not taken for a ' + 'pooler',
    async () => {
      assert.equal((await probe(pooledUrl)).pooled, true)
      assert.equal((await probe(listenUrl)).pooled, false)
      assert.equal(a.deps.config.databasePooler, 'transaction')
      const directly = await startServer({}, {}, { databaseUrl: listenUrl })
      assert.equal(directly.deps.config.databasePooler, 'none')
      assert.equal(directly.deps.listenSql, directly.deps.sql, 'without DATABASE_LISTEN_URL the pool listens')
    },
  )

  test(
    'resolvePooler: DATABASE_POOLER=transaction or none is taken as said; a listen URL through the pooler, or on ' +
      'another database, is refused',
    async () => {
      const base = {
        ...loadConfig({ DATABASE_URL: listenUrl, DATABASE_LISTEN_URL: listenUrl, DATABASE_POOLER: 'transaction' }),
        databaseUrl: listenUrl,
      }
      assert.equal(await resolvePooler(base), 'transaction')
      // `none` without a listen URL looks at nothing (port 1: nothing listens there).
      assert.equal(
        await resolvePooler({
          ...base,
          databasePooler: 'none',
          databaseListenUrl: undefined,
          databaseUrl: 'postgres://postgres@127.0.0.1:1/none',
        }),
        'none',
      )
      await assert.rejects(
        resolvePooler({ ...base, databasePooler: 'auto', databaseUrl: pooledUrl, databaseListenUrl: pooledUrl }),
        (err: unknown) =>
          err instanceof ConfigError && /^DATABASE_LISTEN_URL: must reach PostgreSQL directly/.test(err.message),
      )
      const other = await createTestDatabase()
      await assert.rejects(
        resolvePooler({ ...base, databasePooler: 'auto', databaseUrl: pooledUrl, databaseListenUrl: other }),
        (err: unknown) =>
          err instanceof ConfigError &&
          /^DATABASE_LISTEN_URL: reaches database ".+", where DATABASE_URL reaches ".+"/.test(err.message),
      )
    },
  )
})

describe('through PgBouncer in transaction mode', () => {
  test(
    'the pool sends unnamed statements only, PgBouncer refused no startup parameter, and the time-outs are the ' +
      "role's",
    async () => {
      const { sql } = a.deps
      // `prepare: true` as src/core/resources/store.ts asks: the pool's prepare: false wins.
      const asked = await sql.unsafe('SELECT $1::int AS n', [1], { prepare: true })
      assert.equal(asked.statement.name, '')
      assert.equal((await sql`SELECT ${2}::int AS n`).statement.name, '')
      const [timeouts] = await sql`SELECT current_setting('statement_timeout') AS statement,
        current_setting('idle_in_transaction_session_timeout') AS idle`
      assert.deepEqual({ ...timeouts }, { statement: '5s', idle: '5s' })
      assert.doesNotMatch(bouncer.log(), /unsupported startup parameter|prepared statement/)
    },
  )

  test(
    'statements queued on busy connections are sent one at a time: transactions and parameterless statements all ' +
      'settle',
    async () => {
      // postgres.js would pipeline a queued statement behind a parameterless one (a COMMIT, a SELECT 1);
      // PgBouncer gives the server connection back at the first's ReadyForQuery, and the second's answer is lost.
      const sql = connect(pooledUrl, { max: 2, statementTimeoutMs: 10_000, pooled: true })
      connections.push(sql)
      const work = Array.from({ length: 60 }, (_, i) =>
        i % 3 === 0
          ? sql.begin(async (tx) => (await tx`SELECT ${i}::int AS n`)[0]!.n)
          : i % 3 === 1
            ? sql`SELECT 1 AS n`.then(([r]) => r!.n)
            : sql`SELECT ${i}::int AS n`.then(([r]) => r!.n),
      )
      // Unreferenced: the time-out must not hold the file open once the statements have settled.
      const settled = await Promise.race([Promise.allSettled(work), sleep(10_000, 'hung' as const, { ref: false })])
      assert.notEqual(settled, 'hung', 'statements never answered')
      assert.deepEqual(
        (settled as PromiseSettledResult<number>[]).filter((r) => r.status === 'rejected'),
        [],
      )
    },
  )

  test(
    'login, products created on both instances, listed page by page with filters many times over, patched; the ' +
      'events feed',
    async () => {
      const user = await a.createUser({ role: 'admin', password: 'a pooled password' })
      const login = await a.request('POST', '/auth/login', {
        auth: null,
        body: { email: user.email, password: 'a pooled password' },
      })
      assert.equal(login.status, 200, login.text)
      const token = login.body.access_token as string
      const sku = `PGB-${randomBytes(3).toString('hex')}`
      const created = await Promise.all(
        Array.from({ length: 12 }, (_, i) =>
          (i % 2 ? a : b).request('POST', '/products', {
            auth: token,
            body: product(`${sku}-${String(i).padStart(2, '0')}`, 100 + i),
          }),
        ),
      )
      for (const res of created) assert.equal(res.status, 201, res.text)

      // One shape, used far past PREPARE_AFTER_USES by both instances at once: each would prepare it if it could.
      const walk = async (server: TestServer) => {
        const seen: string[] = []
        for (let path: string | undefined = `/products?q=${sku}&price[gte]=103&sort=-price&limit=3`; path;) {
          const page = await server.request('GET', path, { auth: token })
          assert.equal(page.status, 200, page.text)
          seen.push(...page.body.map((p: { sku: string }) => p.sku))
          path = nextPath(page.headers.get('link'))
        }
        return seen
      }
      const expected = created
        .map((r) => r.body)
        .filter((p) => p.price >= 103)
        .sort((x, y) => y.price - x.price)
        .map((p) => p.sku)
      const walks = await Promise.all(Array.from({ length: PREPARE_AFTER_USES + 3 }, (_, i) => walk(i % 2 ? a : b)))
      for (const seen of walks) assert.deepEqual(seen, expected)
      const counted = await b.request('GET', `/products?q=${sku}&count=true&limit=1`, { auth: token })
      assert.equal(counted.headers.get('x-total-count'), '12')
      assert.equal(a.deps.listShapes.preparedCount(products.collection), 0)
      assert.equal(b.deps.listShapes.preparedCount(products.collection), 0)

      const target = created[0]!
      const patched = await b.request('PATCH', `/products/${target.body.id}`, {
        auth: token,
        headers: { 'if-match': target.headers.get('etag')! },
        body: { price: 999 },
      })
      assert.equal(patched.status, 200, patched.text)
      assert.equal(patched.body.price, 999)
      await a.published()
      const events = await a.request('GET', `/events?type=product.updated&subject_id=${target.body.id}`, {
        auth: token,
      })
      assert.equal(events.status, 200, events.text)
      assert.deepEqual(
        events.body.map((e: { data: { price: number } }) => e.data.price),
        [999],
      )
    },
  )

  test(
    'an event written through one instance reaches a stream client of the other (its reader listens on ' +
      'DATABASE_LISTEN_URL)',
    async () => {
      const stream = await SseClient.open(b.url, '/events/stream?type=product.created', {
        headers: { authorization: `Bearer ${b.admin.token}` },
      })
      after(() => stream.close())
      await waitUntil('the stream to listen', () => b.deps.eventHub.size === 1)
      // Both instances' readers listening (they start listening as the service starts, without waiting for it): a
      // notification sent before B's LISTEN would reach it only at its next poll.
      await waitUntil('both readers to listen', async () => {
        const [{ n }] = await a.sql<[{ n: number }]>`
          SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = current_database() AND query ILIKE 'listen "events"'`
        return n >= 2
      })
      const res = await a.request('POST', '/products', {
        body: product(`PGB-STREAM-${randomBytes(3).toString('hex')}`, 5),
      })
      assert.equal(res.status, 201)
      // Well within the reader's poll (a minute): only the notification can have brought it.
      await stream.waitForEvents(1, 30_000)
      assert.equal(JSON.parse(stream.events[0]!.data).subject.id, res.body.id)
    },
  )

  // Within a second, or five times what hearing a change takes B now (test/helpers/time-bounds.ts).
  test('a revoked API key and a logged-out session are refused by the other instance within a second', async () => {
    assert.ok(
      a.deps.credentialChanges.trusted && b.deps.credentialChanges.trusted,
      'both instances hear credential changes',
    )
    const key = await a.request('POST', '/api-keys', { body: { name: 'pooled', scopes: ['users:read'] } })
    assert.equal(key.status, 201, key.text)
    assert.equal((await b.request('GET', '/auth/me', { auth: key.body.key })).status, 200)
    assert.equal((await b.request('GET', '/auth/me', { auth: key.body.key })).status, 200)
    const keyBound = await propagationBound([b])
    assert.equal((await a.request('DELETE', `/api-keys/${key.body.id}`)).status, 204)
    const revoked = performance.now()
    const refusesKey = async () => (await b.request('GET', '/auth/me', { auth: key.body.key })).status === 401
    await waitUntil('B to refuse the revoked key', refusesKey, keyBound)
    const keyMs = performance.now() - revoked

    const user = await a.createUser({ password: 'a session password' })
    const login = await b.request('POST', '/auth/login', {
      auth: null,
      body: { email: user.email, password: 'a session password' },
    })
    assert.equal(login.status, 200, login.text)
    assert.equal((await b.request('GET', '/auth/me', { auth: login.body.access_token })).status, 200)
    const logoutBound = await propagationBound([b])
    assert.equal((await a.request('POST', '/auth/logout', { auth: login.body.access_token })).status, 204)
    const loggedOut = performance.now()
    const jwt = login.body.access_token
    const refusesJwt = async () => (await b.request('GET', '/auth/me', { auth: jwt })).status === 401
    await waitUntil('B to refuse the logged-out JWT', refusesJwt, logoutBound)
    console.log(
      `refused on the other instance ` +
        `after ${Math.round(keyMs)} ms (API key), ${Math.round(performance.now() - loggedOut)} ms (logout)`,
    )
  })
})

describe('start-up', () => {
  test('two instances migrate one empty database at once, through DATABASE_LISTEN_URL, and serve', async () => {
    const empty = await createTestDatabase({ empty: true })
    await setRoleTimeouts(empty)
    // Told apart in pg_stat_activity by the name the listen URL gives its sessions.
    const marker = `upa-listen-${randomBytes(3).toString('hex')}`
    const listen = new URL(empty)
    listen.searchParams.set('application_name', marker)
    const holder = direct(empty)
    await holder`SELECT pg_advisory_lock(${MIGRATION_LOCK})`
    const vars = { DATABASE_URL: bouncer.urlFor(empty), DATABASE_LISTEN_URL: listen.toString() }
    const instances = [await startMain(vars), await startMain(vars)]
    const waiting = () => holder<Array<{ application_name: string }>>`
      SELECT application_name FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type =
      'Lock' AND wait_event = 'advisory'`
    await waitUntil('both migrations to wait for the lock', async () => (await waiting()).length === 2, 20_000)
    assert.deepEqual(
      (await waiting()).map((r) => r.application_name),
      [marker, marker],
    )
    await holder`SELECT pg_advisory_unlock(${MIGRATION_LOCK})`
    await Promise.all(instances.map((i) => i.listening))
    const files = readdirSync(new URL('../sql/', import.meta.url))
      .filter((f) => f.endsWith('.sql'))
      .sort()
    assert.deepEqual(
      (await holder<Array<{ name: string }>>`SELECT name FROM schema_migrations ORDER BY version`).map((r) => r.name),
      files,
    )
    assert.equal(
      instances.filter((i) => i.logs.some((l) => l.msg === 'migrations applied')).length,
      1,
      'one instance applied them',
    )
    for (const i of instances)
      assert.ok(i.logs.some((l) => l.msg?.toString().startsWith('DATABASE_URL goes through a transaction pooler')))
    for (const i of instances) i.kill('SIGTERM')
    assert.deepEqual(await Promise.all(instances.map(async (i) => (await i.exited).code)), [0, 0])
    for (const i of instances) assert.doesNotMatch(i.stderr(), /./)
  })

  test('behind PgBouncer without DATABASE_LISTEN_URL: refuses to start, exit 1, naming what to set', async () => {
    const { code, stderr } = await runMain({ DATABASE_URL: pooledUrl })
    assert.equal(code, 1, stderr)
    assert.match(
      stderr,
      /^Cannot start: DATABASE_URL goes through a connection pooler.*set DATABASE_LISTEN_URL to a direct connection/m,
    )
    assert.doesNotMatch(stderr, /\n\s+at /, 'no stack trace')
  })

  test(
    'behind PgBouncer with server connections that have no time-outs: refuses to start, naming the settings and ' +
      'how to set them',
    async () => {
      const bare = await createTestDatabase()
      const { code, stderr } = await runMain({ DATABASE_URL: bouncer.urlFor(bare), DATABASE_LISTEN_URL: bare })
      assert.equal(code, 1, stderr)
      assert.match(stderr, /statement_timeout is off and idle_in_transaction_session_timeout is off/)
      assert.match(stderr, /ALTER ROLE "[^"]+" IN DATABASE "[^"]+" SET statement_timeout = '5000ms'/)
    },
  )

  test('DATABASE_LISTEN_URL through PgBouncer too: refused, exit 1', async () => {
    const { code, stderr } = await runMain({ DATABASE_URL: pooledUrl, DATABASE_LISTEN_URL: pooledUrl })
    assert.equal(code, 1, stderr)
    assert.match(stderr, /^Cannot start: DATABASE_LISTEN_URL: must reach PostgreSQL directly/m)
  })
})

test('nothing went wrong in PgBouncer or the services', () => {
  assert.doesNotMatch(bouncer.log(), /unsupported startup parameter|prepared statement|not linked|ERROR/)
  for (const server of [a, b])
    assert.deepEqual(
      server.logs.filter((l) => l.level === 'warn' || l.level === 'error'),
      [],
    )
})
