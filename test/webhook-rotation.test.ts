import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { Webhook } from 'standardwebhooks'
import { waitUntil } from './helpers/wait.js'
import { startServer, type TestServer } from './helpers/server.js'
import { startReceiver } from './helpers/webhook-receiver.js'

// JWT_SECRETS rotated as docs/auth.md says: the new key added first (k2,k1),
// then, later, the old one dropped (k2). Each step is a restart: a service
// on the same database with the new setting, the previous one's worker
// stopped. Webhooks go on being signed with their secrets throughout, and a
// list cursor made under k1 still opens while k1 is configured.

const K1 = 'k1:first-secret-that-is-at-least-32-bytes-long'
const K2 = 'k2:second-secret-that-is-at-least-32-bytes-long'
const fast = { pollMs: 50, retryDelaysMs: [], retryJitter: 0, timeoutMs: 1000, leaseMs: 3000 }

const instance = (jwtSecrets: string, databaseUrl?: string) =>
  startServer(
    { WEBHOOK_ALLOW_PRIVATE: 'true', JWT_SECRETS: jwtSecrets },
    {},
    { databaseUrl, tuning: { webhooks: fast } },
  )

const kidsOf = async (server: TestServer) =>
  (
    await server.sql<Array<{ kid: string }>>`
  SELECT split_part(secret_sealed, '.', 2) AS kid FROM webhooks UNION SELECT split_part(previous_secret_sealed, '.',
  2) FROM webhooks WHERE previous_secret_sealed IS NOT NULL
  ORDER BY 1`
  ).map((r) => r.kid)

const nextCursor = (link: string | null) =>
  new URL(`http://x${/^<([^>]+)>/.exec(link ?? '')![1]}`).searchParams.get('cursor')!

describe('JWT_SECRETS rotation', () => {
  test(
    'k1, then k2,k1, then k2: every webhook is still signed with its secret, and a cursor made under k1 opens ' +
      'while k1 is configured',
    async () => {
      const receiver = await startReceiver()
      const first = await instance(K1)
      const hooks: Array<{ id: number; secret: string }> = []
      for (let i = 0; i < 3; i++) {
        const res = await first.request('POST', '/webhooks', {
          body: { url: receiver.url, event_types: ['product.created'], description: `hook ${i}` },
        })
        assert.equal(res.status, 201, res.text)
        hooks.push({ id: res.body.id, secret: res.body.secret })
      }
      // One with a previous secret still signing beside the current one: both sealed under k1.
      const previous = hooks[2]!.secret
      const rotated = await first.request('POST', `/webhooks/${hooks[2]!.id}/rotate-secret`, {
        body: { keep_previous_for: 3600 },
      })
      assert.equal(rotated.status, 200)
      hooks[2]!.secret = rotated.body.secret
      assert.deepEqual(await kidsOf(first), ['k1'])
      const page = await first.request('GET', '/webhooks?limit=1&sort=id')
      assert.equal(page.status, 200)
      const cursor = nextCursor(page.headers.get('link'))
      await first.deps.webhooks.stop()

      // Step 1: the new key first, the old one still there. The secrets move to k2.
      const second = await instance(`${K2},${K1}`, first.databaseUrl)
      await waitUntil('every secret sealed under k2', async () => (await kidsOf(second)).join() === 'k2')
      assert.ok(
        second.logs.some(
          (l) => l.msg === 'webhook secrets sealed again under the first JWT secret' && l.count === 3 && l.kid === 'k2',
        ),
        'logged once, with the count',
      )
      const resumed = await second.request('GET', `/webhooks?limit=1&sort=id&cursor=${cursor}`)
      assert.equal(resumed.status, 200, resumed.text)
      assert.deepEqual(
        resumed.body.map((h: { id: number }) => h.id),
        [hooks[1]!.id],
      )
      // Nothing a client sees changed: the same versions, no event.
      const read = await second.request('GET', `/webhooks/${hooks[0]!.id}`)
      assert.equal(read.headers.get('etag'), '"v1"')
      await second.deps.webhooks.stop()

      // Step 2: the old key dropped.
      const third = await instance(K2, first.databaseUrl)
      const product = await third.request('POST', '/products', {
        body: { sku: 'ROTATE-1', name: 'x', price: 1, currency: 'EUR' },
      })
      assert.equal(product.status, 201)
      await receiver.waitFor('a delivery per webhook', (r) => r.length >= 3)
      const bySignatureCount = receiver.received
        .map((r) => String(r.headers['webhook-signature']).split(' ').length)
        .sort()
      assert.deepEqual(bySignatureCount, [1, 1, 2], 'the webhook with a previous secret is signed twice')
      for (const hook of hooks) {
        const verified = receiver.received.filter((r) => {
          try {
            new Webhook(hook.secret).verify(r.body, r.headers as Record<string, string>)
            return true
          } catch {
            return false
          }
        })
        assert.equal(verified.length, 1, `webhook ${hook.id}: one delivery verifies with its secret`)
      }
      const twice = receiver.received.find((r) => String(r.headers['webhook-signature']).includes(' '))!
      assert.doesNotThrow(
        () => new Webhook(previous).verify(twice.body, twice.headers as Record<string, string>),
        'the previous secret still verifies',
      )
      await waitUntil(
        'every delivery recorded',
        async () => (await third.sql`SELECT id FROM webhook_deliveries WHERE status <> 'succeeded'`).length === 0,
      )
      const failed = await third.sql`SELECT id, status, last_error FROM webhook_deliveries WHERE status <> 'succeeded'`
      assert.deepEqual([...failed], [])

      // A cursor older than the removal of its key is refused; the client starts the listing again.
      const stale = await third.request('GET', `/webhooks?limit=1&sort=id&cursor=${cursor}`)
      assert.equal(stale.status, 400)
      assert.equal(stale.body.code, 'invalid_parameter')
      assert.deepEqual(stale.body.errors, [{ path: 'cursor', message: 'is not a valid cursor' }])
    },
  )

  test(
    'an Idempotency-Key first used under k1 is replayed under k2,k1, and another body with it is still ' + '422',
    async () => {
      const first = await instance(K1)
      const body = { sku: 'ROTATE-IDEM', name: 'x', price: 1, currency: 'EUR' }
      const headers = { 'idempotency-key': 'rotation-1' }
      const created = await first.request('POST', '/products', { body, headers })
      assert.equal(created.status, 201, created.text)
      const second = await instance(`${K2},${K1}`, first.databaseUrl)
      // The same caller (its JWT, signed with k1, verifies under k2,k1).
      const replayed = await second.request('POST', '/products', { body, headers, auth: first.admin.token })
      assert.equal(replayed.status, 201, replayed.text)
      assert.equal(replayed.headers.get('idempotent-replayed'), 'true')
      assert.equal(replayed.body.id, created.body.id)
      const other = await second.request('POST', '/products', {
        body: { ...body, name: 'y' },
        headers,
        auth: first.admin.token,
      })
      assert.equal(other.status, 422)
      const [{ products }] = await second.sql<
        [{ products: number }]
      >`SELECT count(*)::int AS products FROM products WHERE sku = 'ROTATE-IDEM'`
      assert.equal(products, 1)
    },
  )
})
