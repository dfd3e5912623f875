import { connect } from '../src/core/db/connect.js'
import { startLocalCluster } from '../src/dev/local-cluster.js'

// postgres.js 3.4.9 gets slower with every statement a saturated pool runs:
// its pool keeps connections in small array queues (src/queue.js), and the
// `busy` queue is consumed with shift(), which leaves a hole at the front and
// only resets the array when a shift() empties it. Under sustained load busy
// never empties that way, so the array grows by one hole per pipelined
// statement, and every move of a connection between queues (queue.remove,
// an indexOf from position 0) scans all of them.
//
// This drives the service's own pool (src/core/db/connect.ts, 10 connections) with
// 32 concurrent loops of a trivial statement and prints the CPU per statement
// as the process ages. Flat figures mean the driver is fixed.
//
//   node --import tsx bench/pool-drift.ts [statements, default 200000]

const total = Number(process.argv[2] ?? 200_000)
const step = Math.max(1, Math.floor(total / 10))
const sql = connect(process.env.DATABASE_URL ?? startLocalCluster(), { max: 10, statementTimeoutMs: 60_000 })
let done = 0
let cpu = process.cpuUsage()
let wall = performance.now()
await Promise.all(
  Array.from({ length: 32 }, async () => {
    while (done < total) {
      await sql`SELECT ${1}::int AS x`
      if (++done % step === 0) {
        const used = process.cpuUsage(cpu)
        const ms = performance.now() - wall
        console.log(
          `${String(done).padStart(8)} ` +
            `statements: ${((used.user + used.system) / step).toFixed(1).padStart(6)} µs CPU ` +
            `and ${((ms * 1000) / step).toFixed(1).padStart(6)} µs wall per statement`,
        )
        cpu = process.cpuUsage()
        wall = performance.now()
      }
    }
  }),
)
await sql.end({ timeout: 5 })
