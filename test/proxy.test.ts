import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { Agent } from 'node:http'
import { after, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { loadConfig } from '../src/config.js'
import { adminToken, spawnService, type Spawned } from './fault-kit.js'
import { call, tally, type Answer } from './helpers/http-client.js'
import { startNginx } from './helpers/nginx.js'
import { createTestDatabase, startServer } from './helpers/server.js'
import { insertEvents, SseClient } from './helpers/sse.js'
import { connect } from '../src/core/db/connect.js'

// The service behind a real nginx running deploy/nginx.conf (test/helpers/nginx.ts).
// Clients connect from addresses of their own on the loopback network
// (127.0.0.2, 127.0.0.3, ...), so the address nginx sees differs from its own
// (127.0.0.1), which is the only address the service sees on the socket.


const keepAlive = (from = '127.0.0.1', sockets = 64) => new Agent({ keepAlive: true, maxSockets: sockets, localAddress: from })
const hostOf = (url: string) => new URL(url).host

describe('deploy/nginx.conf against the service defaults', () => {
  const text = readFileSync(new URL('../deploy/nginx.conf', import.meta.url), 'utf8')
  const block = (opening: string) => {
    const start = text.indexOf(`${opening} {`)
    assert.ok(start >= 0, `${opening} in deploy/nginx.conf`)
    return text.slice(start, text.indexOf('\n    }', start))
  }
  const directive = (within: string, name: string, units: Record<string, number>) => {
    const found = new RegExp(`^\\s*${name} ([0-9]+)([a-z]?);`, 'm').exec(within)
    assert.ok(found && found[2]! in units, `${name} in deploy/nginx.conf`)
    return Number(found[1]) * units[found[2]!]!
  }
  const milliseconds = (within: string, name: string) => directive(within, name, { '': 1000, s: 1000, m: 60_000 })
  const bytes = (within: string, name: string) => directive(within, name, { '': 1, k: 1024, m: 1024 * 1024 })
  const service = loadConfig({})

  test('nginx closes an idle upstream connection before the service does', () => {
    assert.ok(milliseconds(block('upstream api'), 'keepalive_timeout') < service.keepAliveTimeoutMs)
  })

  test('nginx waits longer than the service takes to answer a slow request itself', () => {
    const location = block('location /')
    assert.ok(milliseconds(location, 'proxy_read_timeout') > service.requestTimeoutMs)
    assert.ok(milliseconds(location, 'proxy_read_timeout') > service.statementTimeoutMs)
  })

  test('nginx lets through every body the service accepts, and no more than the service reads away to answer 413', () => {
    const limit = bytes(block('server'), 'client_max_body_size')
    assert.ok(limit > service.bodyLimit && limit <= 2 * service.bodyLimit)
  })
})

describe('behind nginx with TRUST_PROXY=1', async () => {
  const server = await startServer({ TRUST_PROXY: '1', RATE_LIMIT: '40' })
  const nginx = await startNginx([hostOf(server.url)])
  after(() => nginx.stop())

  test('logs and rate limits see the real client address, and a client-written X-Forwarded-For changes neither', async () => {
    const spoofs = ['203.0.113.7', '198.51.100.1, 203.0.113.8', 'unknown', '127.0.0.9', '::1', `10.0.0.${Math.floor(Math.random() * 250)}`]
    const answers = []
    for (let i = 0; i < 40; i++) {
      answers.push(await call(nginx.url, 'GET', '/openapi.json', { from: '127.0.0.2', headers: { 'x-forwarded-for': spoofs[i % spoofs.length]! } }))
    }
    assert.deepEqual(answers.map((a) => a.status), Array(40).fill(200))
    assert.equal(answers.at(-1)!.headers['ratelimit-remaining'], '0')
    const refused = await call(nginx.url, 'GET', '/openapi.json', { from: '127.0.0.2', headers: { 'x-forwarded-for': '192.0.2.55' } })
    assert.equal(refused.status, 429)
    assert.equal(refused.body.code, 'rate_limited')
    // Another client behind the same proxy has its own allowance.
    assert.equal((await call(nginx.url, 'GET', '/openapi.json', { from: '127.0.0.3' })).status, 200)

    const clients = server.logs.filter((l) => l.msg === 'request' && l.route === '/openapi.json').map((l) => l.client)
    assert.deepEqual(new Set(clients), new Set(['127.0.0.2', '127.0.0.3']))
  })

  test('login throttling counts the real client, whatever X-Forwarded-For it writes', async () => {
    // Sent at once, so that all 31 fall in one window of the per-address login rate: one after another,
    // each waiting for its hash, they take over a minute on a busy machine, and the window starts again.
    const answers = await Promise.all(Array.from({ length: 31 }, (_, i) => call(nginx.url, 'POST', '/auth/login', {
      from: '127.0.0.4',
      headers: { 'x-forwarded-for': `198.51.100.${i}` },
      body: { email: `nobody-${i}@example.com`, password: 'wrong password' },
      // The last waits for the hashes of all the others (nginx allows it 40 s).
      timeoutMs: 40_000,
    })))
    assert.deepEqual(answers.map((a) => a.status).sort(), [...Array(30).fill(401), 429])
    const other = await call(nginx.url, 'POST', '/auth/login', { from: '127.0.0.5', body: { email: 'nobody@example.com', password: 'wrong password' } })
    assert.equal(other.status, 401)
  })
})

describe('behind nginx without TRUST_PROXY', async () => {
  const server = await startServer({ RATE_LIMIT: '5' })
  const nginx = await startNginx([hostOf(server.url)])
  after(() => nginx.stop())

  test('every client has the proxy\'s address, and one client spends the allowance of all: why TRUST_PROXY=1 must be set behind it', async () => {
    for (let i = 0; i < 5; i++) assert.equal((await call(nginx.url, 'GET', '/openapi.json', { from: '127.0.0.2' })).status, 200)
    assert.equal((await call(nginx.url, 'GET', '/openapi.json', { from: '127.0.0.3' })).status, 429)
    const clients = server.logs.filter((l) => l.msg === 'request' && l.route === '/openapi.json').map((l) => l.client)
    assert.deepEqual(new Set(clients), new Set(['127.0.0.1']))
  })

  test('the service says so in its log, once: nginx sends X-Forwarded-For that TRUST_PROXY=0 ignores', async () => {
    await call(nginx.url, 'GET', '/healthz', { from: '127.0.0.2' })
    const warnings = server.logs.filter((l) => l.level === 'warn' && l.msg === 'X-Forwarded-For is ignored: TRUST_PROXY is 0')
    assert.equal(warnings.length, 1)
    assert.equal(warnings[0]!.peer, '127.0.0.1')
  })
})

describe('two instances behind nginx', async () => {
  const a = await startServer({ TRUST_PROXY: '1' })
  const b = await startServer({ TRUST_PROXY: '1' }, {}, { databaseUrl: a.databaseUrl })
  const nginx = await startNginx([hostOf(a.url), hostOf(b.url)])
  after(() => nginx.stop())
  const auth = { authorization: `Bearer ${a.admin.token}` }

  test('10,000 requests over kept-alive connections, reads and writes mixed: none failed, both instances served', async () => {
    const agent = keepAlive('127.0.0.2', 50)
    after(() => agent.destroy())
    const total = 10_000
    const answers: Answer[] = []
    const runId = Math.random().toString(36).slice(2, 8)
    let next = 0
    let created = 0
    await Promise.all(Array.from({ length: 50 }, async () => {
      for (let i = next++; i < total; i = next++) {
        answers.push(i % 10 === 0
          ? (created++, await call(nginx.url, 'POST', '/products', { agent, headers: auth, body: { sku: `PROXY-${runId}-${i}`, name: 'Proxied widget', price: 100 + i, currency: 'EUR' } }))
          : await call(nginx.url, 'GET', i % 2 ? '/products?limit=10' : `/users/${a.admin.id}`, { agent, headers: auth }))
      }
    }))
    assert.deepEqual(tally(answers), { 200: total - created, 201: created })
    const [{ count }] = await a.sql<[{ count: number }]>`SELECT count(*)::int AS count FROM products WHERE sku LIKE ${`PROXY-${runId}-%`}`
    assert.equal(count, created)
    const served = (s: typeof a) => s.logs.filter((l) => l.msg === 'request' && l.client === '127.0.0.2').length
    assert.ok(served(a) > 1000 && served(b) > 1000, `each instance served a share: ${served(a)} and ${served(b)}`)
    assert.doesNotMatch(nginx.errors(), /\[(error|crit|alert|emerg)\]/)
  })

  test('an event stream is passed on at once: each event arrives as it is written', async () => {
    const stream = await SseClient.open(nginx.url, '/events/stream', { headers: auth })
    after(() => stream.close())
    assert.equal(stream.status, 200)
    assert.match(stream.headers['content-type'] ?? '', /^text\/event-stream/)
    for (let i = 0; i < 3; i++) {
      const started = performance.now()
      const created = await call(nginx.url, 'POST', '/products', { headers: auth, body: { sku: `STREAM-${Date.now()}-${i}`, name: 'Streamed', price: 1, currency: 'EUR' } })
      assert.equal(created.status, 201)
      await stream.waitFor(() => stream.events.some((e) => JSON.parse(e.data).subject.id === created.body.id), 2000, `the event of product ${created.body.id}`)
      assert.ok(performance.now() - started < 2000)
    }
  })

  // With buffering on, nginx would read the stream ahead into memory and then into a temporary file (up
  // to 1 GB per stream), and the service could neither see a slow client nor bound what it holds for it.
  test('a stream is not buffered: a client that stops reading holds the service back, which cuts it', async () => {
    const s = await startServer({ TRUST_PROXY: '1' }, {}, { databaseUrl: a.databaseUrl, tuning: { streams: { bufferLimitBytes: 64 * 1024 } } })
    const proxy = await startNginx([hostOf(s.url)])
    after(() => proxy.stop())
    const slow = await SseClient.open(proxy.url, '/events/stream', { headers: auth })
    await slow.waitFor(() => slow.retry !== undefined, 5000, 'retry:')
    slow.res.pause()
    // About 20 MB of events: more than the socket buffers between the client, nginx and the service hold.
    // Linux sizes those as the data flows (up to tcp_rmem's 32 MB here), and 10 MB was once all absorbed.
    for (let i = 0; i < 24; i++) await insertEvents(s.sql, 50, 16_000)
    await s.published()
    const cut = () => s.logs.some((l) => l.msg === 'event stream closed' && l.reason === 'too_slow')
    for (const deadline = Date.now() + 10_000; !cut() && Date.now() < deadline;) await sleep(50)
    assert.ok(cut(), 'the service cut the stream of the client that stopped reading')
    slow.res.resume()
    assert.deepEqual(await slow.ended, { clean: false })
  })

  test('the service, not the proxy, answers a body over BODY_LIMIT, every time: a JSON problem, never a 502', async () => {
    const agent = keepAlive('127.0.0.2', 8)
    after(() => agent.destroy())
    const answers = await Promise.all([1_100_000, 1_500_000, 2_000_000].flatMap((size) => Array.from({ length: 10 }, () =>
      call(nginx.url, 'POST', '/products', { agent, headers: auth, body: JSON.stringify({ name: 'x'.repeat(size) }) }))))
    assert.deepEqual(tally(answers), { 413: 30 })
    for (const answer of answers) assert.match(answer.headers['content-type'] ?? '', /^application\/problem\+json/)
  })
})

describe('SIGTERM to one of two instances under load', async () => {
  const databaseUrl = await createTestDatabase()
  const db = connect(databaseUrl, { max: 1, statementTimeoutMs: 10_000 })
  after(() => db.end({ timeout: 5 }))
  const [admin] = await db<[{ id: number }]>`INSERT INTO users (name, email, role) VALUES ('Proxy Admin', 'proxy-admin@example.com', 'admin') RETURNING id`
  const env = { DATABASE_URL: databaseUrl, TRUST_PROXY: '1', SHUTDOWN_TIMEOUT: '10' }
  const instances: Spawned[] = [await spawnService(env), await spawnService(env)]
  after(() => instances.filter((s) => s.alive()).forEach((s) => s.kill('SIGKILL')))
  const nginx = await startNginx(instances.map((s) => `127.0.0.1:${s.port}`))
  after(() => nginx.stop())

  test('reads go on at the other instance with none lost, every write is answered or not done, and the stopped one exits 0', async () => {
    const agent = keepAlive('127.0.0.2', 32)
    after(() => agent.destroy())
    const headers = { authorization: `Bearer ${adminToken(admin.id)}` }
    const reads: Answer[] = []
    const writes: Array<Answer & { sku: string }> = []
    let stopped = false
    const loops = Array.from({ length: 32 }, async (_, client) => {
      for (let seq = 0; !stopped; seq++) {
        if (client % 4 === 0) {
          const sku = `TERM-${client}-${seq}`
          writes.push({ sku, ...(await call(nginx.url, 'POST', '/products', { agent, headers, body: { sku, name: 'Drained', price: 1, currency: 'EUR' } })) })
        } else reads.push(await call(nginx.url, 'GET', '/products?limit=20', { agent, headers }))
      }
    })
    await sleep(1000)
    const [stopping, staying] = instances as [Spawned, Spawned]
    // The load's own rate before the stop, on this machine now, is the measure of the rate after it.
    const readsBefore = reads.length
    stopping.kill('SIGTERM')
    const exit = await stopping.exited
    const servedBefore = staying.logs.filter((l) => l.msg === 'request').length
    const readsAtExit = reads.length
    await sleep(1000)
    stopped = true
    await Promise.all(loops)
    const readsAfter = reads.length - readsAtExit

    assert.equal(exit.code, 0)
    assert.deepEqual(tally(reads), { 200: reads.length })
    // In the second after the exit, one instance reads at least a quarter of what two read in the second before it.
    assert.ok(readsBefore > 0 && readsAfter >= readsBefore / 4, `${readsBefore} reads in the second before SIGTERM, ${readsAfter} in the second after the exit`)
    assert.ok(staying.logs.filter((l) => l.msg === 'request').length >= servedBefore + readsAfter / 2, 'the other instance served the load after the stop')
    // nginx never retries a POST it has sent: one cut by the stop may fail, but must then not have been done.
    const stored = new Set((await db<Array<{ sku: string }>>`SELECT sku FROM products WHERE sku LIKE 'TERM-%'`).map((r) => r.sku))
    for (const w of writes) assert.equal(stored.has(w.sku), w.status === 201, `${w.sku}: answered ${w.status}`)
    assert.ok(writes.filter((w) => w.status === 201).length > reads.length / 20, `${writes.filter((w) => w.status === 201).length} writes done beside ${reads.length} reads`)
  })
})
