import assert from 'node:assert/strict'
import { Agent } from 'node:http'
import { after, describe, test } from 'node:test'
import { connect } from '../src/core/db/connect.js'
import { adminToken, spawnService, type Spawned } from './fault-kit.js'
import { call, tally, type Answer } from './helpers/http-client.js'
import { startNginx } from './helpers/nginx.js'
import { startPgBouncer } from './helpers/pgbouncer.js'
import { createTestDatabase } from './helpers/server.js'
import { SseClient } from './helpers/sse.js'
import { startReceiver } from './helpers/webhook-receiver.js'
import { boundFrom, timed } from './helpers/time-bounds.js'
import { waitUntil } from './helpers/wait.js'
import { testPasswords } from './helpers/passwords.js'

// The deployment of docs/scaling.md, built from real components: PostgreSQL,
// PgBouncer 1.18 in transaction mode (DATABASE_URL) with DATABASE_LISTEN_URL
// straight to PostgreSQL, three instances of the service (real processes,
// `dist/main.js`), and nginx with deploy/nginx.conf in front. Everything that
// must hold across instances is checked through it, under concurrent load.

describe('three instances behind nginx, through PgBouncer in transaction mode, on one database', async () => {
  const databaseUrl = await createTestDatabase()
  const db = connect(databaseUrl, { max: 2, statementTimeoutMs: 10_000 })
  after(() => db.end({ timeout: 5 }))
  const [{ id: adminId }] = await db<
    [{ id: number }]
  >`INSERT INTO users (name, email, role) VALUES ('Topology Admin', 'topology-admin@example.com', 'admin') RETURNING id`
  const auth = { authorization: `Bearer ${adminToken(adminId)}` }
  // Through a transaction pooler the time-outs are the role's, not the connection's (src/core/db/pooler.ts).
  const database = db(new URL(databaseUrl).pathname.slice(1))
  await db`ALTER ROLE CURRENT_USER IN DATABASE ${database} SET statement_timeout = 5000`
  await db`ALTER ROLE CURRENT_USER IN DATABASE ${database} SET idle_in_transaction_session_timeout = 5000`
  // Fewer server connections than the three instances' pools hold between them: they are shared for real.
  const bouncer = await startPgBouncer({ poolSize: 12 })
  const env = {
    DATABASE_URL: bouncer.urlFor(databaseUrl),
    DATABASE_LISTEN_URL: databaseUrl,
    TRUST_PROXY: '1',
    RATE_LIMIT: '0',
    WEBHOOK_ALLOW_PRIVATE: 'true',
    LOG_LEVEL: 'debug',
  }
  const instances = await Promise.all([1, 2, 3].map(() => spawnService(env)))
  after(() => instances.filter((i) => i.alive()).forEach((i) => i.kill('SIGKILL')))
  const nginx = await startNginx(instances.map((i) => `127.0.0.1:${i.port}`))
  after(() => nginx.stop())
  const agent = new Agent({ keepAlive: true, maxSockets: 64, localAddress: '127.0.0.2' })
  after(() => agent.destroy())

  test(
    'one Idempotency-Key fired 40 times at once, through the proxy and at each instance, creates one product; ' +
      'every answer is that product or "in use"',
    async () => {
      const sku = `IDEM-${Date.now()}`
      const send = (base: string) =>
        call(base, 'POST', '/products', {
          agent: base === nginx.url ? agent : undefined,
          headers: { ...auth, 'idempotency-key': `topology-${sku}` },
          body: { sku, name: 'Once', price: 1, currency: 'EUR' },
        })
      // nginx spreads its share as it likes; ten straight to each instance make sure all three race.
      const answers = await Promise.all(
        [nginx.url, ...instances.map((i) => i.url)].flatMap((base) => Array.from({ length: 10 }, () => send(base))),
      )
      assert.deepEqual(
        Object.keys(tally(answers)).filter((s) => s !== '201' && s !== '409'),
        [],
        JSON.stringify(tally(answers)),
      )
      const created = answers.filter((a) => a.status === 201)
      assert.ok(created.length >= 1)
      assert.equal(new Set(created.map((a) => a.body.id)).size, 1)
      for (const a of answers.filter((a) => a.status === 409)) assert.equal(a.body.code, 'idempotency_key_in_use')
      const rows = await db`SELECT id FROM products WHERE sku = ${sku}`
      assert.deepEqual(
        rows.map((r) => r.id),
        [created[0]!.body.id],
      )
      // Once done, the key replays its answer on any instance.
      const replay = await call(nginx.url, 'POST', '/products', {
        agent,
        headers: { ...auth, 'idempotency-key': `topology-${sku}` },
        body: { sku, name: 'Once', price: 1, currency: 'EUR' },
      })
      assert.equal(replay.status, 201)
      assert.equal(replay.body.id, created[0]!.body.id)
    },
  )

  test(
    'failed logins are counted across instances: after five from one client, the account is locked for it on ' +
      'every instance',
    async () => {
      const email = `throttled-${Date.now()}@example.com`
      // In the database: a user with a password is a step-up act, which the admin's session-less token cannot make.
      await db`INSERT INTO users (name, email, role, password_hash)
        VALUES ('Throttled', ${email}, 'user', ${await testPasswords.hash('the right password')})`
      const wrong = []
      for (let i = 0; i < 5; i++)
        wrong.push(
          await call(nginx.url, 'POST', '/auth/login', { from: '127.0.0.3', body: { email, password: `wrong ${i}` } }),
        )
      assert.deepEqual(
        wrong.map((a) => a.status),
        [401, 401, 401, 401, 401],
      )
      // Each instance directly, with the X-Forwarded-For nginx writes for that client: locked on all three.
      for (const i of instances) {
        const locked = await call(i.url, 'POST', '/auth/login', {
          headers: { 'x-forwarded-for': '127.0.0.3' },
          body: { email, password: 'the right password' },
        })
        assert.equal(locked.status, 429)
        assert.equal(locked.body.code, 'too_many_login_attempts')
      }
      // Another client address is not locked out by this one.
      assert.equal(
        (
          await call(nginx.url, 'POST', '/auth/login', {
            from: '127.0.0.4',
            body: { email, password: 'the right password' },
          })
        ).status,
        200,
      )
    },
  )

  test("a revoked API key and a demoted admin's JWT are refused by every instance within a second", async () => {
    const email = `demoted-${Date.now()}@example.com`
    const [created] = await db<Array<{ id: number }>>`INSERT INTO users (name, email, role, password_hash)
      VALUES ('Soon demoted', ${email}, 'admin', ${await testPasswords.hash('a good password')}) RETURNING id`
    const user = { body: { id: created!.id } }
    const login = await call(nginx.url, 'POST', '/auth/login', { agent, body: { email, password: 'a good password' } })
    assert.equal(login.status, 200)
    // A key is made by a fresh password login (REAUTH_WINDOW): this one's.
    const key = await call(nginx.url, 'POST', '/api-keys', {
      agent,
      headers: { authorization: `Bearer ${login.body.access_token}` },
      body: { name: 'to revoke', scopes: ['users:read'] },
    })
    assert.equal(key.status, 201)
    const keyHeaders = { 'x-api-key': key.body.key }
    const jwtHeaders = { authorization: `Bearer ${login.body.access_token}` }
    // Every instance has the key cached and the JWT accepted; the slowest instance's answers to both are the
    // baseline of the bound (boundFrom): one round of the probe below.
    const probe = (i: Spawned) =>
      Promise.all([
        call(i.url, 'GET', `/users/${adminId}`, { headers: keyHeaders }),
        call(i.url, 'GET', '/users?limit=1', { headers: jwtHeaders }),
      ])
    let slowest = 0
    for (const i of instances) {
      const took = await timed(async () =>
        assert.deepEqual(
          (await probe(i)).map((a) => a.status),
          [200, 200],
        ),
      )
      slowest = Math.max(slowest, took)
    }
    const bound = boundFrom(slowest)
    const revoked = performance.now()
    const [revoke, demote] = await Promise.all([
      call(instances[0]!.url, 'DELETE', `/api-keys/${key.body.id}`, { headers: auth }),
      call(instances[1]!.url, 'PATCH', `/users/${user.body.id}`, { headers: auth, body: { role: 'user' } }),
    ])
    assert.equal(revoke.status, 204)
    assert.equal(demote.status, 200)
    const refusedAt = await Promise.all(
      instances.map(async (i) => {
        await waitUntil('the key and the JWT refused', async () => {
          const [byKey, byJwt] = await probe(i)
          return byKey.status === 401 && byJwt.status !== 200
        })
        return performance.now() - revoked
      }),
    )
    const refusals = `refused after ${refusedAt.map(Math.round).join(', ')} ms (bound ${Math.round(bound)} ms)`
    assert.ok(
      refusedAt.every((ms) => ms < bound),
      refusals,
    )
  })

  test('an event written through one instance reaches stream clients of all three', async () => {
    const streams = await Promise.all(instances.map((i) => SseClient.open(i.url, '/events/stream', { headers: auth })))
    after(() => streams.forEach((s) => s.close()))
    await Promise.all(streams.map((s) => s.waitFor(() => s.retry !== undefined, 5000, 'retry:')))
    const created = await call(instances[2]!.url, 'POST', '/products', {
      headers: auth,
      body: { sku: `SSE-${Date.now()}`, name: 'Seen everywhere', price: 1, currency: 'EUR' },
    })
    assert.equal(created.status, 201)
    await Promise.all(
      streams.map((s) =>
        s.waitFor(() => s.events.some((e) => JSON.parse(e.data).subject.id === created.body.id), 3000, 'the event'),
      ),
    )
  })

  test('each webhook delivery is sent once while writes go through all three instances', async () => {
    const receiver = await startReceiver()
    after(() => receiver.close())
    const hook = await call(nginx.url, 'POST', '/webhooks', {
      agent,
      headers: auth,
      body: { url: receiver.url, event_types: ['product.created'] },
    })
    assert.equal(hook.status, 201)
    const count = 90
    const answers = await Promise.all(
      Array.from({ length: count }, (_, n) =>
        call(nginx.url, 'POST', '/products', {
          agent,
          headers: auth,
          body: { sku: `HOOK-${Date.now()}-${n}`, name: 'Delivered', price: 1, currency: 'EUR' },
        }),
      ),
    )
    assert.deepEqual(tally(answers), { 201: count })
    await receiver.waitFor('every delivery', (r) => r.length >= count, 30_000)
    const sent = () => instances.reduce((n, i) => n + i.logs.filter((l) => l.msg === 'webhook delivered').length, 0)
    // Every delivery recorded as done, none claimed again (nothing more can be sent), and logged by its sender.
    await waitUntil('every delivery recorded as done and logged', async () => {
      const [{ done }] = await db<[{ done: number }]>`
        SELECT count(*)::int AS done FROM webhook_deliveries WHERE status = 'succeeded' AND leased_until IS NULL`
      return done === count && sent() >= count
    })
    const counts = receiver.countsById()
    assert.equal(counts.size, count)
    assert.deepEqual(
      [...counts.values()].filter((n) => n !== 1),
      [],
      'each event received once',
    )
    const [{ attempts }] = await db<[{ attempts: number }]>`SELECT count(*)::int AS attempts FROM webhook_attempts`
    assert.equal(attempts, count)
    assert.equal(sent(), count)
  })

  test(
    'SIGKILL of one instance under write load: no answered write is lost, and the proxy routes around ' + 'it',
    async () => {
      const writes: Array<Answer & { sku: string }> = []
      let stopped = false
      const run = Date.now()
      const loops = Array.from({ length: 24 }, async (_, client) => {
        for (let seq = 0; !stopped; seq++) {
          const sku = `KILL-${run}-${client}-${seq}`
          writes.push({
            sku,
            ...(await call(nginx.url, 'POST', '/products', {
              agent,
              headers: auth,
              body: { sku, name: 'Survivor', price: 1, currency: 'EUR' },
            })),
          })
        }
      })
      const writesBy = (i: Spawned) => i.logs.filter((l) => l.msg === 'request' && l.method === 'POST').length
      await waitUntil('writes through every instance', () => instances.every((i) => writesBy(i) >= 10))
      const victim = instances[0]!
      victim.kill('SIGKILL')
      await victim.exited
      const killedAt = writes.length
      // Once each client's write in flight at the kill has ended, a hundred more.
      await waitUntil('a hundred writes after the kill', () => writes.length >= killedAt + 24 + 100)
      stopped = true
      await Promise.all(loops)

      const stored = new Set(
        (await db<Array<{ sku: string }>>`SELECT sku FROM products WHERE sku LIKE ${`KILL-${run}-%`}`).map(
          (r) => r.sku,
        ),
      )
      for (const w of writes.filter((w) => w.status === 201))
        assert.ok(stored.has(w.sku), `${w.sku} was answered 201 and must be stored`)
      // Only requests in flight on the killed instance can fail (a POST nginx has sent is never retried);
      // each of those either happened or not, and the client cannot know: it retries with an Idempotency-Key.
      const failed = writes.filter((w) => w.status !== 201)
      assert.ok(failed.length <= 24, `at most one per client fails: ${JSON.stringify(tally(failed))}`)
      const after = writes.slice(killedAt + 24)
      assert.deepEqual(tally(after), { 201: after.length }, 'after the kill every write succeeds on the other two')
    },
  )
})
