import assert from 'node:assert/strict'
import { request as httpRequest } from 'node:http'
import { describe, test } from 'node:test'
import { setImmediate as nextTurn, setTimeout as sleep } from 'node:timers/promises'
import { signJwt, type JwtClaims } from '../src/auth/jwt.js'
import { applicationRegistry } from './helpers/registry.js'
import { loadConfig, type Config } from '../src/config.js'
import { resolvePooler } from '../src/core/db/pooler.js'
import { Lifecycle, type Component } from '../src/core/lifecycle.js'
import { createLogger } from '../src/core/log.js'
import { Scheduler } from '../src/core/scheduler.js'
import { createService, type Service } from '../src/service.js'
import { activeResources, openLedger, type HandleLedger } from './helpers/handles.js'
import { connect } from '../src/core/db/connect.js'
import { createTestDatabase, TEST_JWT_SECRET } from './helpers/server.js'
import { SseClient } from './helpers/sse.js'
import { DatabaseAdmission } from '../src/core/db/admission.js'

// One lifecycle (src/core/lifecycle.ts) and one scheduler
// (src/core/scheduler.ts): a service opens nothing until it listens, and
// whichever way it stops (close(), or the drain of a SIGTERM) it leaves no
// timer, socket or watcher of its own behind; components stop in the
// reverse of the order they started; a job never runs beside itself, and
// a stop waits for the run under way, up to its deadline.

const databaseUrl = await createTestDatabase()
const loaded: Config = {
  ...loadConfig({
    PORT: '0',
    HOST: '127.0.0.1',
    LOG_LEVEL: 'debug',
    JWT_SECRETS: `test:${TEST_JWT_SECRET}`,
    RATE_LIMIT: '0',
  }),
  databaseUrl,
}
const config: Config = { ...loaded, databasePooler: await resolvePooler({ ...loaded, databaseUrl }) }

function newService(
  tuning: { publisher?: { intervalMs: number } } = {},
  overrides: Partial<Config> = {},
): { service: Service; logs: Array<Record<string, unknown>> } {
  const logs: Array<Record<string, unknown>> = []
  const service = createService(
    { ...config, ...overrides },
    { log: createLogger('debug', (line) => void logs.push(JSON.parse(line))), ...tuning },
  )
  return { service, logs }
}

/** One request on a connection of its own (no agent: nothing of the client stays open after the answer). */
function call(
  port: number,
  method: string,
  path: string,
  headers: Record<string, string> = {},
  body?: unknown,
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const text = body === undefined ? undefined : JSON.stringify(body)
    const req = httpRequest(
      {
        host: '127.0.0.1',
        port,
        method,
        path,
        agent: false,
        headers: { ...headers, ...(text ? { 'content-type': 'application/json' } : {}) },
      },
      (res) => {
        let received = ''
        res.setEncoding('utf8')
        res.on('data', (chunk: string) => (received += chunk))
        res.on('end', () => resolve({ status: res.statusCode!, body: received }))
      },
    )
    req.once('error', reject)
    req.end(text)
  })
}

/**
 * Serves requests (a read, an idempotent create), a stream that receives the create's event, and the scheduler's runs.
 */
async function exercise(service: Service): Promise<SseClient> {
  return (await exerciseWith(service)).stream
}

async function exerciseWith(
  service: Service,
): Promise<{ stream: SseClient; port: number; auth: Record<string, string> }> {
  const { port } = await service.listen(0, '127.0.0.1')
  const [admin] = await service.deps.sql<Array<{ id: number }>>`
    INSERT INTO users (name, email, role) VALUES
    ('Lifecycle', ${`lifecycle-${process.hrtime.bigint()}@example.com`}, 'admin') RETURNING id`
  const now = Math.floor(Date.now() / 1000)
  const token = signJwt(
    {
      sub: String(admin!.id),
      iss: config.jwtIssuer,
      aud: config.jwtAudience,
      iat: now,
      exp: now + 900,
      role: 'admin',
      scope: [...applicationRegistry.scopes.byRole.admin].join(' '),
      sid: String(2 ** 53),
      gen: 0,
    } as JwtClaims,
    config.jwtSecrets[0]!,
  )
  const auth = { authorization: `Bearer ${token}` }
  assert.equal((await call(port, 'GET', '/healthz')).status, 200)
  assert.equal((await call(port, 'GET', '/users?limit=1', auth)).status, 200)
  const stream = await SseClient.open(`http://127.0.0.1:${port}`, '/events/stream?type=product.created', {
    headers: auth,
  })
  await stream.waitFor(() => stream.retry !== undefined, 20_000, 'retry:')
  const created = await call(
    port,
    'POST',
    '/products',
    { ...auth, 'idempotency-key': `lifecycle-${process.hrtime.bigint()}` },
    { sku: `LC-${process.hrtime.bigint()}`, name: 'x', price: 1, currency: 'EUR' },
  )
  assert.equal(created.status, 201, created.body)
  // Published by the job events.publish and read by events.read: both ran on their timers.
  await stream.waitForEvents(1, 20_000)
  return { stream, port, auth }
}

/**
 * Waits (generously) for the handles created under the ledger to be closed:
 * after the service stopped, only the test's client sockets may still be
 * taking in their connection's end.
 */
async function assertNothingLeft(ledger: HandleLedger, before: Record<string, number>): Promise<void> {
  // Turns of the event loop, not a timer, which would be one more handle to wait for.
  for (const giveUpAt = performance.now() + 5000; ledger.open().length > 0 && performance.now() < giveUpAt;)
    await nextTurn()
  ledger.off()
  assert.deepEqual(ledger.open(), [], 'every timer, socket and watcher opened since createService is closed')
  const after = activeResources()
  for (const [kind, n] of Object.entries(after))
    assert.ok(
      n <= (before[kind] ?? 0),
      `${kind}: ${before[kind] ?? 0} before createService, ${n} after: ${JSON.stringify({ before, after })}`,
    )
}

describe('a service leaves nothing open once stopped', () => {
  test('after close(), having served requests and a stream and run its jobs', async () => {
    const before = activeResources()
    const ledger = openLedger()
    const { service } = newService()
    const stream = await exercise(service)
    await service.close()
    assert.deepEqual(await stream.ended, { clean: false }, 'close() cuts the stream')
    await assertNothingLeft(ledger, before)
  })

  test('after the drain of a SIGTERM (shutdown()), the same', async () => {
    const before = activeResources()
    const ledger = openLedger()
    const { service, logs } = newService()
    const stream = await exercise(service)
    await service.shutdown()
    assert.deepEqual(await stream.ended, { clean: true }, 'the drain ends the stream cleanly')
    assert.ok(logs.some((l) => l.msg === 'stopped'))
    await assertNothingLeft(ledger, before)
  })

  test(
    'after a database outage (new sessions refused, every session ended, then allowed again), close() still ends ' +
      'every connection',
    async () => {
      // From the server's maintenance database: PostgreSQL refuses
      // ALLOW_CONNECTIONS for the database one is connected to.
      const server = connect(process.env.TEST_SERVER_URL!, { max: 1, statementTimeoutMs: 10_000 })
      const database = new URL(databaseUrl).pathname.slice(1)
      await server`SELECT 1`
      const before = activeResources()
      const ledger = openLedger()
      const { service } = newService()
      const { stream, port, auth } = await exerciseWith(service)
      try {
        await server`ALTER DATABASE ${server(database)} ALLOW_CONNECTIONS false`
        await server`SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE datname = ${database}
          AND pid <> pg_backend_pid()`
        const answers = await Promise.all(Array.from({ length: 5 }, () => call(port, 'GET', '/users?limit=1', auth)))
        assert.deepEqual(
          answers.map((a) => a.status),
          [503, 503, 503, 503, 503],
        )
      } finally {
        await server`ALTER DATABASE ${server(database)} ALLOW_CONNECTIONS true`
      }
      // At once: the pool and the listeners are opening connections again, and close() must end those too.
      await service.close()
      await stream.ended
      await server.end({ timeout: 5 })
      await assertNothingLeft(ledger, before)
    },
  )

  test('a service created and never listened opens nothing; close() ends what its pool opened when used', async () => {
    const before = activeResources()
    const ledger = openLedger()
    const { service } = newService()
    await sleep(200)
    // The sleep's own timer is reported closed a turn or two after it fired.
    for (let turn = 0; turn < 10; turn++) await nextTurn()
    assert.deepEqual(ledger.open(), [], 'created, it holds no timer and no socket')
    // As the entry point does before listening (the first admin), the pool is used.
    await service.deps.sql`SELECT 1`
    await service.close()
    await assertNothingLeft(ledger, before)
  })
})

describe('connections', () => {
  test(
    'serving, streaming and running its jobs, an instance holds at most DATABASE_POOL_MAX + 9 connections (the ' +
      'count of docs/scaling.md)',
    async () => {
      const server = connect(process.env.TEST_SERVER_URL!, { max: 1, statementTimeoutMs: 10_000 })
      const database = new URL(databaseUrl).pathname.slice(1)
      const { service } = newService({}, { poolMax: 2 })
      try {
        const stream = await exercise(service)
        // Every job has run at least once by now (their first runs are at start), and the webhook worker claimed.
        const held = await server<Array<{ backend_type: string; query: string }>>`
        SELECT backend_type, left(query, 60) AS query FROM pg_stat_activity WHERE datname = ${database}
          AND pid <> pg_backend_pid()`
        assert.ok(held.length <= 2 + 9, `${held.length} connections: ${JSON.stringify(held)}`)
        assert.ok(held.length >= 1 + 8, `the count is of connections the instance opened: ${JSON.stringify(held)}`)
        await service.close()
        await stream.ended
      } finally {
        await service.close()
        await server.end({ timeout: 5 })
      }
    },
  )
})

describe('order', () => {
  test('a service stops its components in the reverse of the order they started, the pool last', async () => {
    const { service, logs } = newService()
    await service.listen(0, '127.0.0.1')
    await service.close()
    const names = (msg: string) => logs.filter((l) => l.msg === msg).map((l) => l.component)
    assert.deepEqual(names('component started'), service.lifecycle.names)
    assert.deepEqual(names('component stopped'), [...service.lifecycle.names].reverse())
    assert.deepEqual(service.lifecycle.names.slice(0, 2), ['database', 'database-admission'])
    // The streams end before the server drains, the server before the jobs stop.
    assert.deepEqual(service.lifecycle.names.slice(-3), ['scheduler', 'http-server', 'event-streams'])
  })

  test('database admission sweeps only while requests are admitted, and never once stopped', async () => {
    const admission = new DatabaseAdmission({ floor: 1, targetMs: 100, deadlineMs: 1000 })
    const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length
    const before = timers()
    let finish = () => {}
    let started = () => {}
    const working = new Promise<void>((resolve) => (started = resolve))
    const admitted = admission.run(() => new Promise<void>((resolve) => ((finish = resolve), started())))
    await working
    assert.equal(timers(), before + 1, 'the sweep runs while a request is admitted')
    admission.stop()
    assert.equal(timers(), before, 'stop ends the sweep')
    finish()
    await admitted
    await admission.run(async () => assert.equal(timers(), before, 'no sweep starts after stop'))
  })

  test('a start that fails stops every component, in reverse, and fails', async () => {
    const seen: string[] = []
    const lifecycle = new Lifecycle(createLogger('error', () => {}))
    const component = (name: string, failStart = false): Component => ({
      name,
      start: async () => {
        seen.push(`start ${name}`)
        if (failStart) throw new Error(`${name} cannot start`)
      },
      stop: async () => void seen.push(`stop ${name}`),
    })
    lifecycle.register(component('a'))
    lifecycle.register(component('b'))
    lifecycle.register(component('c', true))
    lifecycle.register(component('d'))
    await assert.rejects(lifecycle.start(), /c cannot start/)
    assert.deepEqual(seen, ['start a', 'start b', 'start c', 'stop d', 'stop c', 'stop b', 'stop a'])
  })

  test('a stop that overruns its deadline is left behind with a warning; the others still stop', async () => {
    const lines: Array<Record<string, unknown>> = []
    const lifecycle = new Lifecycle(createLogger('warn', (line) => void lines.push(JSON.parse(line))))
    let firstStopped = false
    lifecycle.register({ name: 'first', start() {}, stop: () => void (firstStopped = true) })
    lifecycle.register({ name: 'stuck', start() {}, stop: () => new Promise<void>(() => {}) })
    await lifecycle.start()
    await lifecycle.stop(performance.now() + 50)
    assert.ok(firstStopped)
    assert.deepEqual(
      lines.map((l) => [l.msg, l.component]),
      [['a component did not stop by its deadline; the others stop without it', 'stuck']],
    )
  })
})

describe('the scheduler', () => {
  test('a job never runs beside itself, whether its timer, a caller or the job itself asks', async () => {
    const scheduler = new Scheduler(createLogger('error', () => {}))
    let running = 0
    let most = 0
    let runs = 0
    const job = scheduler.add({
      name: 'busy',
      periodMs: 1,
      firstRunMs: 0,
      run: async () => {
        running++
        most = Math.max(most, running)
        runs++
        await sleep(5)
        if (runs % 3 === 0) job.trigger()
        running--
      },
    })
    scheduler.start()
    const asked: Array<Promise<void>> = []
    while (runs < 30) {
      asked.push(job.runNow(), job.runAnew())
      job.trigger()
      await sleep(2)
    }
    await scheduler.stop(performance.now() + 10_000)
    await Promise.allSettled(asked)
    assert.equal(most, 1, 'at most one run at a time')
    assert.equal(running, 0, 'stop returned once the run under way had ended')
  })

  test('stop waits for a slow run within its deadline, and not past it', async () => {
    const scheduler = new Scheduler(createLogger('error', () => {}))
    let slowDone = false
    const slow = scheduler.add({
      name: 'slow',
      periodMs: 60_000,
      run: async () => {
        await sleep(300)
        slowDone = true
      },
    })
    scheduler.start()
    void slow.runNow()
    await scheduler.stop(performance.now() + 30_000)
    assert.ok(slowDone, 'the slow run ended before stop returned')

    const other = new Scheduler(createLogger('error', () => {}))
    const stuck = other.add({ name: 'stuck', periodMs: 60_000, run: () => new Promise<void>(() => {}) })
    void stuck.runNow()
    const started = performance.now()
    await other.stop(performance.now() + 100)
    assert.ok(performance.now() - started < 5000, 'a run that never ends is not waited for past the deadline')
  })

  test('a run sees its signal abort when the scheduler stops, and can end between two batches', async () => {
    const scheduler = new Scheduler(createLogger('error', () => {}))
    let batches = 0
    const job = scheduler.add({
      name: 'batches',
      periodMs: 60_000,
      run: async (signal) => {
        while (!signal.aborted && batches < 1000) {
          batches++
          await sleep(5)
        }
      },
    })
    void job.runNow()
    await sleep(30)
    await scheduler.stop(performance.now() + 30_000)
    assert.ok(batches > 0 && batches < 1000, `${batches} batches`)
  })
})
