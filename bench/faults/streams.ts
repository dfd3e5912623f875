import { setTimeout as sleep } from 'node:timers/promises'
import type { Service } from '../../src/service.js'
import { adminToken, call, latencies } from '../../test/fault-kit.js'
import { insertEvents, SseClient } from '../../test/helpers/sse.js'
import { ms } from './format.js'
import type { FaultSection } from './section.js'
import { inProcessService, withOwnDatabase } from './service.js'

// GET /events/stream, timed: test/event-stream.test.ts asserts that an event
// reaches a stream on another instance by its notification (on a reader
// that would not poll for a minute), that events committed while the
// listening connection is away come once it is back, that an idle stream
// gets a comment every heartbeat, and that a shutdown cuts a stalled stream
// without the grace a clean end gets. These are the times, two instances of
// the service in this process on one database.

const WRITES = 20
const HEARTBEAT_MS = 100
/** src/events/stream.ts: how long a cleanly ended stream may take to flush before its connection is cut. */
const END_GRACE_MS = 500

type Running = { service: Service; url: string }

export async function measure(): Promise<FaultSection> {
  return withOwnDatabase(async ({ url: databaseUrl, adminId }) => {
    const started: Running[] = []
    const start = async (streams: Parameters<typeof inProcessService>[1] = {}) => {
      const running = await inProcessService(databaseUrl, streams)
      started.push(running)
      return running
    }
    const open: SseClient[] = []
    try {
      const token = adminToken(adminId)
      const headers = { authorization: `Bearer ${token}` }
      const follow = async (on: Running, path = '/events/stream') => {
        const c = await SseClient.open(on.url, path, { headers })
        open.push(c)
        await c.waitFor(() => c.retry !== undefined, 10_000, 'retry:')
        return c
      }
      const [a, b] = [await start(), await start()]
      let serial = 0
      /** How long from a write through `via` until `c` has its event, `WRITES` times. */
      const delivery = async (via: Running, c: SseClient) => {
        const took: Array<{ started: number; ended: number }> = []
        for (let i = 0; i < WRITES; i++) {
          const seen = c.count
          const at = performance.now()
          const body = { sku: `BENCH-${++serial}`, name: 'Widget', price: 100, currency: 'EUR', stock: 1 }
          const res = await call(via.url, 'POST', '/products', { token, body })
          if (res.status !== 201) throw new Error(`POST /products: ${res.status}`)
          await c.waitForEvents(seen + 1, 10_000)
          took.push({ started: at, ended: performance.now() })
        }
        return latencies(took)
      }
      const same = await delivery(a, await follow(a))
      const other = await delivery(a, await follow(b))

      // The listening connections killed, and an event committed while they are away.
      const lost: Array<{ started: number; ended: number }> = []
      const [onA, onB] = [await follow(a), await follow(b)]
      for (let round = 0; round < 3; round++) {
        const [seenA, seenB] = [onA.count, onB.count]
        await a.service.deps.sql.begin(async (tx) => {
          await tx`
            SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
            WHERE datname = current_database() AND query ILIKE 'listen %' AND pid <> pg_backend_pid()`
          await tx`
            INSERT INTO event_outbox (type, subject_type, subject_id, data)
            VALUES ('product.updated', 'product', 1, '{}')`
        })
        const at = performance.now()
        await Promise.all([onA.waitForEvents(seenA + 1, 20_000), onB.waitForEvents(seenB + 1, 20_000)])
        lost.push({ started: at, ended: performance.now() })
        // Both listening again before the next round.
        await sleep(500)
      }
      const afterLoss = latencies(lost)

      // The spacing of keep-alive comments on an idle stream.
      const h = await start({ heartbeatMs: HEARTBEAT_MS })
      const idle = await follow(h, '/events/stream?type=user.deleted')
      const beats: number[] = []
      for (let n = 1; n <= 20; n++) {
        await idle.waitFor(() => idle.comments.length >= n, 5000, `comment ${n}`)
        beats.push(performance.now())
      }
      const spacing = latencies(beats.slice(1).map((at, i) => ({ started: beats[i]!, ended: at })))

      // A shutdown with streams that keep up and one that stopped reading under more than the kernel's buffers hold.
      const s = await start({ bufferLimitBytes: 64 * 1024 * 1024 })
      const keeping = await Promise.all(Array.from({ length: 5 }, () => follow(s)))
      const stalled = await follow(s)
      stalled.res.pause()
      await insertEvents(s.service.deps.sql, 600, 16_000)
      for (const c of keeping) await c.waitForEvents(600, 30_000)
      const shutdownAt = performance.now()
      await s.service.shutdown()
      const shutdownMs = performance.now() - shutdownAt

      const row = (what: string, l: { count: number; p50: number; max: number }, reference: string) => [
        what,
        String(l.count),
        ms(l.p50),
        ms(l.max),
        reference,
      ]
      return {
        title: "Event streams: delivery, the listener's return, heartbeats, a shutdown",
        columns: ['what', 'samples', 'p50 ms', 'max ms', 'reference'],
        rows: [
          row('a write to its event, on a stream of the same instance', same, "the write's own request included"),
          row('a write to its event, on a stream of another instance', other, 'read on notification; polls every 1 s'),
          row('an event committed while the listeners were away, on both', afterLoss, 'once held to 1500 ms'),
          row('between keep-alive comments on an idle stream', spacing, `heartbeat ${HEARTBEAT_MS} ms`),
          row(
            'shutdown with 5 streams keeping up and 1 stalled',
            { count: 1, p50: shutdownMs, max: shutdownMs },
            `a clean end may take ${END_GRACE_MS} ms; the stalled one is cut`,
          ),
        ],
        note:
          `${WRITES} writes (POST /products) per delivery row, each timed from the request to the event on the ` +
          'stream; ' +
          "the service in the bench process, so a stream's client and server share its event loop. " +
          'test/event-stream.test.ts once held the cross-instance delivery to 1000 ms, the events after the ' +
          "listeners' loss to 1500 ms, 3 comments to 600 ms and the shutdown to 450 ms.",
      }
    } finally {
      for (const c of open) c.close()
      for (const { service } of started) await service.close()
    }
  })
}
