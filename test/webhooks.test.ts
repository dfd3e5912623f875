import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { Webhook } from 'standardwebhooks'
import { startServer, type TestServer } from './helpers/server.js'
import { answerWith, startReceiver } from './helpers/webhook-receiver.js'

// Webhooks through the real server: registration and its refusals, the
// deliveries a receiver gets (checked with the standardwebhooks package, an
// independent implementation of the signature), retries, and the record of
// every attempt.

const fast = { pollMs: 50, retryDelaysMs: [50, 50, 50, 50], retryJitter: 0, timeoutMs: 1000, leaseMs: 3000 }

async function webhookServer(tuning: Record<string, unknown> = {}): Promise<TestServer> {
  return startServer({ WEBHOOK_ALLOW_PRIVATE: 'true' }, {}, { tuning: { webhooks: { ...fast, ...tuning } } })
}

async function register(server: TestServer, body: Record<string, unknown>) {
  const res = await server.request('POST', '/webhooks', { body })
  assert.equal(res.status, 201, res.text)
  return res.body as { id: number; secret: string; [k: string]: unknown }
}

describe('webhook registration', () => {
  test('creates a webhook and shows its secret once, never again', async () => {
    const server = await webhookServer()
    const res = await server.request('POST', '/webhooks', { body: { url: 'http://127.0.0.1:9/hook', event_types: ['product.created'], description: 'catalogue sync' } })
    assert.equal(res.status, 201)
    assert.equal(res.headers.get('cache-control'), 'no-store')
    assert.equal(res.headers.get('location'), `/webhooks/${res.body.id}`)
    assert.equal(res.headers.get('etag'), '"v1"')
    assert.match(res.body.secret, /^whsec_[A-Za-z0-9+/]{43}=$/)
    assert.equal(Buffer.from(res.body.secret.slice(6), 'base64').length, 32)
    assert.deepEqual({ ...res.body, secret: undefined, id: undefined, created_at: undefined, updated_at: undefined }, {
      url: 'http://127.0.0.1:9/hook', event_types: ['product.created'], description: 'catalogue sync', status: 'active',
      last_error: null, created_by: server.admin.id, secret: undefined, id: undefined, created_at: undefined, updated_at: undefined,
    })
    const read = await server.request('GET', `/webhooks/${res.body.id}`)
    assert.equal(read.status, 200)
    assert.equal(read.body.secret, undefined)
    assert.equal(read.body.secret_sealed, undefined)
    const [row] = await server.sql`SELECT secret_sealed FROM webhooks WHERE id = ${res.body.id}`
    assert.ok(!row!.secret_sealed.includes(res.body.secret.slice(6)), 'stored sealed, not as sent')
  })
})
