import assert from 'node:assert/strict'
import { after, describe, test } from 'node:test'
import { spawnService } from './fault-kit.js'
import { waitUntil } from './helpers/wait.js'
import { startServer, TEST_JWT_SECRET, type TestServer } from './helpers/server.js'
import { answerWith, startReceiver } from './helpers/webhook-receiver.js'

// Several instances on one database share the deliveries: each is sent once,
// and one whose instance dies mid-send is sent later by another, once its
// lease has run out.

const delivered = (server: TestServer) => server.logs.filter((l) => l.msg === 'webhook delivered').length

/** An instance in a process of its own (test/helpers/webhook-instance.ts); resolves once it listens. */
async function spawnInstance(databaseUrl: string, tuning: Record<string, unknown>) {
  const instance = await spawnService(
    {
      DATABASE_URL: databaseUrl,
      JWT_SECRETS: `test:${TEST_JWT_SECRET}`,
      WEBHOOK_ALLOW_PRIVATE: 'true',
      LOG_LEVEL: 'debug',
      WEBHOOK_TUNING: JSON.stringify(tuning),
    },
    'test/helpers/webhook-instance.ts',
  )
  after(() => instance.kill('SIGKILL'))
  return instance
}

describe('webhook deliveries across instances', () => {
  test('two instances on one database send each delivery exactly once, and share them', async () => {
    const tuning = { pollMs: 50, concurrency: 4, retryDelaysMs: [50], retryJitter: 0 }
    const a = await startServer({ WEBHOOK_ALLOW_PRIVATE: 'true' }, {}, { tuning: { webhooks: tuning } })
    const b = await startServer(
      { WEBHOOK_ALLOW_PRIVATE: 'true' },
      {},
      { databaseUrl: a.databaseUrl, tuning: { webhooks: tuning } },
    )
    const receiver = await startReceiver()
    // A short wait per answer, so that either instance is busy at times and the other takes its share.
    receiver.answer = (req, res, r) => void setTimeout(() => answerWith(204)(req, res, r), 20)
    const hook = await a.request('POST', '/webhooks', { body: { url: receiver.url, event_types: ['product.created'] } })
    assert.equal(hook.status, 201)
    const products = 60
    for (let i = 0; i < products; i += 10) {
      const batch = Array.from({ length: 10 }, (_, j) =>
        (j % 2 ? a : b).request('POST', '/products', {
          body: { sku: `SHARE-${i + j}`, name: 'x', price: 1, currency: 'EUR' },
        }),
      )
      for (const res of await Promise.all(batch)) assert.equal(res.status, 201)
    }
    await receiver.waitFor('every delivery', (r) => r.length >= products, 30_000)
    await waitUntil(
      'every success recorded',
      async () =>
        (await a.sql`SELECT count(*)::int AS n FROM webhook_deliveries WHERE status = 'succeeded'`)[0]!.n === products,
      20_000,
    )
    // Whatever either instance still had due, sent: a duplicate would have arrived by now.
    await Promise.all([a.deps.webhooks.drain(), b.deps.webhooks.drain()])
    const counts = receiver.countsById()
    assert.equal(counts.size, products)
    assert.deepEqual(
      [...counts.values()].filter((n) => n !== 1),
      [],
      'each event received once',
    )
    const [{ attempts }] = await a.sql`SELECT count(*)::int AS attempts FROM webhook_attempts`
    assert.equal(attempts, products)
    assert.equal(delivered(a) + delivered(b), products)
    assert.ok(delivered(a) > 0 && delivered(b) > 0, `shared: ${delivered(a)} and ${delivered(b)}`)
  })

  test('a delivery whose instance is killed (SIGKILL) mid-send is sent by another after the lease', async () => {
    const leaseMs = 2000
    const server = await startServer(
      { WEBHOOK_ALLOW_PRIVATE: 'true' },
      {},
      { tuning: { webhooks: { pollMs: 50, leaseMs, timeoutMs: 1500 } } },
    )
    // Only the spawned instance works at first: this one serves the API.
    await server.deps.webhooks.stop()
    const doomed = await spawnInstance(server.databaseUrl, { pollMs: 50, leaseMs, timeoutMs: 1500 })
    const receiver = await startReceiver()
    receiver.answer = () => {} // holds the first attempt open
    const hook = await server.request('POST', '/webhooks', {
      body: { url: receiver.url, event_types: ['product.created'] },
    })
    assert.equal(hook.status, 201)
    assert.equal(
      (await server.request('POST', '/products', { body: { sku: 'KILL-1', name: 'x', price: 1, currency: 'EUR' } }))
        .status,
      201,
    )
    await receiver.waitFor('the first attempt', (r) => r.length === 1)
    const [{ leasedUntil }] =
      await server.sql`SELECT (extract(epoch FROM leased_until) * 1000)::float8 AS "leasedUntil" FROM
        webhook_deliveries`
    doomed.kill('SIGKILL')
    assert.equal((await doomed.exited).signal, 'SIGKILL')
    const killedAt = Date.now()
    receiver.answer = answerWith(200)
    server.deps.webhooks.start()
    await receiver.waitFor('the second attempt', (r) => r.length === 2)
    const [first, second] = receiver.received
    assert.equal(first!.headers['webhook-id'], second!.headers['webhook-id'])
    assert.ok(second!.at >= leasedUntil - 50, `sent again ${leasedUntil - second!.at} ms before the lease ran out`)
    assert.ok(second!.at >= killedAt)
    await waitUntil(
      'the success recorded',
      async () => (await server.sql`SELECT status FROM webhook_deliveries`)[0]!.status === 'succeeded',
      20_000,
    )
    const deliveries = await server.request('GET', `/webhooks/${hook.body.id}/deliveries`)
    const [delivery] = deliveries.body
    assert.equal(delivery.status, 'succeeded')
    // Two claims, one recorded attempt: the killed one never came back to record its outcome.
    assert.equal(delivery.attempt_count, 2)
    assert.deepEqual(
      delivery.attempts.map((a: { status: number }) => a.status),
      [200],
    )
    assert.equal(doomed.logs.filter((l) => l.msg === 'webhook delivered').length, 0)
  })

  test(
    'an instance that stops gracefully mid-send hands the delivery back at once, the cut attempt ' + 'recorded',
    async () => {
      const tuning = { pollMs: 50, leaseMs: 20_000, timeoutMs: 10_000 }
      const a = await startServer({ WEBHOOK_ALLOW_PRIVATE: 'true' }, {}, { tuning: { webhooks: tuning } })
      const b = await startServer(
        { WEBHOOK_ALLOW_PRIVATE: 'true' },
        {},
        { databaseUrl: a.databaseUrl, tuning: { webhooks: tuning } },
      )
      await b.deps.webhooks.stop()
      const receiver = await startReceiver()
      receiver.answer = () => {} // holds the attempt open
      const hook = await a.request('POST', '/webhooks', {
        body: { url: receiver.url, event_types: ['product.created'] },
      })
      assert.equal(
        (await a.request('POST', '/products', { body: { sku: 'STOP-1', name: 'x', price: 1, currency: 'EUR' } }))
          .status,
        201,
      )
      await receiver.waitFor('the first attempt', (r) => r.length === 1)
      const [{ leasedUntil }] = await a.sql`
      SELECT (extract(epoch FROM leased_until) * 1000)::float8 AS "leasedUntil" FROM webhook_deliveries`
      await a.deps.webhooks.stop()
      const [row] = await a.sql`SELECT status, leased_until, next_attempt_at <= now() AS due FROM webhook_deliveries`
      assert.deepEqual({ ...row }, { status: 'pending', leased_until: null, due: true })
      receiver.answer = answerWith(200)
      b.deps.webhooks.start()
      await receiver.waitFor('the attempt by the other instance', (r) => r.length === 2)
      assert.ok(receiver.received[1]!.at < leasedUntil, 'sent before the lease would have run out')
      await waitUntil(
        'the success recorded',
        async () => (await a.sql`SELECT status FROM webhook_deliveries`)[0]!.status === 'succeeded',
        20_000,
      )
      const [delivery] = (await b.request('GET', `/webhooks/${hook.body.id}/deliveries`)).body
      assert.deepEqual(
        delivery.attempts.map((x: { status: number | null; error: string | null }) => [x.status, x.error]),
        [
          [200, null],
          [null, 'the service stopped during the attempt'],
        ],
      )
    },
  )
})
