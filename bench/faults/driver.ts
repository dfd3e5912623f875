import { connect } from '../../src/core/db/connect.js'
import { latencies, waitFor } from '../../test/fault-kit.js'
import { ms } from './format.js'
import type { FaultSection } from './section.js'
import { withOwnDatabase } from './service.js'

// postgres.js's sql.end() without a time-out once a connection died under a
// running query: unpatched it never returned (porsager/postgres#1097);
// test/fault-driver.test.ts asserts that it returns. This is how long it
// takes, beside the same end() on a pool whose query finished.

const ROUNDS = 5

export async function measure(): Promise<FaultSection> {
  return withOwnDatabase(async ({ url }) => {
    const killer = connect(url, { max: 1, statementTimeoutMs: 10_000 })
    try {
      const healthy: Array<{ started: number; ended: number }> = []
      const afterKill: Array<{ started: number; ended: number }> = []
      for (let round = 0; round < ROUNDS; round++) {
        const sql = connect(url, { max: 1, statementTimeoutMs: 30_000 })
        await sql`SELECT pg_sleep(0.01)`
        const started = performance.now()
        await sql.end()
        healthy.push({ started, ended: performance.now() })
      }
      for (let round = 0; round < ROUNDS; round++) {
        const sql = connect(url, { max: 1, statementTimeoutMs: 30_000 })
        const [{ pid }] = await sql<[{ pid: number }]>`SELECT pg_backend_pid() AS pid`
        const slow = sql`SELECT pg_sleep(30)`.catch(() => 'lost')
        const running = async () =>
          (await killer`SELECT 1 FROM pg_stat_activity WHERE pid = ${pid} AND state = 'active'`).length > 0
        await waitFor('the query to run', running, 5000, 10)
        await killer`SELECT pg_terminate_backend(${pid})`
        await slow
        const started = performance.now()
        await sql.end()
        afterKill.push({ started, ended: performance.now() })
      }
      const row = (what: string, took: typeof healthy) => {
        const l = latencies(took)
        return [what, String(l.count), ms(l.p50), ms(l.max)]
      }
      return {
        title: 'postgres.js: sql.end() after a connection died under a query',
        columns: ['sql.end() without a time-out', 'rounds', 'p50 ms', 'max ms'],
        rows: [
          row('after a query that finished (the baseline)', healthy),
          row('after pg_terminate_backend under pg_sleep(30)', afterKill),
        ],
        note:
          'A pool of one connection. test/fault-driver.test.ts once held the second to 1000 ms; it now holds it to ' +
          'returning at all (3 s tell a hang).',
      }
    } finally {
      await killer.end({ timeout: 1 })
    }
  })
}
