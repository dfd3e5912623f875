import assert from 'node:assert/strict'
import { isIP } from 'node:net'
import { describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { isForbiddenAddress, refusalOfUrl, systemResolver, type Resolver } from '../src/webhooks/address-policy.js'
import { startServer, type TestServer } from './helpers/server.js'
import { startReceiver } from './helpers/webhook-receiver.js'

// Server-side request forgery: with WEBHOOK_ALLOW_PRIVATE unset, a webhook
// may not point at loopback, link-local, private or reserved addresses, by
// literal or by name, at registration and again at every delivery (DNS
// rebinding). The test's resolver answers for *.example.test as the test
// says, and asks the system for anything else (localhost).

describe('address policy', () => {
  test('refuses loopback, link-local, private, unique-local, unspecified, CGNAT, multicast, and their IPv4-mapped, NAT64 and 6to4 forms', () => {
    const refused = [
      '127.0.0.1', '127.255.255.254', '10.0.0.1', '172.16.0.1', '172.31.255.255', '192.168.1.1', '169.254.169.254', '100.64.0.1', '100.127.255.255',
      '0.0.0.0', '224.0.0.1', '239.255.255.250', '255.255.255.255', '::1', '::', 'fc00::1', 'fd12:3456::1', 'fe80::1', 'ff02::1',
      '::ffff:127.0.0.1', '::ffff:7f00:1', '::ffff:10.0.0.1', '::ffff:169.254.169.254', '::ffff:a9fe:a9fe', '::ffff:192.168.0.1', '::127.0.0.1',
      '64:ff9b::7f00:1', '64:ff9b::10.0.0.1', '2002:7f00:1::1', '2002:a9fe:a9fe::', 'fe80::1%lo', 'not an address',
    ]
    const allowed = ['8.8.8.8', '1.1.1.1', '203.0.113.10', '172.32.0.1', '100.128.0.1', '192.169.0.1', '2606:4700:4700::1111', '::ffff:8.8.8.8', '2001:db8::1', '64:ff9b::8.8.8.8', '2002:808:808::1']
    for (const a of refused) assert.equal(isForbiddenAddress(a), true, a)
    for (const a of allowed) assert.equal(isForbiddenAddress(a), false, a)
  })

  test('judges a URL by its scheme, userinfo and literal host; URL forms of an address are normalized first', () => {
    const cases: Array<[string, boolean, string | undefined]> = [
      ['https://hooks.example.com/x', false, undefined],
      ['http://hooks.example.com/x', false, 'must be an https URL (http needs WEBHOOK_ALLOW_PRIVATE=true)'],
      ['http://hooks.example.com/x', true, undefined],
      ['ftp://hooks.example.com/x', true, 'must be an http or https URL'],
      ['https://u:p@hooks.example.com/', false, 'must not carry a user name or password'],
      ['https://u@hooks.example.com/', true, 'must not carry a user name or password'],
      ['https://hooks.example.com/#frag', false, 'must not carry a fragment'],
      ['https://0x7f000001/', false, 'must not point at a loopback, link-local, private or reserved address (127.0.0.1) unless WEBHOOK_ALLOW_PRIVATE=true'],
      ['https://2130706433/', false, 'must not point at a loopback, link-local, private or reserved address (127.0.0.1) unless WEBHOOK_ALLOW_PRIVATE=true'],
      ['https://[::ffff:127.0.0.1]/', false, 'must not point at a loopback, link-local, private or reserved address (::ffff:7f00:1) unless WEBHOOK_ALLOW_PRIVATE=true'],
      ['https://127.0.0.1/', true, undefined],
      ['https://8.8.8.8/', false, undefined],
    ]
    for (const [url, allowPrivate, refusal] of cases) {
      assert.equal(refusalOfUrl(new URL(url), { webhookAllowPrivate: allowPrivate, webhookAllowedPorts: new Set() }), refusal, `${url} ${allowPrivate}`)
    }
  })
})

/** Answers for the names in `names` (changeable by the test), the system for the rest. */
function testResolver(names: Map<string, string[]>): Resolver {
  return async (host) => {
    const addresses = names.get(host)
    if (!addresses) return systemResolver(host)
    return addresses.map((address) => ({ address, family: isIP(address) }))
  }
}

const fast = { pollMs: 50, retryDelaysMs: [], retryJitter: 0, timeoutMs: 1000, leaseMs: 3000 }

async function waitForAttempt(server: TestServer, webhookId: number) {
  const deadline = Date.now() + 10_000
  for (;;) {
    const res = await server.request('GET', `/webhooks/${webhookId}/deliveries`)
    if (res.body[0]?.attempts.length) return res.body[0]
    if (Date.now() > deadline) throw new Error('no attempt recorded')
    await sleep(25)
  }
}

describe('webhook URLs without WEBHOOK_ALLOW_PRIVATE', () => {
  test('refuses internal addresses, by literal or by name, and http, at registration', async () => {
    const names = new Map([
      ['hooks.example.test', ['203.0.113.10']],
      ['inside.example.test', ['10.1.2.3']],
      ['mixed.example.test', ['203.0.113.11', '192.168.0.7']],
      ['mapped.example.test', ['::ffff:127.0.0.1']],
    ])
    const server = await startServer({}, {}, { tuning: { webhooks: { ...fast, resolve: testResolver(names) } } })
    assert.equal(server.deps.config.webhookAllowPrivate, false)
    const refused = [
      'https://127.0.0.1/hook', 'https://127.1.2.3:8443/hook', 'https://[::1]/hook', 'https://169.254.169.254/latest/meta-data/', 'https://10.0.0.1/hook',
      'https://172.16.5.4/hook', 'https://192.168.0.1/hook', 'https://100.64.0.1/hook', 'https://0.0.0.0/hook', 'https://[::]/hook', 'https://224.0.0.1/hook',
      'https://[fc00::1]/hook', 'https://[fe80::1]/hook', 'https://[::ffff:127.0.0.1]/hook', 'https://[::ffff:a9fe:a9fe]/hook', 'https://0x7f000001/hook',
      'https://2130706433/hook', 'https://localhost/hook', 'https://LOCALHOST./hook', 'https://inside.example.test/hook', 'https://mixed.example.test/hook',
      'https://mapped.example.test/hook', 'https://nowhere.invalid/hook',
      'http://hooks.example.test/hook', 'http://127.0.0.1/hook',
    ]
    for (const url of refused) {
      const res = await server.request('POST', '/webhooks', { body: { url, event_types: ['product.created'] } })
      assert.ok(res.status === 400 || res.status === 422, `${url}: ${res.status}`)
      assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/)
      assert.equal(res.body.errors?.[0]?.path, '/url', url)
    }
    const ok = await server.request('POST', '/webhooks', { body: { url: 'https://hooks.example.test/hook', event_types: ['product.created'] } })
    assert.equal(ok.status, 201, ok.text)
    const moved = await server.request('PATCH', `/webhooks/${ok.body.id}`, { body: { url: 'https://inside.example.test/hook' } })
    assert.equal(moved.status, 422)
    const rows = await server.sql`SELECT url FROM webhooks`
    assert.deepEqual(rows.map((r) => r.url), ['https://hooks.example.test/hook'])
  })

  test('refuses a delivery whose name resolves to a private address at send time (DNS rebinding), connecting nowhere', async () => {
    const names = new Map([['hooks.example.test', ['203.0.113.10']]])
    const receiver = await startReceiver()
    const server = await startServer({ WEBHOOK_ALLOWED_PORTS: String(receiver.port) }, {}, { tuning: { webhooks: { ...fast, resolve: testResolver(names) } } })
    // The receiver listens on 127.0.0.1, where the name points after registration.
    const hook = await server.request('POST', '/webhooks', { body: { url: `https://hooks.example.test:${receiver.port}/hook`, event_types: ['product.created'] } })
    assert.equal(hook.status, 201, hook.text)
    names.set('hooks.example.test', ['127.0.0.1'])
    const product = await server.request('POST', '/products', { body: { sku: 'SSRF-1', name: 'x', price: 1, currency: 'EUR' } })
    assert.equal(product.status, 201)
    const delivery = await waitForAttempt(server, hook.body.id)
    assert.equal(delivery.status, 'failed')
    assert.equal(delivery.attempts[0].status, null)
    assert.equal(delivery.attempts[0].error, 'refused: hooks.example.test resolves to 127.0.0.1, a loopback, link-local, private or reserved address (WEBHOOK_ALLOW_PRIVATE=true allows it)')
    assert.equal(receiver.connections, 0)
    assert.equal(receiver.received.length, 0)
  })

  test('refuses a delivery to a URL registered while private addresses were allowed', async () => {
    const receiver = await startReceiver()
    const server = await startServer({ WEBHOOK_ALLOWED_PORTS: String(receiver.port) }, {}, { tuning: { webhooks: fast } })
    const [hookA] = await server.sql`
      INSERT INTO webhooks (url, event_types, secret_sealed, owner_id) VALUES (${receiver.url}, ${['product.created']}, 'v1.test.x.y.z', ${server.admin.id}) RETURNING id`
    const [hookB] = await server.sql`
      INSERT INTO webhooks (url, event_types, secret_sealed, owner_id) VALUES (${`https://[::ffff:127.0.0.1]:${receiver.port}/hook`}, ${['product.created']}, 'v1.test.x.y.z', ${server.admin.id}) RETURNING id`
    // Sealed properly, so that the refusal, not the secret, is what stops them.
    const created = await server.request('POST', `/webhooks/${hookA!.id}/rotate-secret`)
    assert.equal(created.status, 200)
    assert.equal((await server.request('POST', `/webhooks/${hookB!.id}/rotate-secret`)).status, 200)
    const product = await server.request('POST', '/products', { body: { sku: 'SSRF-2', name: 'x', price: 1, currency: 'EUR' } })
    assert.equal(product.status, 201)
    const a = await waitForAttempt(server, hookA!.id)
    const b = await waitForAttempt(server, hookB!.id)
    assert.equal(a.attempts[0].error, 'refused: the URL must be an https URL (http needs WEBHOOK_ALLOW_PRIVATE=true)')
    assert.equal(b.attempts[0].error, 'refused: the URL must not point at a loopback, link-local, private or reserved address (::ffff:7f00:1) unless WEBHOOK_ALLOW_PRIVATE=true')
    assert.equal(receiver.connections, 0)
  })
})
