import { setTimeout as sleep } from 'node:timers/promises'
import {
  adminToken,
  call,
  floodIdleConnections,
  malformedRequests,
  sendMalformed,
  slowClients,
  startLoad,
  type Outcome,
} from '../../test/fault-kit.js'
import { latencyCells, ms } from './format.js'
import type { FaultSection } from './section.js'
import { quietService, withOwnDatabase } from './service.js'

// Well-behaved clients alone, then while hostile ones attack: slow headers and
// slow bodies, 2,000 connections that send nothing, malformed requests by the
// hundred (test/fault-hostile.test.ts asserts what each gets, and that the good
// ones are served meanwhile; this is how long they wait). The service is the
// real process, the good clients in this one, the idle flood in another.

const HEADERS_TIMEOUT = 2
const REQUEST_TIMEOUT = 3
const BODY_LIMIT = 131_072
const ALONE_MS = 3000

interface Phase {
  outcomes: Outcome[]
  /** What the hostile clients of the phase got. */
  hostile: string
}

export async function measure(): Promise<FaultSection> {
  return withOwnDatabase(async ({ url, adminId }) => {
    const service = await quietService({
      DATABASE_URL: url,
      HEADERS_TIMEOUT: String(HEADERS_TIMEOUT),
      REQUEST_TIMEOUT: String(REQUEST_TIMEOUT),
      BODY_LIMIT: String(BODY_LIMIT),
    })
    try {
      const token = adminToken(adminId)
      /** Reads of one user and /healthz, about 300 a second from 4 clients, bodies not kept. */
      const good = () =>
        startLoad(4, async (client, seq) => {
          const path = client % 2 ? `/users/${adminId}` : '/healthz'
          const o = await call(service.url, 'GET', path, { token, client, seq, timeoutMs: 10_000 })
          await sleep(10)
          return { ...o, body: undefined }
        })
      /** The good clients while `attack` runs. */
      const during = async (attack: () => Promise<string>): Promise<Phase> => {
        const load = good()
        try {
          return { hostile: await attack(), outcomes: load.outcomes }
        } finally {
          await load.stop()
        }
      }
      const range = (lived: number[]) => `${ms(Math.min(...lived))}–${ms(Math.max(...lived))}`
      // Everything once, unmeasured: the service's code for each path compiled, fetch's pool filled.
      await during(async () => {
        await Promise.all([slowClients(service.port, 3, token), floodIdleConnections(service.port, 50)])
        return ''
      })

      const alone = await during(async () => {
        await sleep(ALONE_MS)
        return ''
      })
      const slow = await during(async () => {
        const { headers, bodies } = await slowClients(service.port, 100, token)
        const lived = (cs: typeof headers) => cs.map((c) => c.closedAt - c.openedAt)
        return `100 slow-header cut after ${range(lived(headers))} ms, 100 slow-body after ${range(lived(bodies))} ms`
      })
      const flood = await during(async () => {
        const report = await floodIdleConnections(service.port, 2000)
        const closed = `${ms(report.min)}–${ms(report.max)}`
        return `2,000 idle: ${report.answered408} × 408, closed ${closed} ms after their connect`
      })
      const kinds = malformedRequests(token, BODY_LIMIT)
      const malformed = await during(async () => {
        let sent = 0
        let answered = 0
        for (let round = 0; round < 4; round++) {
          for (const [name, statuses] of await sendMalformed(service.port, kinds, 25)) {
            const status = kinds.find(([kind]) => kind === name)![2]
            sent += statuses.length
            answered += statuses.filter((s) => s === status).length
          }
        }
        return `${sent} malformed (5 kinds), ${answered} answered their 4xx`
      })
      const row = (what: string, phase: Phase) => {
        const failed = phase.outcomes.filter((o) => o.status !== 200).length
        return [what, ...latencyCells(phase.outcomes), String(failed), phase.hostile]
      }
      return {
        title: 'Good clients beside hostile ones',
        columns: ['good clients', 'answers', 'p50 ms', 'p99 ms', 'max ms', 'not 200', 'hostile clients meanwhile'],
        rows: [
          row(`alone (${ALONE_MS / 1000} s)`, alone),
          row('slow headers and bodies', slow),
          row('2,000-connection flood', flood),
          row('malformed requests', malformed),
        ],
        note:
          `The real process, HEADERS_TIMEOUT ${HEADERS_TIMEOUT} s and REQUEST_TIMEOUT ${REQUEST_TIMEOUT} s ` +
          '(Node checks both every second); 4 good clients (GET /users/{id} and /healthz, 10 ms apart) in the bench ' +
          'process, the idle flood from another. test/fault-hostile.test.ts once held the good clients to 5 times ' +
          'their p99 and max alone (at least 250 ms and 1.5 s).',
      }
    } finally {
      service.kill('SIGKILL')
      await service.exited
    }
  })
}
