import { setTimeout as sleep } from 'node:timers/promises'
import { DEADLINE_GRACE_MS } from '../../src/core/db/admission.js'
import { connect } from '../../src/core/db/connect.js'
import {
  adminToken,
  call,
  holdRowLock,
  latencies,
  startLoad,
  waitFor,
  type Outcome,
  type OwnCluster,
} from '../../test/fault-kit.js'
import { ms } from './format.js'
import type { FaultSection } from './section.js'
import { quietService, withOwnDatabase } from './service.js'

// The database goes away under load, for real, as in
// test/helpers/db-outage.ts and test/fault-backend-kill.test.ts, which
// assert what every client gets (a success or a 503 with Retry-After, before
// the admission deadline) and that the same process serves again by itself.
// This is how soon: the first 503 after the fault, how long the 503s took,
// the first success once the database is back, and /healthz meanwhile beside
// /healthz before; with the bounds the tests once held these to.

const STATEMENT_TIMEOUT = 1
const DEADLINE_MS = STATEMENT_TIMEOUT * 1000 + DEADLINE_GRACE_MS
const CLIENTS = 8

const isUnavailable = (o: Outcome) => o.status === 503 && o.code === 'database_unavailable'
const ok = (o: Outcome) => o.status !== undefined && o.status < 300

/** A fault: how it begins, how long it lasts, how it ends, and the bounds the tests once held its figures to. */
interface Fault {
  what: string
  begin: () => Promise<unknown>
  lastsMs: number
  end: () => Promise<unknown>
  bounds: { unavailableMs: number; servedAgainMs: number }
}

export async function measure(): Promise<FaultSection> {
  return withOwnDatabase(async ({ cluster, url, adminId }) => {
    const service = await quietService({ DATABASE_URL: url, STATEMENT_TIMEOUT: String(STATEMENT_TIMEOUT) })
    try {
      const token = adminToken(adminId)
      let serial = 0
      const request = (client: number, seq: number) =>
        client % 2
          ? call(service.url, 'GET', `/users/${adminId}`, { token, client, seq, timeoutMs: 20_000 })
          : call(service.url, 'POST', '/users', {
              token,
              client,
              seq,
              timeoutMs: 20_000,
              body: { name: 'Outage', email: `outage.${++serial}@example.com` },
            })
      /** The load for a second, the fault, then once a request sent after its end succeeds, a second more. */
      const outage = async ({ what, begin, lastsMs, end, bounds }: Fault): Promise<string[]> => {
        const api = startLoad(CLIENTS, request)
        const health = startLoad(1, async (client, seq) => {
          const o = await call(service.url, 'GET', '/healthz', { client, seq, timeoutMs: 20_000 })
          await sleep(50)
          return o
        })
        let downAt = 0
        let upAt = 0
        try {
          await sleep(1000)
          await begin()
          downAt = performance.now()
          await sleep(lastsMs)
          await end()
          upAt = performance.now()
          const servedAgain = () => api.outcomes.some((o) => o.started >= upAt && ok(o))
          await waitFor('a success after the fault', servedAgain, 20_000, 10)
          await sleep(1000)
        } finally {
          await Promise.all([api.stop(), health.stop()])
        }
        const unavailable = api.outcomes.filter((o) => o.ended >= downAt && o.ended <= upAt && isUnavailable(o))
        const l = latencies(unavailable)
        const firstUnavailable = Math.min(...unavailable.map((o) => o.ended)) - downAt
        const successes = api.outcomes.filter((o) => o.started >= upAt && ok(o))
        const firstSuccess = Math.min(...successes.map((o) => o.ended)) - upAt
        const healthBefore = latencies(health.outcomes.filter((o) => o.ended < downAt)).max
        const healthDuring = latencies(health.outcomes.filter((o) => o.started >= downAt && o.ended <= upAt)).max
        return [
          what,
          String(l.count),
          ms(firstUnavailable),
          ms(l.p50),
          ms(l.p99),
          ms(l.max),
          ms(firstSuccess),
          `${ms(healthBefore)} / ${ms(healthDuring)}`,
          String(bounds.unavailableMs),
          String(bounds.servedAgainMs),
        ]
      }
      const stopped = (mode: 'fast' | 'immediate'): Fault => ({
        what: `stopped (${mode})`,
        begin: () => cluster.stop(mode),
        lastsMs: 3000,
        end: () => cluster.start(),
        bounds: { unavailableMs: 1000, servedAgainMs: 1500 },
      })
      const rows = [
        await killed(service.url, token, url),
        await outage(stopped('fast')),
        await outage(stopped('immediate')),
        await outage(frozen(cluster)),
      ]
      return {
        title: 'The database stopped, frozen, or a backend killed, under load',
        columns: [
          'fault',
          "503's",
          'first 503 after ms',
          '503 p50 ms',
          '503 p99 ms',
          '503 max ms',
          'first success after ms',
          '/healthz max before / during ms',
          'bound on a 503 ms',
          'bound on the first success ms',
        ],
        rows,
        note:
          `The real process, STATEMENT_TIMEOUT ${STATEMENT_TIMEOUT} s (a request's deadline ` +
          `${DEADLINE_MS / 1000} s), ` +
          `${CLIENTS} clients reading and creating users. Stopped: 3 s, then started. Frozen (SIGSTOP of ` +
          'every PostgreSQL process): the deadline and a second, then thawed. Killed: pg_terminate_backend of a ' +
          'request waiting on a row lock, three times; its 503 after the kill. The bounds are those the tests once ' +
          'held these figures to; the tests now hold a 503 to the deadline plus five times the longest answer ' +
          'before the fault.',
      }
    } finally {
      service.kill('SIGKILL')
      await service.exited
    }
  })
}

/** Every process of the cluster stopped (SIGSTOP) for the deadline and a second: connections taken, none answered. */
function frozen(cluster: OwnCluster): Fault {
  let pids: number[] = []
  return {
    what: 'frozen',
    begin: async () => {
      pids = await cluster.pids()
      for (const pid of pids) process.kill(pid, 'SIGSTOP')
    },
    lastsMs: DEADLINE_MS + 1000,
    end: async () => {
      for (const pid of pids) process.kill(pid, 'SIGCONT')
    },
    bounds: { unavailableMs: DEADLINE_MS + 1500, servedAgainMs: 3000 },
  }
}

/** A request waiting on a row lock whose backend is terminated, three times: how long after the kill its 503 comes. */
async function killed(base: string, token: string, url: string): Promise<string[]> {
  const after: number[] = []
  const db = connect(url, { max: 2, statementTimeoutMs: 10_000 })
  try {
    const [{ id }] = await db<[{ id: number }]>`
      INSERT INTO users (name, email) VALUES ('Victim', 'victim@example.com') RETURNING id`
    for (let round = 0; round < 3; round++) {
      const lock = await holdRowLock(db, 'users', id)
      try {
        const body = { name: `Round ${round}` }
        const request = call(base, 'PATCH', `/users/${id}`, { token, body, timeoutMs: 20_000 })
        let pid: number | undefined
        await waitFor(
          'the request to wait on the lock',
          async () => {
            const [waiting] = await db<Array<{ pid: number }>>`
            SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`
            pid = waiting?.pid
            return pid !== undefined
          },
          10_000,
          10,
        )
        const killedAt = performance.now()
        await db`SELECT pg_terminate_backend(${pid!})`
        const answer = await request
        if (isUnavailable(answer)) after.push(answer.ended - killedAt)
      } finally {
        lock.release()
        await lock.done
      }
    }
  } finally {
    await db.end({ timeout: 1 })
  }
  const l = latencies(after.map((took) => ({ started: 0, ended: took })))
  const figures = [String(after.length), ms(Math.min(...after)), ms(l.p50), ms(l.p99), ms(l.max)]
  return ['a backend killed mid-request', ...figures, '', '', '', '']
}
