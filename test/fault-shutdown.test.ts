import assert from 'node:assert/strict'
import { Agent, request as httpRequest } from 'node:http'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Sql } from 'postgres'
import { connect } from '../src/core/db/connect.js'
import {
  adminToken,
  call,
  connectionRefused,
  everyClient,
  holdRowLock,
  OwnCluster,
  RawClient,
  spawnService,
  startLoad,
  waitFor,
  type Outcome,
  type Spawned,
} from './fault-kit.js'
import { boundFrom } from './helpers/time-bounds.js'

// SIGTERM to the real process (`node dist/main.js`), with
// requests in flight (held on a row lock this test owns), keep-alive clients
// sending continuously, connections idle and connections half-way through a
// request. The contract: /readyz turns 503, new connections are refused,
// requests in flight finish with 2xx, new requests on open connections get
// 503 shutting_down, every answer carries `Connection: close`, no answer is
// cut half-way, the pool closes and the process exits 0 within
// SHUTDOWN_TIMEOUT, also when the database is down or frozen. How many
// answers clients get per second before and during the drain, and how long
// the exit takes, are figures of `make bench-faults`
// (bench/faults/shutdown.ts).

let cluster: OwnCluster
let url: string
let db: Sql
let token: string
/** How long a service with nothing to finish takes from SIGTERM to its exit, on this machine now. */
let idleExitMs: number

/** How long after `termAt` the service exited, and how. */
async function exitAfter(service: Spawned, termAt: number) {
  const exit = await service.exited
  return { code: exit.code, ms: exit.at - termAt }
}

before(async () => {
  cluster = await OwnCluster.create()
  const created = await cluster.createDatabase()
  url = created.url
  token = adminToken(created.adminId)
  db = connect(url, { max: 4, statementTimeoutMs: 60_000 })
  const idle = await spawnService({ DATABASE_URL: url })
  const termAt = performance.now()
  idle.kill('SIGTERM')
  const exit = await exitAfter(idle, termAt)
  assert.equal(exit.code, 0)
  idleExitMs = exit.ms
})
after(async () => {
  await db?.end({ timeout: 1 })
  await cluster?.destroy()
})

const ms = (x: number) => `${Math.round(x)} ms`

async function newUser(tag: string): Promise<number> {
  const [row] = await db<[{ id: number }]>`INSERT INTO users (name, email) VALUES
    (${tag}, ${`${tag}.${Date.now()}.${Math.random()}@example.com`}) RETURNING id`
  return row.id
}

const waitingOnLocks = async () =>
  (
    await db<
      [{ n: number }]
    >`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`
  )[0].n

const head = (method: string, path: string, extra = '') =>
  `${method} ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${token}\r\n${extra}`
const patchRequest = (id: number, name: string, id2: string) => {
  const body = JSON.stringify({ name })
  return (
    `${head('PATCH', `/users/${id}`)}X-Request-Id: ${id2}\r\nContent-Type: ` +
    `application/merge-patch+json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
  )
}

interface KeepAliveOutcome extends Outcome {
  requestId: string
  connection?: string
  /** The response had started (headers received) when the error came: a cut answer. */
  cutMidResponse?: boolean
}

/** One request on a keep-alive agent, with what a client sees of the connection. */
function keepAliveCall(
  port: number,
  agent: Agent,
  path: string,
  requestId: string,
  client: number,
  seq: number,
): Promise<KeepAliveOutcome> {
  const started = performance.now()
  return new Promise((resolve) => {
    let responded = false
    const req = httpRequest(
      {
        host: '127.0.0.1',
        port,
        path,
        agent,
        headers: { authorization: `Bearer ${token}`, 'x-request-id': requestId },
      },
      (res) => {
        responded = true
        let text = ''
        res.setEncoding('utf8')
        res.on('data', (d: string) => void (text += d))
        res.on('end', () => {
          const body = text && /json/.test(res.headers['content-type'] ?? '') ? JSON.parse(text) : undefined
          resolve({
            client,
            seq,
            requestId,
            what: path,
            started,
            ended: performance.now(),
            status: res.statusCode,
            code: body?.code,
            retryAfter: (res.headers['retry-after'] as string) ?? null,
            connection: res.headers.connection,
          })
        })
        res.on('error', (err) =>
          resolve({
            client,
            seq,
            requestId,
            what: path,
            started,
            ended: performance.now(),
            error: String(err),
            cutMidResponse: true,
          }),
        )
      },
    )
    req.on('error', (err: NodeJS.ErrnoException) =>
      resolve({
        client,
        seq,
        requestId,
        what: path,
        started,
        ended: performance.now(),
        error: err.code ?? err.message,
        cutMidResponse: responded,
      }),
    )
    req.setTimeout(15_000, () => req.destroy(new Error('client time-out')))
    req.end()
  })
}

test(
  'SIGTERM with requests in flight and keep-alive clients: in-flight requests finish 200, new ones get 503 ' +
    'shutting_down or a refused connection, every answer says Connection: close, none is cut, exit 0 within ' +
    'SHUTDOWN_TIMEOUT',
  async () => {
    const SHUTDOWN_TIMEOUT = 5
    const service = await spawnService({
      DATABASE_URL: url,
      LOG_LEVEL: 'info',
      SHUTDOWN_TIMEOUT: String(SHUTDOWN_TIMEOUT),
      STATEMENT_TIMEOUT: '30',
    })
    const port = service.port
    const held = await newUser('held')
    const other = await newUser('other')
    const lock = await holdRowLock(db, 'users', held)
    try {
      // Three requests in flight, each on its own connection, waiting on the row lock.
      const inFlight = await Promise.all(
        [0, 1, 2].map(async (i) => {
          const c = await new RawClient(port).open()
          c.write(patchRequest(held, `drained ${i}`, `in-flight-${i}`))
          return c
        }),
      )
      await waitFor('three requests waiting on the lock', async () => (await waitingOnLocks()) === 3, 10_000)
      // Two connections half-way through a request (headers not finished): not idle.
      const halfReady = await new RawClient(port).open()
      halfReady.write('GET /readyz HTTP/1.1\r\nHost: x\r\nX-Request-Id: half-readyz\r\n')
      const halfUser = await new RawClient(port).open()
      halfUser.write(`${head('GET', `/users/${other}`)}X-Request-Id: half-user\r\n`)
      // An idle keep-alive connection (one request answered).
      const idle = await new RawClient(port).open()
      idle.write(`${head('GET', '/healthz')}\r\n`)
      await waitFor('the idle connection to get its answer', () => idle.responses().length === 1, 5000)
      // Continuous keep-alive clients.
      const agents = Array.from({ length: 6 }, () => new Agent({ keepAlive: true, maxSockets: 1 }))
      const load = startLoad(6, async (client, seq) => {
        const o = await keepAliveCall(port, agents[client]!, `/users/${other}`, `load-${client}-${seq}`, client, seq)
        if (o.error) await sleep(20) // a refused client retries, but not in a tight loop
        return o
      })
      let termAt = 0
      let releasedAt = 0
      try {
        await waitFor(
          'every keep-alive client served',
          () => everyClient(load.outcomes, (o) => o.status === 200),
          10_000,
        )
        termAt = performance.now()
        service.kill('SIGTERM')
        // New connections are refused once the signal is handled.
        await waitFor('new connections to be refused', () => connectionRefused(port), 10_000, 10)
        halfReady.write('\r\n')
        halfUser.write('\r\n')
        // The idle keep-alive connection is closed at once, while the requests in flight still wait; the
        // keep-alive clients meet the drain.
        const answered = () =>
          [idle, halfReady, halfUser].every((c) => c.closedAt > 0) &&
          everyClient(load.outcomes, (o) => o.ended > termAt)
        await waitFor('the drain to answer everyone but the requests in flight', answered, 10_000)
        releasedAt = performance.now()
        lock.release()
        await lock.done
      } finally {
        await load.stop()
      }
      const exit = await exitAfter(service, termAt)
      const outcomes = load.outcomes as KeepAliveOutcome[]

      assert.equal(exit.code, 0)
      assert.ok(exit.ms < SHUTDOWN_TIMEOUT * 1000, `exit ${ms(exit.ms)} after SIGTERM`)
      const closedAtOnce = idle.closedAt > termAt && idle.closedAt < releasedAt
      assert.ok(closedAtOnce, 'the idle connection was closed before the requests in flight finished')
      // Requests in flight finished with 200 and Connection: close, and their writes are stored.
      for (const [i, c] of inFlight.entries()) {
        await c.closed
        const [res, ...more] = c.responses()
        assert.equal(more.length, 0)
        assert.equal(res?.status, 200, c.received)
        assert.equal(res!.headers.connection, 'close')
        assert.equal(JSON.parse(res!.body).name, `drained ${i}`)
      }
      const [stored] = await db<[{ name: string; version: number }]>`SELECT name, version FROM users WHERE id = ${held}`
      assert.match(stored.name, /^drained [0-2]$/)
      assert.equal(stored.version, 4)
      // Requests that came on open connections after the signal: 503 shutting_down, Connection: close.
      for (const [c, path] of [
        [halfReady, '/readyz'],
        [halfUser, '/users/{id}'],
      ] as const) {
        const [res, ...more] = c.responses()
        assert.equal(more.length, 0)
        assert.equal(res?.status, 503, `${path}: ${c.received}`)
        assert.equal(JSON.parse(res!.body).code, 'shutting_down')
        assert.equal(res!.headers.connection, 'close')
        assert.ok(res!.headers['retry-after'])
      }
      // Keep-alive clients: never an answer cut half-way; answers after the
      // signal say Connection: close; a request that met a closed connection
      // before any byte of its answer was never processed (safe to retry).
      assert.deepEqual(
        outcomes.filter((o) => o.cutMidResponse).map((o) => `${o.requestId}: ${o.error}`),
        [],
      )
      const draining = (service.logs.find((l) => l.msg === 'shutting down') as { seenAt?: number } | undefined)?.seenAt
      assert.ok(draining, 'the service logged that it is shutting down')
      for (const o of outcomes.filter((o) => o.error === undefined)) {
        assert.ok(
          o.status === 200 || (o.status === 503 && o.code === 'shutting_down'),
          `${o.requestId}: ${o.status} ${o.code}`,
        )
        if (o.started > draining)
          assert.equal(o.connection, 'close', `${o.requestId}, sent once the service was draining`)
      }
      for (const o of outcomes.filter((o) => o.error !== undefined)) {
        assert.ok(o.ended > termAt, `${o.requestId} failed before SIGTERM: ${o.error}`)
        assert.ok(['ECONNREFUSED', 'ECONNRESET'].includes(o.error!), `${o.requestId}: ${o.error}`)
        assert.equal(
          service.logs.some((l) => l.request_id === o.requestId),
          false,
          `${o.requestId} was processed, yet its client got no answer`,
        )
      }
      assert.ok(service.logs.some((l) => l.msg === 'stopped'))
      assert.deepEqual(
        service.logs.filter((l) => l.level === 'error'),
        [],
      )
    } finally {
      lock.release()
      if (service.alive()) service.kill('SIGKILL')
    }
  },
)

test(
  'a request still running at SHUTDOWN_TIMEOUT is cut: the process exits 0 at SHUTDOWN_TIMEOUT, and its ' +
    'transaction does not commit',
  async () => {
    const SHUTDOWN_TIMEOUT = 2
    const service = await spawnService({
      DATABASE_URL: url,
      LOG_LEVEL: 'info',
      SHUTDOWN_TIMEOUT: String(SHUTDOWN_TIMEOUT),
      STATEMENT_TIMEOUT: '30',
    })
    const held = await newUser('held-forever')
    const lock = await holdRowLock(db, 'users', held)
    try {
      const stuck = await new RawClient(service.port).open()
      stuck.write(patchRequest(held, 'never stored', 'cut'))
      await waitFor('the request to wait on the lock', async () => (await waitingOnLocks()) === 1, 10_000)
      const termAt = performance.now()
      service.kill('SIGTERM')
      const exit = await exitAfter(service, termAt)
      await stuck.closed
      assert.equal(exit.code, 0)
      // At the deadline, not before; after it, no later than five times what an exit with nothing to cut takes.
      const bound = SHUTDOWN_TIMEOUT * 1000 + boundFrom(idleExitMs)
      const atDeadline = exit.ms >= SHUTDOWN_TIMEOUT * 1000 - 100 && exit.ms < bound
      assert.ok(atDeadline, `exit ${ms(exit.ms)} after SIGTERM (bound ${ms(bound)})`)
      assert.equal(stuck.received, '', 'the cut request got no answer at all (not a partial one)')
      assert.ok(service.logs.some((l) => l.msg === 'requests still running at SHUTDOWN_TIMEOUT were cut'))
      lock.release()
      await lock.done
      await waitFor('the cut transaction to end', async () => (await waitingOnLocks()) === 0, 5000)
      const [stored] = await db<[{ name: string; version: number }]>`SELECT name, version FROM users WHERE id = ${held}`
      assert.deepEqual({ ...stored }, { name: 'held-forever', version: 1 })
    } finally {
      lock.release()
      if (service.alive()) service.kill('SIGKILL')
    }
  },
)

test(
  'SIGTERM while the database is down: exit 0 without waiting for SHUTDOWN_TIMEOUT; while it is frozen with a ' +
    'request in flight: exit 0 at SHUTDOWN_TIMEOUT',
  async () => {
    const SHUTDOWN_TIMEOUT = 3
    const env = {
      DATABASE_URL: url,
      LOG_LEVEL: 'info',
      SHUTDOWN_TIMEOUT: String(SHUTDOWN_TIMEOUT),
      STATEMENT_TIMEOUT: '30',
    }
    const someone = await newUser('someone')

    // Down: the cluster crashed; the pool's connections are dead.
    const down = await spawnService(env)
    try {
      const load = startLoad(4, (client, seq) =>
        call(down.url, 'GET', `/users/${someone}`, {
          token,
          client,
          seq,
          timeoutMs: 10_000,
          headers: { 'x-request-id': `down-${client}-${seq}` },
        }),
      )
      await waitFor('every client served', () => everyClient(load.outcomes, (o) => o.status === 200), 10_000)
      await cluster.stop('immediate')
      await waitFor('a 503', () => load.outcomes.some((o) => o.code === 'database_unavailable'), 5000)
      const termAt = performance.now()
      down.kill('SIGTERM')
      const exit = await exitAfter(down, termAt)
      await load.stop()
      assert.equal(exit.code, 0)
      assert.ok(exit.ms < SHUTDOWN_TIMEOUT * 1000, `exit ${ms(exit.ms)} after SIGTERM: it waited for SHUTDOWN_TIMEOUT`)
      const unexpected = load.outcomes.filter(
        (o) =>
          !(
            o.status === 200 ||
            o.code === 'database_unavailable' ||
            o.code === 'shutting_down' ||
            o.error === 'TypeError: ECONNREFUSED'
          ),
      )
      // A keep-alive connection closed as the drain began, just as a request was sent on it: never processed, safe to
      // retry. The client sees a reset, or (undici's UND_ERR_SOCKET, "other side closed") the close itself, depending
      // on timing.
      const closedUnder = (o: { error?: string }) =>
        o.error === 'TypeError: ECONNRESET' || o.error === 'TypeError: UND_ERR_SOCKET'
      for (const o of unexpected.filter(closedUnder)) {
        assert.equal(
          down.logs.some((l) => l.request_id === `down-${o.client}-${o.seq}`),
          false,
          'a reset request was not processed',
        )
      }
      assert.deepEqual(
        unexpected.filter((o) => !closedUnder(o)).map((o) => o.error ?? o.status),
        [],
      )
    } finally {
      if (down.alive()) down.kill('SIGKILL')
      await cluster.start()
    }

    // Frozen: a request is in flight (waiting on a row lock) on a connection to a server that then never answers.
    const frozen = await spawnService(env)
    const lock = await holdRowLock(db, 'users', someone)
    let pids: number[] = []
    try {
      const body = { name: 'never stored' }
      const pending = call(frozen.url, 'PATCH', `/users/${someone}`, { token, body, timeoutMs: 20_000 })
      await waitFor('the request to wait on the lock', async () => (await waitingOnLocks()) === 1, 10_000)
      pids = await cluster.pids()
      for (const pid of pids) process.kill(pid, 'SIGSTOP')
      const termAt = performance.now()
      frozen.kill('SIGTERM')
      const exit = await exitAfter(frozen, termAt)
      const cut = await pending
      assert.equal(exit.code, 0)
      const bound = SHUTDOWN_TIMEOUT * 1000 + boundFrom(idleExitMs)
      const atDeadline = exit.ms >= SHUTDOWN_TIMEOUT * 1000 - 100 && exit.ms < bound
      assert.ok(atDeadline, `exit ${ms(exit.ms)} after SIGTERM (bound ${ms(bound)})`)
      assert.ok(
        cut.error !== undefined,
        `the request to the frozen database was cut at SHUTDOWN_TIMEOUT, not answered: ${JSON.stringify(cut)}`,
      )
    } finally {
      for (const pid of pids) process.kill(pid, 'SIGCONT')
      lock.release()
      await lock.done.catch(() => {})
      if (frozen.alive()) frozen.kill('SIGKILL')
    }
  },
)
