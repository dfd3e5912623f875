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
  test(
    'refuses loopback, link-local, private, unique-local, unspecified, CGNAT, multicast, and their IPv4-mapped, ' +
      'NAT64 and 6to4 forms',
    () => {
      const refused = [
        '127.0.0.1',
        '127.255.255.254',
        '10.0.0.1',
        '172.16.0.1',
        '172.31.255.255',
        '192.168.1.1',
        '169.254.169.254',
        '100.64.0.1',
        '100.127.255.255',
        '0.0.0.0',
        '224.0.0.1',
        '239.255.255.250',
        '255.255.255.255',
        '::1',
        '::',
        'fc00::1',
        'fd12:3456::1',
        'fe80::1',
        'ff02::1',
        '::ffff:127.0.0.1',
        '::ffff:7f00:1',
        '::ffff:10.0.0.1',
        '::ffff:169.254.169.254',
        '::ffff:a9fe:a9fe',
        '::ffff:192.168.0.1',
        '::127.0.0.1',
        '64:ff9b::7f00:1',
        '64:ff9b::10.0.0.1',
        '2002:7f00:1::1',
        '2002:a9fe:a9fe::',
        'fe80::1%lo',
        'not an address',
      ]
      const allowed = [
        '8.8.8.8',
        '1.1.1.1',
        '203.0.113.10',
        '172.32.0.1',
        '100.128.0.1',
        '192.169.0.1',
        '2606:4700:4700::1111',
        '::ffff:8.8.8.8',
        '2001:db8::1',
        '64:ff9b::8.8.8.8',
        '2002:808:808::1',
      ]
      for (const a of refused) assert.equal(isForbiddenAddress(a), true, a)
      for (const a of allowed) assert.equal(isForbiddenAddress(a), false, a)
    },
  )

  test(
    'refuses every IPv6 translation form that can carry a private IPv4 address: local-use NAT64, SIIT, Teredo; ' +
      'keeps the public ones of fixed forms',
    () => {
      const refused = [
        // Local-use NAT64 (64:ff9b:1::/48) and the rest of 64:ff9b::/32 outside the well-known /96: refused whatever
        // they embed.
        '64:ff9b:1::a9fe:a9fe',
        '64:ff9b:1::7f00:1',
        '64:ff9b:1::8.8.8.8',
        '64:ff9b:1:a9fe:a900:fe00::',
        '64:ff9b:0:1::7f00:1',
        '64:ff9b:ffff::1',
        // SIIT IPv4-translated (::ffff:0:0:0/96).
        '::ffff:0:a9fe:a9fe',
        '::ffff:0:169.254.169.254',
        '::ffff:0:7f00:1',
        '::ffff:0:8.8.8.8',
        // Teredo (2001::/32): client 127.0.0.1 (7f00:1 inverted is
        // 80ff:fffe), server 127.0.0.1, and a public pair alike.
        '2001:0:4136:e378:8000:63bf:80ff:fffe',
        '2001:0:7f00:1::',
        '2001::1',
        '2001:0:808:808:0:0:f7f7:f7f7',
        // IPv4-mapped and -compatible, and the fixed forms with a private address inside.
        '::ffff:169.254.169.254',
        '::a9fe:a9fe',
        '::10.0.0.1',
        '64:ff9b::a9fe:a9fe',
        '64:ff9b::192.168.1.1',
        '2002:a00:1::1',
        '2002:c0a8:101::',
      ]
      const allowed = [
        '64:ff9b::808:808',
        '2002:808:808::1',
        '::ffff:1.1.1.1',
        '2001:db8::1',
        '2001:1::1',
        '2001:4860:4860::8888',
      ]
      for (const a of refused) assert.equal(isForbiddenAddress(a), true, a)
      for (const a of allowed) assert.equal(isForbiddenAddress(a), false, a)
    },
  )

  test('allows port 443 only, unless WEBHOOK_ALLOWED_PORTS lists the port; WEBHOOK_ALLOW_PRIVATE lifts it', () => {
    const none = { webhookAllowPrivate: false, webhookAllowedPorts: new Set<number>() }
    const some = { webhookAllowPrivate: false, webhookAllowedPorts: new Set([8443]) }
    assert.equal(refusalOfUrl(new URL('https://8.8.8.8/'), none), undefined)
    assert.equal(refusalOfUrl(new URL('https://8.8.8.8:443/'), none), undefined)
    assert.equal(
      refusalOfUrl(new URL('https://8.8.8.8:6379/'), none),
      'must use port 443, or one WEBHOOK_ALLOWED_PORTS lists (not 6379)',
    )
    assert.equal(
      refusalOfUrl(new URL('https://hooks.example.com:80/'), none),
      'must use port 443, or one WEBHOOK_ALLOWED_PORTS lists (not 80)',
    )
    assert.equal(refusalOfUrl(new URL('https://hooks.example.com:8443/'), some), undefined)
    assert.equal(
      refusalOfUrl(new URL('https://hooks.example.com:8444/'), some),
      'must use port 443, or one WEBHOOK_ALLOWED_PORTS lists (not 8444)',
    )
    assert.equal(refusalOfUrl(new URL('http://127.0.0.1:6379/'), { ...none, webhookAllowPrivate: true }), undefined)
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
      [
        'https://0x7f000001/',
        false,
        'must not point at a loopback, link-local, private or reserved address (127.0.0.1) unless ' +
          'WEBHOOK_ALLOW_PRIVATE=true',
      ],
      [
        'https://2130706433/',
        false,
        'must not point at a loopback, link-local, private or reserved address (127.0.0.1) unless ' +
          'WEBHOOK_ALLOW_PRIVATE=true',
      ],
      [
        'https://[::ffff:127.0.0.1]/',
        false,
        'must not point at a loopback, link-local, private or reserved address (::ffff:7f00:1) unless ' +
          'WEBHOOK_ALLOW_PRIVATE=true',
      ],
      ['https://127.0.0.1/', true, undefined],
      // A local receiver on another port hears of WEBHOOK_ALLOW_PRIVATE, not of the port.
      [
        'https://127.1.2.3:8443/',
        false,
        'must not point at a loopback, link-local, private or reserved address (127.1.2.3) unless ' +
          'WEBHOOK_ALLOW_PRIVATE=true',
      ],
      [
        'https://localhost:8443/',
        false,
        'must not point at localhost, a loopback name, unless WEBHOOK_ALLOW_PRIVATE=true',
      ],
      [
        'https://api.LOCALHOST./',
        false,
        'must not point at api.localhost., a loopback name, unless WEBHOOK_ALLOW_PRIVATE=true',
      ],
      ['https://localhost:8443/', true, undefined],
      ['https://notlocalhost.example.com/', false, undefined],
      ['https://8.8.8.8/', false, undefined],
    ]
    for (const [url, allowPrivate, refusal] of cases) {
      assert.equal(
        refusalOfUrl(new URL(url), { webhookAllowPrivate: allowPrivate, webhookAllowedPorts: new Set() }),
        refusal,
        `${url} ${allowPrivate}`,
      )
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
      'https://127.0.0.1/hook',
      'https://127.1.2.3:8443/hook',
      'https://[::1]/hook',
      'https://169.254.169.254/latest/meta-data/',
      'https://10.0.0.1/hook',
      'https://172.16.5.4/hook',
      'https://192.168.0.1/hook',
      'https://100.64.0.1/hook',
      'https://0.0.0.0/hook',
      'https://[::]/hook',
      'https://224.0.0.1/hook',
      'https://[fc00::1]/hook',
      'https://[fe80::1]/hook',
      'https://[::ffff:127.0.0.1]/hook',
      'https://[::ffff:a9fe:a9fe]/hook',
      'https://0x7f000001/hook',
      'https://2130706433/hook',
      'https://localhost/hook',
      'https://LOCALHOST./hook',
      'https://inside.example.test/hook',
      'https://mixed.example.test/hook',
      'https://mapped.example.test/hook',
      'https://nowhere.invalid/hook',
      'http://hooks.example.test/hook',
      'http://127.0.0.1/hook',
    ]
    for (const url of refused) {
      const res = await server.request('POST', '/webhooks', { body: { url, event_types: ['product.created'] } })
      assert.ok(res.status === 400 || res.status === 422, `${url}: ${res.status}`)
      assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/)
      assert.equal(res.body.errors?.[0]?.path, '/url', url)
      // What lifts the refusal is named (a name that resolves nowhere is refused for that alone).
      if (!url.includes('nowhere')) assert.match(JSON.stringify(res.body.errors), /WEBHOOK_ALLOW_PRIVATE=true/, url)
    }
    const ok = await server.request('POST', '/webhooks', {
      body: { url: 'https://hooks.example.test/hook', event_types: ['product.created'] },
    })
    assert.equal(ok.status, 201, ok.text)
    const moved = await server.request('PATCH', `/webhooks/${ok.body.id}`, {
      body: { url: 'https://inside.example.test/hook' },
    })
    assert.equal(moved.status, 422)
    const rows = await server.sql`SELECT url FROM webhooks`
    assert.deepEqual(
      rows.map((r) => r.url),
      ['https://hooks.example.test/hook'],
    )
  })

  test(
    'refuses a delivery whose name resolves to a private address at send time (DNS rebinding), connecting ' + 'nowhere',
    async () => {
      const names = new Map([['hooks.example.test', ['203.0.113.10']]])
      const receiver = await startReceiver()
      const server = await startServer(
        { WEBHOOK_ALLOWED_PORTS: String(receiver.port) },
        {},
        { tuning: { webhooks: { ...fast, resolve: testResolver(names) } } },
      )
      // The receiver listens on 127.0.0.1, where the name points after registration.
      const hook = await server.request('POST', '/webhooks', {
        body: { url: `https://hooks.example.test:${receiver.port}/hook`, event_types: ['product.created'] },
      })
      assert.equal(hook.status, 201, hook.text)
      names.set('hooks.example.test', ['127.0.0.1'])
      const product = await server.request('POST', '/products', {
        body: { sku: 'SSRF-1', name: 'x', price: 1, currency: 'EUR' },
      })
      assert.equal(product.status, 201)
      const delivery = await waitForAttempt(server, hook.body.id)
      assert.equal(delivery.status, 'failed')
      assert.equal(delivery.attempts[0].status, null)
      assert.equal(
        delivery.attempts[0].error,
        'refused: hooks.example.test resolves to 127.0.0.1, a loopback, link-local, private or reserved address, ' +
          'which only WEBHOOK_ALLOW_PRIVATE=true allows',
      )
      assert.equal(receiver.connections, 0)
      assert.equal(receiver.received.length, 0)
    },
  )

  test('refuses a delivery to a URL registered while private addresses were allowed', async () => {
    const receiver = await startReceiver()
    const server = await startServer(
      { WEBHOOK_ALLOWED_PORTS: String(receiver.port) },
      {},
      { tuning: { webhooks: fast } },
    )
    const [hookA] = await server.sql`
      INSERT INTO webhooks (url, event_types, secret_sealed, owner_id) VALUES
      (${receiver.url}, ${['product.created']}, 'v1.test.x.y.z', ${server.admin.id}) RETURNING id`
    const [hookB] = await server.sql`
      INSERT INTO webhooks (url, event_types, secret_sealed, owner_id) VALUES
      (${`https://[::ffff:127.0.0.1]:${receiver.port}/hook`}, ${['product.created']}, 'v1.test.x.y.z',
      ${server.admin.id}) RETURNING id`
    // Sealed properly, so that the refusal, not the secret, is what stops them.
    const created = await server.request('POST', `/webhooks/${hookA!.id}/rotate-secret`)
    assert.equal(created.status, 200)
    assert.equal((await server.request('POST', `/webhooks/${hookB!.id}/rotate-secret`)).status, 200)
    const product = await server.request('POST', '/products', {
      body: { sku: 'SSRF-2', name: 'x', price: 1, currency: 'EUR' },
    })
    assert.equal(product.status, 201)
    const a = await waitForAttempt(server, hookA!.id)
    const b = await waitForAttempt(server, hookB!.id)
    assert.equal(a.attempts[0].error, 'refused: the URL must be an https URL (http needs WEBHOOK_ALLOW_PRIVATE=true)')
    assert.equal(
      b.attempts[0].error,
      'refused: the URL must not point at a loopback, link-local, private or reserved address (::ffff:7f00:1) unless ' +
        'WEBHOOK_ALLOW_PRIVATE=true',
    )
    assert.equal(receiver.connections, 0)
  })
})

describe('translation forms and ports over HTTP', () => {
  test(
    'refuses at registration (422 on /url, nothing stored) the translation forms, by literal and by name, and any ' +
      'port but 443 not listed',
    async () => {
      const names = new Map([
        ['nat64.example.test', ['64:ff9b:1::a9fe:a9fe']],
        ['teredo.example.test', ['2001:0:4136:e378:8000:63bf:80ff:fffe']],
        ['siit.example.test', ['::ffff:0:a9fe:a9fe']],
        ['sixtofour.example.test', ['2002:7f00:1::1']],
        ['hooks.example.test', ['203.0.113.10']],
      ])
      const server = await startServer(
        { WEBHOOK_ALLOWED_PORTS: '8443' },
        {},
        { tuning: { webhooks: { ...fast, resolve: testResolver(names) } } },
      )
      const cases: Array<[string, RegExp]> = [
        [
          'https://[64:ff9b:1::a9fe:a9fe]/hook',
          /loopback, link-local, private or reserved address \(64:ff9b:1::a9fe:a9fe\) unless WEBHOOK_ALLOW_PRIVATE=true/,
        ],
        [
          'https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/hook',
          /reserved address \(2001:0:4136:e378:8000:63bf:80ff:fffe\)/,
        ],
        ['https://[::ffff:0:a9fe:a9fe]/hook', /reserved address \(::ffff:0:a9fe:a9fe\)/],
        ['https://[::ffff:0:169.254.169.254]/hook', /reserved address/],
        [
          'https://nat64.example.test/hook',
          /nat64.example.test resolves to 64:ff9b:1::a9fe:a9fe, .*which only WEBHOOK_ALLOW_PRIVATE=true allows/,
        ],
        ['https://teredo.example.test/hook', /teredo.example.test resolves to 2001:0:4136:e378:8000:63bf:80ff:fffe/],
        ['https://siit.example.test/hook', /siit.example.test resolves to ::ffff:0:a9fe:a9fe/],
        ['https://sixtofour.example.test/hook', /sixtofour.example.test resolves to 2002:7f00:1::1/],
        ['https://8.8.8.8:6379/', /must use port 443, or one WEBHOOK_ALLOWED_PORTS lists \(not 6379\)/],
        ['https://hooks.example.test:22/hook', /not 22/],
        ['https://hooks.example.test:80/hook', /not 80/],
      ]
      for (const [url, message] of cases) {
        const res = await server.request('POST', '/webhooks', { body: { url, event_types: ['product.created'] } })
        assert.equal(res.status, 422, `${url}: ${res.text}`)
        assert.equal(res.body.errors[0].path, '/url')
        assert.match(res.body.errors[0].message, message, url)
      }
      assert.deepEqual([...(await server.sql`SELECT id FROM webhooks`)], [])
      for (const url of [
        'https://hooks.example.test/hook',
        'https://hooks.example.test:443/hook',
        'https://hooks.example.test:8443/hook',
      ]) {
        const res = await server.request('POST', '/webhooks', { body: { url, event_types: ['product.created'] } })
        assert.equal(res.status, 201, `${url}: ${res.text}`)
      }
      const [{ stored }] = await server.sql<[{ stored: number }]>`SELECT count(*)::int AS stored FROM webhooks`
      assert.equal(stored, 3)
    },
  )

  test(
    'refuses at connection a name that now resolves to local-use NAT64, Teredo or SIIT forms of the loopback, ' +
      'connecting nowhere',
    async () => {
      const receiver = await startReceiver()
      const forms = {
        nat64: '64:ff9b:1::7f00:1',
        teredo: '2001:0:4136:e378:8000:63bf:80ff:fffe',
        siit: '::ffff:0:7f00:1',
      }
      const names = new Map(Object.keys(forms).map((f) => [`${f}.example.test`, ['203.0.113.10']]))
      const server = await startServer(
        { WEBHOOK_ALLOWED_PORTS: String(receiver.port) },
        {},
        { tuning: { webhooks: { ...fast, resolve: testResolver(names) } } },
      )
      const hooks: Array<[string, number]> = []
      for (const form of Object.keys(forms)) {
        const res = await server.request('POST', '/webhooks', {
          body: { url: `https://${form}.example.test:${receiver.port}/hook`, event_types: ['product.created'] },
        })
        assert.equal(res.status, 201, res.text)
        hooks.push([form, res.body.id])
      }
      for (const [form, address] of Object.entries(forms)) names.set(`${form}.example.test`, [address])
      const product = await server.request('POST', '/products', {
        body: { sku: 'SSRF-FORMS', name: 'x', price: 1, currency: 'EUR' },
      })
      assert.equal(product.status, 201)
      for (const [form, id] of hooks) {
        const delivery = await waitForAttempt(server, id)
        assert.equal(
          delivery.attempts[0].error,
          `refused: ${form}.example.test resolves ` +
            `to ${forms[form as keyof typeof forms]}, a loopback, link-local, private or reserved address, which ` +
            `only WEBHOOK_ALLOW_PRIVATE=true allows`,
        )
      }
      assert.equal(receiver.connections, 0)
    },
  )

  test(
    'refuses at connection a port no longer allowed (an instance started without it in WEBHOOK_ALLOWED_PORTS), ' +
      'connecting nowhere',
    async () => {
      const receiver = await startReceiver()
      const resolve = testResolver(new Map([['hooks.example.test', ['203.0.113.10']]]))
      const registrar = await startServer(
        { WEBHOOK_ALLOWED_PORTS: String(receiver.port) },
        {},
        { tuning: { webhooks: { ...fast, resolve } } },
      )
      await registrar.deps.webhooks.stop()
      const hook = await registrar.request('POST', '/webhooks', {
        body: { url: `https://hooks.example.test:${receiver.port}/hook`, event_types: ['product.created'] },
      })
      assert.equal(hook.status, 201, hook.text)
      const sender = await startServer(
        {},
        {},
        { databaseUrl: registrar.databaseUrl, tuning: { webhooks: { ...fast, resolve } } },
      )
      const product = await registrar.request('POST', '/products', {
        body: { sku: 'SSRF-PORT', name: 'x', price: 1, currency: 'EUR' },
      })
      assert.equal(product.status, 201)
      const delivery = await waitForAttempt(sender, hook.body.id)
      assert.equal(delivery.status, 'failed')
      assert.equal(
        delivery.attempts[0].error,
        `refused: the URL must use port 443, or one WEBHOOK_ALLOWED_PORTS lists (not ${receiver.port})`,
      )
      assert.equal(receiver.connections, 0)
    },
  )
})
