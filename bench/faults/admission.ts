import { setTimeout as sleep } from 'node:timers/promises'
import { WAIT_TARGET_MS } from '../../src/core/db/admission.js'
import { adminToken, call, startLoad, summarize } from '../../test/fault-kit.js'
import { latencyCells } from './format.js'
import type { FaultSection } from './section.js'
import { quietService, withOwnDatabase } from './service.js'

// Many more clients than the pool has connections, on a database that keeps
// up: database admission refuses nobody, and each request's wait is the
// queue's (test/admission.test.ts asserts that a healthy database under 20
// times more clients than connections refuses nobody, with a target set from
// the wait it measured first; this is the wait against the service's own
// target). Closed-loop clients (each sends its next request when its last is
// answered) reading one user, against the real process with a pool of 10.

const POOL = 10
const CLIENTS = [10, 200, 1000]
const DURATION_MS = 5000

export async function measure(): Promise<FaultSection> {
  return withOwnDatabase(async ({ url, adminId }) => {
    const service = await quietService({ DATABASE_URL: url, DATABASE_POOL_MAX: String(POOL) })
    try {
      const token = adminToken(adminId)
      const read = async (client: number, seq: number) => ({
        ...(await call(service.url, 'GET', `/users/${adminId}`, { token, client, seq, timeoutMs: 30_000 })),
        body: undefined,
      })
      // Unmeasured: the code compiled, the pool's connections opened.
      const warm = startLoad(POOL, read)
      await sleep(1000)
      await warm.stop()
      const rows: string[][] = []
      for (const clients of CLIENTS) {
        const load = startLoad(clients, read)
        await sleep(DURATION_MS)
        const outcomes = await load.stop()
        const served = outcomes.filter((o) => o.status === 200)
        const refused = summarize(outcomes)['503 database_unavailable'] ?? 0
        const other = outcomes.length - served.length - refused
        const counts = [String(refused), String(other), String(WAIT_TARGET_MS)]
        rows.push([String(clients), String(POOL), ...latencyCells(served), ...counts])
      }
      return {
        title: `Database admission: many more clients than connections (pool of ${POOL})`,
        columns: [
          'clients',
          'connections',
          'served',
          'p50 ms',
          'p99 ms',
          'max ms',
          'refused (503)',
          'other',
          'target ms',
        ],
        rows,
        note:
          `${DURATION_MS / 1000} s of closed-loop GET /users/{id} per row, from the bench process (fetch). A request ` +
          'is refused only once the oldest in its database stage has waited the target and more wait than the ' +
          'database finished in that time (src/core/db/admission.ts): a queue the database works off is never ' +
          'refused. test/admission.test.ts once held a simulated pool of 10 under 200 clients to no refusal within ' +
          'a fixed 400 ms target, which a busy machine broke (57 refused of 1,559).',
      }
    } finally {
      service.kill('SIGKILL')
      await service.exited
    }
  })
}
