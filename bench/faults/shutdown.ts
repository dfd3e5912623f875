import { Agent, request as httpRequest } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Sql } from 'postgres'
import { connect } from '../../src/core/db/connect.js'
import {
  adminToken,
  call,
  holdRowLock,
  RawClient,
  startLoad,
  waitFor,
  type Outcome,
  type OwnCluster,
  type Spawned,
} from '../../test/fault-kit.js'
import { ms, perSecond } from './format.js'
import type { FaultSection } from './section.js'
import { quietService, withOwnDatabase } from './service.js'

// SIGTERM to the real process, as in test/fault-shutdown.test.ts, which
// asserts what each client gets (in-flight requests 200, new ones 503
// shutting_down or a refused connection, nothing cut) and that the process
// exits 0 within SHUTDOWN_TIMEOUT, or at it when a request never finishes.
// This is how long the exit takes in each case, beside an idle service's,
// and what keep-alive clients get per second
// before the signal and during the drain.

const KEEP_ALIVE_CLIENTS = 6

type Env = Record<string, string>

type Answer = Pick<Outcome, 'started' | 'ended' | 'status' | 'error'>

/** One GET on a keep-alive agent: its status, or the error's code. */
function keepAliveGet(port: number, agent: Agent, path: string): Promise<Answer> {
  const started = performance.now()
  return new Promise((resolve) => {
    const failed = (err: NodeJS.ErrnoException) =>
      resolve({ started, ended: performance.now(), error: err.code ?? err.message })
    const req = httpRequest({ host: '127.0.0.1', port, path, agent }, (res) => {
      res.resume()
      res.on('end', () => resolve({ started, ended: performance.now(), status: res.statusCode }))
      res.on('error', failed)
    })
    req.on('error', failed)
    req.end()
  })
}

/** SIGTERM now: how long until the process exited (ms), and its code. */
async function terminate(service: Spawned): Promise<{ ms: number; code: number | null }> {
  const at = performance.now()
  service.kill('SIGTERM')
  const exit = await service.exited
  return { ms: exit.at - at, code: exit.code }
}

/** A user of its own, locked FOR UPDATE by `db` while `work` runs with a PATCH of it waiting in `service`. */
async function withRequestOnLock<T>(db: Sql, service: Spawned, token: string, work: () => Promise<T>): Promise<T> {
  const [{ id }] = await db<[{ id: number }]>`
    INSERT INTO users (name, email) VALUES ('Held', ${`held.${Date.now()}.${Math.random()}@example.com`}) RETURNING id`
  const lock = await holdRowLock(db, 'users', id)
  try {
    const pending = call(service.url, 'PATCH', `/users/${id}`, { token, body: { name: 'never' }, timeoutMs: 20_000 })
    const waiting = async () => {
      const [{ n }] = await db<[{ n: number }]>`
        SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock'`
      return n === 1
    }
    await waitFor('the request to wait on the lock', waiting, 10_000)
    const result = await work()
    await pending
    return result
  } finally {
    lock.release()
    await lock.done.catch(() => {})
  }
}

export async function measure(): Promise<FaultSection> {
  return withOwnDatabase(async ({ cluster, url, adminId }) => {
    const token = adminToken(adminId)
    const db = connect(url, { max: 4, statementTimeoutMs: 60_000 })
    const env = (timeoutS: number): Env => ({
      DATABASE_URL: url,
      SHUTDOWN_TIMEOUT: String(timeoutS),
      STATEMENT_TIMEOUT: '30',
    })
    try {
      const idle = await terminate(await quietService(env(5)))
      const stuck = await quietService(env(2))
      const cut = await withRequestOnLock(db, stuck, token, () => terminate(stuck))
      return {
        title: 'SIGTERM: the exit, and what keep-alive clients get during the drain',
        columns: [
          'case',
          'SHUTDOWN_TIMEOUT s',
          'exit after SIGTERM ms',
          'exit code',
          'keep-alive answers per second before / draining',
          'meanwhile',
        ],
        rows: [
          ['idle (the baseline)', '5', ms(idle.ms), String(idle.code), '', ''],
          await drain(env(5), token, db),
          ['a request still running at SHUTDOWN_TIMEOUT', '2', ms(cut.ms), String(cut.code), '', 'cut at the deadline'],
          await databaseDown(cluster, env(3), token, adminId),
          await databaseFrozen(cluster, env(3), token, db),
        ],
        note:
          `The real process. The drain: ${KEEP_ALIVE_CLIENTS} keep-alive clients asking for /healthz without pause ` +
          'and 3 requests held 1 s on a row lock, SIGTERM a second into the load; the answers per second count ' +
          '200s before the signal and every answer (200, 503 shutting_down) after. test/fault-shutdown.test.ts ' +
          "once held the idle connection's close to 500 ms after the signal, an exit with the database down to " +
          '1 s, and an exit at SHUTDOWN_TIMEOUT to 1 s past it; it now holds the last to five times the idle exit.',
      }
    } finally {
      await db.end({ timeout: 1 })
    }
  })
}

/** Keep-alive clients and three requests in flight (held 1 s on a row lock), SIGTERM a second into the load. */
async function drain(env: Env, token: string, db: Sql): Promise<string[]> {
  const service = await quietService(env)
  const [{ id }] = await db<[{ id: number }]>`
    INSERT INTO users (name, email) VALUES ('Drained', 'drained@example.com') RETURNING id`
  const lock = await holdRowLock(db, 'users', id)
  const agents = Array.from({ length: KEEP_ALIVE_CLIENTS }, () => new Agent({ keepAlive: true, maxSockets: 1 }))
  try {
    const patch = (i: number) =>
      call(service.url, 'PATCH', `/users/${id}`, { token, body: { name: `drained ${i}` }, timeoutMs: 20_000 })
    const inFlight = [0, 1, 2].map(patch)
    const idle = await new RawClient(service.port).open()
    idle.write('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n')
    await waitFor('the idle connection answered', () => idle.responses().length === 1, 5000)
    const load = startLoad(KEEP_ALIVE_CLIENTS, async (client) => {
      const o = await keepAliveGet(service.port, agents[client]!, '/healthz')
      if (o.error) await sleep(20)
      return { client, seq: 0, what: 'GET /healthz', ...o }
    })
    await sleep(1000)
    const termAt = performance.now()
    service.kill('SIGTERM')
    await sleep(1000)
    lock.release()
    await lock.done
    const exit = await service.exited
    await Promise.all(inFlight)
    const outcomes = await load.stop()
    const before = outcomes.filter((o) => o.ended >= termAt - 1000 && o.ended < termAt && o.status === 200)
    const draining = outcomes.filter((o) => o.ended >= termAt && o.ended <= exit.at && o.status !== undefined)
    return [
      'draining 3 requests held 1 s',
      '5',
      ms(exit.at - termAt),
      String(exit.code),
      `${perSecond(before.length, 1000)} / ${perSecond(draining.length, exit.at - termAt)}`,
      `idle connection closed ${ms(idle.closedAt - termAt)} ms after SIGTERM`,
    ]
  } finally {
    lock.release()
    for (const agent of agents) agent.destroy()
    if (service.alive()) service.kill('SIGKILL')
  }
}

/** The cluster crashed under load, then SIGTERM. */
async function databaseDown(cluster: OwnCluster, env: Env, token: string, adminId: number): Promise<string[]> {
  const service = await quietService(env)
  const read = (client: number, seq: number) =>
    call(service.url, 'GET', `/users/${adminId}`, { token, client, seq, timeoutMs: 10_000 })
  const load = startLoad(4, read)
  try {
    await sleep(500)
    await cluster.stop('immediate')
    await waitFor('a 503', () => load.outcomes.some((o) => o.code === 'database_unavailable'), 5000)
    const exit = await terminate(service)
    return ['the database down', '3', ms(exit.ms), String(exit.code), '', "the pool's connections dead"]
  } finally {
    await load.stop()
    if (service.alive()) service.kill('SIGKILL')
    await cluster.start()
  }
}

/** A request in flight (held on a row lock) when every process of the cluster is stopped (SIGSTOP), then SIGTERM. */
async function databaseFrozen(cluster: OwnCluster, env: Env, token: string, db: Sql): Promise<string[]> {
  const service = await quietService(env)
  try {
    const exit = await withRequestOnLock(db, service, token, async () => {
      const pids = await cluster.pids()
      for (const pid of pids) process.kill(pid, 'SIGSTOP')
      try {
        return await terminate(service)
      } finally {
        for (const pid of pids) process.kill(pid, 'SIGCONT')
      }
    })
    return ['the database frozen, a request in flight', '3', ms(exit.ms), String(exit.code), '', 'cut at the deadline']
  } finally {
    if (service.alive()) service.kill('SIGKILL')
  }
}
