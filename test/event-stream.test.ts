import assert from 'node:assert/strict'
import { after, afterEach, test } from 'node:test'
import type { Socket } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { loadConfig } from '../src/config.js'
import { createLogger } from '../src/core/log.js'
import { createService } from '../src/service.js'
import { checkAgainstDocument, contractRouter } from './helpers/contract-check.js'
import { insertEvents, newestEventId, rawRequest, SseClient } from './helpers/sse.js'
import { startServer, TEST_JWT_SECRET, type TestServer } from './helpers/server.js'
import { waitUntil } from './helpers/wait.js'
import { withLoopLag } from './fault-kit.js'

// GET /events/stream over real HTTP: what a client reads (ids, types, data),
// resuming without gap or duplicate while writers go on, across instances,
// heartbeats, slow clients, the stream limit, SIGTERM, and the requests
// refused before anything is streamed (memory with a thousand streams:
// test/event-stream-memory.test.ts).
// How long an event takes to reach a stream, on the same instance or
// another, is a figure of `make bench-faults` (bench/faults/streams.ts).

// A small page, so that catch-ups and the reader cross pages.
const a = await startServer({}, {}, { tuning: { streams: { pageSize: 7 } } })
/** A second instance on a's database. */
const b = await startServer({}, {}, { databaseUrl: a.databaseUrl })
const clients: SseClient[] = []
// Each test's streams end with it: one left open would go on collecting every later test's events.
afterEach(() => {
  for (const c of clients) c.close()
  clients.length = 0
})

const openApi = (await (await fetch(`${a.url}/openapi.json`)).json()) as Parameters<typeof checkAgainstDocument>[0]

async function open(
  server: TestServer,
  path = '/events/stream',
  headers: Record<string, string> = {},
): Promise<SseClient> {
  const client = await SseClient.open(server.url, path, {
    headers: { authorization: `Bearer ${server.admin.token}`, ...headers },
  })
  clients.push(client)
  // A stream's status and type are held to /openapi.json like every other answer (its body never ends, so it is not
  // read here).
  checkAgainstDocument(
    openApi,
    contractRouter(server.deps.registry),
    'GET',
    path,
    '',
    client.status,
    client.headers['content-type'] ?? '',
    undefined,
  )
  return client
}

/** A stream that has fixed its starting point: every event committed from now on reaches it. */
async function follow(
  server: TestServer,
  path = '/events/stream',
  headers: Record<string, string> = {},
): Promise<SseClient> {
  const client = await open(server, path, headers)
  assert.equal(client.status, 200)
  await client.waitFor(() => client.retry !== undefined, 5000, 'retry:')
  return client
}

const committedAfter = async (server: TestServer, id: number, type?: string) => {
  await server.published()
  return (
    await server.sql<
      Array<{ id: number }>
    >`SELECT id FROM events WHERE id > ${id} ${type ? server.sql`AND type = ${type}` : server.sql``} ORDER BY id`
  ).map((r) => r.id)
}

let serial = 0
async function createProduct(server: TestServer, description = 'A widget.'): Promise<number> {
  const res = await server.request('POST', '/products', {
    body: { sku: `SSE-${process.pid}-${++serial}`, name: 'Widget', description, price: 100, currency: 'EUR', stock: 1 },
  })
  assert.equal(res.status, 201, res.text)
  return res.body.id
}

/**
 * Events written straight into the outbox (each `bytes` of data),
 * in one transaction; the publisher takes them from there.
 */
const ascending = (ids: number[]) => ids.every((id, i) => i === 0 || id > ids[i - 1]!)

test('each write is streamed as id, event and data, the data being exactly the GET /events item', async () => {
  const from = await newestEventId(a)
  const c = await open(a, '/events/stream', { 'last-event-id': String(from) })
  assert.equal(c.status, 200)
  assert.equal(c.headers['content-type'], 'text/event-stream')
  assert.equal(c.headers['cache-control'], 'no-store')
  assert.equal(c.headers['x-accel-buffering'], 'no')
  assert.equal(c.headers['content-length'], undefined)

  // Line breaks and a U+2028 in a member must not break the one-line data field.
  const id = await createProduct(a, 'line one\nline two\r\nthree\u2028four')
  assert.equal((await a.request('PATCH', `/products/${id}`, { body: { price: 250 } })).status, 200)
  assert.equal((await a.request('DELETE', `/products/${id}`)).status, 204)
  await c.waitForEvents(3)

  assert.equal(c.retry, 2000)
  assert.deepEqual(
    c.events.map((e) => e.event),
    ['product.created', 'product.updated', 'product.deleted'],
  )
  assert.deepEqual(c.ids, await committedAfter(a, from))
  for (const e of c.events) {
    const page = await a.request('GET', `/events?id=${e.id}`)
    assert.equal(page.status, 200)
    assert.equal(e.data, page.text.slice(1, -1), 'the data is the GET /events item, byte for byte')
    assert.equal(e.event, page.body[0].type)
    assert.equal(JSON.parse(e.data).subject.id, id)
  }
  assert.equal(JSON.parse(c.events[1]!.data).data.price, 250)
})

test('without Last-Event-ID the stream starts with the events committed after it started', async () => {
  await createProduct(a)
  const before = await newestEventId(a)
  const c = await follow(a)
  const id = await createProduct(a)
  await c.waitForEvents(1)
  await sleep(100)
  assert.equal(c.count, 1)
  assert.ok(Number(c.events[0]!.id) > before)
  assert.equal(JSON.parse(c.events[0]!.data).subject.id, id)
})

/** An instance on a's database whose reader reads on notifications only: its poll comes once a minute. */
const notifiedOnly = () => startServer({}, {}, { databaseUrl: a.databaseUrl, tuning: { streams: { pollMs: 60_000 } } })

test(
  'a write through one instance reaches a stream on another by the notification its commit sends, long before the ' +
    'other polls',
  async () => {
    const n = await notifiedOnly()
    const c = await follow(n)
    for (let i = 0; i < 3; i++) {
      const seen = c.count
      const id = await createProduct(a)
      await c.waitForEvents(seen + 1, 15_000)
      assert.equal(JSON.parse(c.last!.data).subject.id, id)
    }
  },
)

test(
  'resuming with Last-Event-ID, on either instance, while several writers go on: every committed id once, in ' +
    'order',
  async () => {
    const from = await newestEventId(a)
    let writing = true
    const writers = Array.from({ length: 4 }, async (_, w) => {
      for (let i = 0; i < 20; i++) await createProduct(w % 2 ? b : a)
    })
    const done = Promise.all(writers).finally(() => (writing = false))
    const received: number[] = []
    let last = from
    let reconnects = 0
    // Reconnect every few events, alternating instances, until the writers are done and everything is in.
    for (let round = 0; ; round++) {
      const server = round % 2 ? b : a
      const c = await open(server, '/events/stream', { 'last-event-id': String(last) })
      assert.equal(c.status, 200)
      if (writing) {
        // Five events, or the writers done.
        await Promise.race([c.waitForEvents(5, 10_000), done])
      } else {
        const expected = await committedAfter(a, from)
        await c.waitFor(() => (c.ids.at(-1) ?? last) >= expected.at(-1)!, 5000, 'the last committed event')
      }
      c.close()
      received.push(...c.ids)
      if (c.ids.length) last = c.ids.at(-1)!
      reconnects++
      if (!writing && last === (await committedAfter(a, from)).at(-1)) break
    }
    await done
    const committed = await committedAfter(a, from)
    assert.equal(committed.length, 80)
    assert.ok(reconnects >= 3, `${reconnects} connections`)
    assert.ok(ascending(received), 'in increasing order')
    assert.deepEqual(received, committed)
  },
)

test(
  'catch-up from an old id crosses pages while writes continue, then goes on live with no gap or ' + 'duplicate',
  async () => {
    const from = await newestEventId(a)
    await insertEvents(a.sql, 40)
    // Writers during the catch-up, so that the reader's head moves while the stream reads pages (7 events each).
    const writing = Promise.all(
      Array.from({ length: 3 }, async () => {
        for (let i = 0; i < 10; i++) {
          await createProduct(a)
          await insertEvents(a.sql, 3)
        }
      }),
    )
    const c = await open(a, '/events/stream', { 'last-event-id': String(from) })
    const filtered = await open(a, `/events/stream?type=product.created&last_event_id=${from}`)
    await writing
    const committed = await committedAfter(a, from)
    assert.equal(committed.length, 40 + 3 * 10 * 4)
    await c.waitFor(() => c.count >= committed.length, 10_000, 'every committed event')
    await sleep(200)
    assert.deepEqual(c.ids, committed)
    const created = await committedAfter(a, from, 'product.created')
    await filtered.waitFor(() => filtered.count >= created.length, 10_000, 'every product.created')
    assert.deepEqual(filtered.ids, created)
    // And live after it: the next event comes too.
    await createProduct(a)
    await c.waitForEvents(committed.length + 1)
    assert.deepEqual(c.ids, await committedAfter(a, from))
  },
)

test(
  'streams joining one after another from old ids while writers go on each get exactly the events after their ' + 'id',
  async () => {
    const start = await newestEventId(a)
    await insertEvents(a.sql, 30)
    let writing = true
    const writers = Promise.all(
      Array.from({ length: 3 }, async () => {
        for (let i = 0; i < 15; i++) await createProduct(i % 2 ? a : b)
      }),
    ).finally(() => (writing = false))
    const joined: Array<{ from: number; client: SseClient }> = []
    for (let k = 0; writing || k < 3; k++) {
      // From a point somewhere in the past, on either instance, some of them filtered.
      const from =
        start +
        Math.floor(
          Math.random() *
            ((await a.sql<[{ id: number }]>`SELECT coalesce(max(id), 0)::bigint AS id FROM events`)[0].id - start),
        )
      const server = k % 2 ? b : a
      joined.push({
        from,
        client: await open(server, k % 3 === 2 ? `/events/stream?type=product.created` : '/events/stream', {
          'last-event-id': String(from),
        }),
      })
      await sleep(15)
    }
    await writers
    for (const [k, { from, client }] of joined.entries()) {
      const expected = await committedAfter(a, from, k % 3 === 2 ? 'product.created' : undefined)
      await client.waitFor(() => client.count >= expected.length, 10_000, `stream ${k}: ${expected.length} events`)
      await sleep(20)
      assert.deepEqual(client.ids, expected, `stream ${k} from ${from}`)
    }
    assert.ok(joined.length >= 4, `${joined.length} streams`)
  },
)

test(
  'the first stream of an idle instance resuming from the start is paced by its reads, not cut, and the head is ' +
    'not set past what exists',
  async () => {
    // A fresh instance: no stream open, so no head yet. A small buffer bound: a catch-up that did not wait for the
    // client would pass it.
    const f = await startServer(
      {},
      {},
      { databaseUrl: a.databaseUrl, tuning: { streams: { bufferLimitBytes: 32 * 1024, pageSize: 50 } } },
    )
    const all = await committedAfter(f, 0)
    // A client resuming from an id that does not exist yet, then one with no id, then one from the start.
    const ahead = await open(f, '/events/stream', { 'last-event-id': String(all.at(-1)! + 1000) })
    await ahead.waitFor(() => ahead.retry !== undefined)
    const plain = await follow(f)
    const fromStart = await open(f, '/events/stream', { 'last-event-id': '0' })
    const id = await createProduct(f)
    await plain.waitForEvents(1)
    assert.equal(JSON.parse(plain.last!.data).subject.id, id)
    await fromStart.waitFor(() => fromStart.count >= all.length + 1, 20_000, 'every event from the start')
    assert.deepEqual(fromStart.ids, await committedAfter(f, 0))
    assert.equal(ahead.count, 0)
    // Caught up, the three cost the database the reader's poll and nothing more (a stream that could never catch up
    // would read again and again).
    const queries = f.deps.metrics.queries
    await sleep(1200)
    assert.ok(f.deps.metrics.queries - queries <= 4, `${f.deps.metrics.queries - queries} statements in 1.2 s`)
  },
)

test(
  'events committed while the listening connection is away reach streams once it is back, long before a ' + 'poll',
  async () => {
    // Notifications sent while it was away are lost: each reader reads again when its connection is back.
    const [x, y] = await Promise.all([notifiedOnly(), notifiedOnly()])
    const c = await follow(x)
    const d = await follow(y)
    const from = await newestEventId(a)
    // The listeners killed and events written in one transaction:
    // its notification is sent at commit, after they are gone.
    await a.sql.begin(async (tx) => {
      await tx`SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE datname = current_database() AND
      query ILIKE 'listen %' AND pid <> pg_backend_pid()`
      await tx`INSERT INTO event_outbox (type, subject_type, subject_id, data) VALUES ('product.updated', 'product',
      1, '{}')`
    })
    await Promise.all([c.waitForEvents(1, 15_000), d.waitForEvents(1, 15_000)])
    assert.deepEqual(c.ids, await committedAfter(a, from))
    assert.deepEqual(d.ids, c.ids)
  },
)

test('last_event_id in the query resumes a first connection; Last-Event-ID wins when both are given', async () => {
  const from = await newestEventId(a)
  await createProduct(a)
  await createProduct(a)
  const ids = await committedAfter(a, from)
  const byQuery = await open(a, `/events/stream?last_event_id=${from}`)
  await byQuery.waitForEvents(2)
  assert.deepEqual(byQuery.ids, ids)
  const both = await open(a, `/events/stream?last_event_id=${from}`, { 'last-event-id': String(ids[0]) })
  await both.waitForEvents(1)
  await sleep(100)
  assert.deepEqual(both.ids, [ids[1]])
})

test('a type filter sends only the events of those types', async () => {
  const from = await newestEventId(a)
  const c = await open(a, '/events/stream?type=product.created,product.deleted', { 'last-event-id': String(from) })
  const id = await createProduct(a)
  await a.request('PATCH', `/products/${id}`, { body: { price: 7 } })
  await a.request('DELETE', `/products/${id}`)
  await c.waitForEvents(2)
  await sleep(100)
  assert.deepEqual(
    c.events.map((e) => e.event),
    ['product.created', 'product.deleted'],
  )
  assert.deepEqual(
    c.ids,
    [...(await committedAfter(a, from, 'product.created')), ...(await committedAfter(a, from, 'product.deleted'))].sort(
      (x, y) => x - y,
    ),
  )
})

test(
  'an idle stream gets retry: first, then a keep-alive comment every heartbeat, and outlives the request ' + 'time-out',
  async () => {
    const heartbeatMs = 100
    const tuning = { streams: { heartbeatMs, retryMs: 1500 } }
    const timeouts = { requestTimeoutMs: 500, headersTimeoutMs: 500 }
    const h = await startServer({}, timeouts, { databaseUrl: a.databaseUrl, tuning })
    const c = await follow(h)
    assert.equal(c.retry, 1500)
    const started = performance.now()
    const threeComments = () => c.waitFor(() => c.comments.length >= 3, 10_000, 'three keep-alive comments')
    const { lagMs } = await withLoopLag(threeComments)
    // The tick that finds `retry:` just written, then three: each period as late as the event loop was held up.
    const took = performance.now() - started
    const figures = `three comments took ${took.toFixed(0)} ms (event loop held up at most ${lagMs.toFixed(0)} ms)`
    assert.ok(took < 5 * (heartbeatMs + lagMs), figures)
    assert.deepEqual(new Set(c.comments), new Set(['keep-alive']))
    assert.equal(c.count, 0)
    // Node checks the request time-out every second (src/app.ts): a stream is not a request still arriving.
    await c.waitFor(() => c.comments.length >= 20, 5000, 'keep-alive comments for two seconds')
    const id = await createProduct(h)
    await c.waitForEvents(1)
    assert.equal(JSON.parse(c.last!.data).subject.id, id)
  },
)

test(
  'a client that does not read is cut once past the buffer bound, and resumes; a reader on the same instance ' +
    'keeps receiving',
  async () => {
    const s = await startServer(
      {},
      {},
      { databaseUrl: a.databaseUrl, tuning: { streams: { bufferLimitBytes: 64 * 1024 } } },
    )
    const slow = await follow(s)
    const reader = await follow(s)
    slow.res.pause()
    const from = await newestEventId(s)
    // Enough to fill the kernel's socket buffers on both sides (a few MB), then Node's.
    for (let i = 0; i < 12; i++) await insertEvents(s.sql, 50, 16_000)
    await reader.waitFor(() => reader.count >= 600, 20_000, 'every event')
    const committed = await committedAfter(s, from)
    assert.deepEqual(reader.ids, committed)
    // The server has let go of the slow one: once it reads again, what was sent before the cut comes, then a cut, not a
    // clean end.
    const cut = () => s.logs.some((l) => l.msg === 'event stream closed' && l.reason === 'too_slow')
    await waitUntil('the slow stream cut', cut, 10_000)
    slow.res.resume()
    assert.deepEqual(await slow.ended, { clean: false })
    assert.ok(slow.count < 600, `${slow.count} events before the cut`)
    assert.deepEqual(slow.ids, committed.slice(0, slow.count))
    // It resumes from its last id and gets the rest, no gap, no duplicate.
    const resumed = await open(s, '/events/stream', { 'last-event-id': slow.events.at(-1)?.id ?? String(from) })
    await resumed.waitFor(() => resumed.count >= 600 - slow.count, 20_000, 'the rest')
    assert.deepEqual([...slow.ids, ...resumed.ids], committed)
    // The reader is still live.
    const id = await createProduct(s)
    await reader.waitForEvents(601)
    assert.equal(JSON.parse(reader.last!.data).subject.id, id)
  },
)

test(
  'the stream limit answers 503 problem+json with Retry-After; places come back when streams end, and HEAD takes ' +
    'none',
  async () => {
    const l = await startServer({}, {}, { databaseUrl: a.databaseUrl, tuning: { streams: { maxStreams: 2 } } })
    for (let i = 0; i < 3; i++) {
      const head = await fetch(`${l.url}/events/stream`, {
        method: 'HEAD',
        headers: { authorization: `Bearer ${l.admin.token}` },
      })
      assert.equal(head.status, 200)
      assert.equal(head.headers.get('content-type'), 'text/event-stream')
    }
    const one = await follow(l)
    const two = await follow(l)
    const refused = await l.request('GET', '/events/stream')
    assert.equal(refused.status, 503)
    assert.match(refused.headers.get('content-type')!, /^application\/problem\+json/)
    assert.equal(refused.headers.get('retry-after'), '5')
    assert.equal(refused.body.code, 'too_many_streams')
    one.close()
    await waitUntil('one stream open', () => l.deps.eventHub.size === 1)
    const three = await follow(l)
    two.close()
    three.close()
    await waitUntil('no stream open', () => l.deps.eventHub.size === 0)
  },
)

test(
  'streams are logged as answered once their head is out, and again when they end; they do not count as requests ' +
    'in flight',
  async () => {
    const c = await follow(a)
    const inFlight = a.deps.metrics.inFlight
    assert.equal(inFlight, 0)
    const line = a.logs.findLast((l) => l.msg === 'request' && l.route === '/events/stream')
    assert.equal(line?.status, 200)
    assert.equal(typeof line!.duration_ms, 'number')
    assert.ok(a.deps.eventHub.size >= 1, 'logged while the stream is still open')
    c.close()
    const logged = () =>
      a.logs.some((l) => l.msg === 'event stream closed' && l.request_id === c.headers['x-request-id'])
    await waitUntil('the stream logged closed', logged)
    const closed = a.logs.find((l) => l.msg === 'event stream closed' && l.request_id === c.headers['x-request-id'])!
    assert.equal(closed.reason, 'client_closed')
  },
)

test(
  'SIGTERM ends every stream at once, cleanly for clients that keep up, and the drain waits for none, not even ' +
    'one that stopped reading',
  async () => {
    const config = {
      ...loadConfig({
        PORT: '0',
        HOST: '127.0.0.1',
        LOG_LEVEL: 'error',
        JWT_SECRETS: `test:${TEST_JWT_SECRET}`,
        RATE_LIMIT: '0',
      }),
      databaseUrl: a.databaseUrl,
      databasePooler: a.deps.config.databasePooler,
    }
    // A bound no client reaches here: the one that stops reading is still open, with data waiting, at SIGTERM.
    const service = createService(config, {
      log: createLogger('error', () => {}),
      streams: { bufferLimitBytes: 64 * 1024 * 1024 },
    })
    after(() => service.close())
    const { port } = await service.listen(0, '127.0.0.1')
    // Each connection as the server holds it, by the client's port.
    const serverSide = new Map<number, Socket>()
    service.server.on('connection', (socket: Socket) => void serverSide.set(socket.remotePort!, socket))
    const url = `http://127.0.0.1:${port}`
    const headers = { authorization: `Bearer ${a.admin.token}` }
    const streams = await Promise.all(
      Array.from({ length: 5 }, () => SseClient.open(url, '/events/stream', { headers })),
    )
    for (const c of streams) await c.waitFor(() => c.retry !== undefined)
    const idle = await SseClient.open(url, '/events/stream?type=user.deleted', { headers })
    const stalled = await SseClient.open(url, '/events/stream', { headers })
    await idle.waitFor(() => idle.retry !== undefined)
    await stalled.waitFor(() => stalled.retry !== undefined)
    // One paused with nothing sent to it since, one paused under more than the kernel's buffers hold.
    idle.res.pause()
    stalled.res.pause()
    await insertEvents(a.sql, 600, 16_000)
    for (const c of streams) await c.waitForEvents(600, 20_000)
    // And one catching up from the start when the signal comes.
    const catchingUp = await SseClient.open(url, '/events/stream', { headers: { ...headers, 'last-event-id': '0' } })
    await catchingUp.waitForEvents(1)

    // The stalled one is cut at once, not given the 500 ms a cleanly ended stream gets to flush (END_GRACE_MS,
    // src/events/stream.ts): its connection closes before a timer of that length, set as the drain begins, fires.
    const stalledServerSide = serverSide.get(stalled.res.socket!.localPort!)!
    const cut = new Promise<string>((resolve) => stalledServerSide.once('close', () => resolve('cut at once')))
    const grace = sleep(500, 'waited for the grace')
    const shutdown = service.shutdown()
    assert.equal(await Promise.race([cut, grace]), 'cut at once')
    // Nobody has read since: the drain waited for no client.
    await shutdown
    idle.res.resume()
    stalled.res.resume()
    const endOf = async (c: SseClient) => (await c.endedWithin(5000)) ?? ('still open' as const)
    assert.deepEqual(
      await Promise.all([...streams, catchingUp, idle].map(endOf)),
      [...streams, catchingUp, idle].map(() => ({ clean: true })),
    )
    // The stalled one is cut (it resumes from its last whole event, as after any cut).
    assert.deepEqual(await endOf(stalled), { clean: false })
    assert.ok(stalled.count < 600)
    assert.equal(service.deps.eventHub.size, 0)
  },
)

test('refuses a bad Last-Event-ID, a bad type filter and unknown parameters with 400, streaming nothing', async () => {
  const badIds = [
    '-1',
    'abc',
    '1.5',
    '1e3',
    '0x10',
    '9223372036854775808',
    '99999999999999999999',
    '1'.repeat(1000),
    '5, 6',
    '',
  ]
  for (const id of badIds) {
    const res = await a.request('GET', '/events/stream', { headers: { 'last-event-id': id } })
    assert.equal(res.status, 400, `Last-Event-ID ${JSON.stringify(id.slice(0, 30))}`)
    assert.equal(res.body.code, 'invalid_request')
    assert.match(res.headers.get('content-type')!, /^application\/problem\+json/)
    assert.doesNotMatch(res.text, /^id:|retry:/m)
  }
  const ok = await open(a, '/events/stream', { 'last-event-id': '9223372036854775807' })
  assert.equal(ok.status, 200)
  ok.close()
  const badQueries = [
    'last_event_id=-1',
    'last_event_id=abc',
    'last_event_id=9223372036854775808',
    'last_event_id=',
    'last_event_id=%00',
    'type=Product.Created',
    'type=product.created,',
    'type=',
    'type=product',
    'type=a.b%0A',
    `type=${Array.from({ length: 21 }, (_, i) => `t.x${'y'.repeat(i)}`).join(',')}`,
    'type=product.created&type=product.deleted',
    'limit=5',
    'cursor=x',
  ]
  for (const q of badQueries) {
    const res = await a.request('GET', `/events/stream?${q}`)
    assert.equal(res.status, 400, q)
    assert.ok(['invalid_parameter', 'unknown_parameter'].includes(res.body.code), `${q}: ${res.body.code}`)
    assert.doesNotMatch(res.text, /^id:|retry:/m)
    assert.equal(res.body.stack, undefined)
  }
  // What fetch will not send: a NUL in the header (Node's parser
  // refuses it) and a megabyte of it (over the header limit).
  const head = (value: string) =>
    `GET /events/stream HTTP/1.1\r\nHost: x\r\nAuthorization: ` +
    `Bearer ${a.admin.token}\r\nLast-Event-ID: ${value}\r\n\r\n`
  const nul = await rawRequest(a.url, head('12\u000034'))
  assert.match(nul.statusLine, /^HTTP\/1\.1 400 /)
  assert.doesNotMatch(nul.text, /text\/event-stream/)
  const huge = await rawRequest(a.url, head('1'.repeat(1024 * 1024)))
  assert.match(huge.statusLine, /^HTTP\/1\.1 431 /)
  assert.doesNotMatch(huge.text, /text\/event-stream/)
})

test('no credential is 401, a user is 403', async () => {
  const anonymous = await a.request('GET', '/events/stream', { auth: null })
  assert.equal(anonymous.status, 401)
  assert.match(anonymous.headers.get('content-type')!, /^application\/problem\+json/)
  const user = await a.createUser()
  const forbidden = await a.request('GET', '/events/stream', { auth: user.token })
  assert.equal(forbidden.status, 403)
  assert.doesNotMatch(forbidden.text, /^id:/m)
})

test('/openapi.json describes the stream as text/event-stream', async () => {
  const doc = (await a.request('GET', '/openapi.json')).body
  const op = doc.paths['/events/stream'].get
  assert.ok(op.responses['200'].content['text/event-stream'])
  assert.ok(op.responses['503'])
  assert.deepEqual(op.parameters.map((p: { name: string }) => p.name).sort(), ['last_event_id', 'type'])
})
