import { setTimeout as sleep } from 'node:timers/promises'
import { DEADLINE_GRACE_MS, WAIT_TARGET_MS } from '../../src/core/db/admission.js'
import { connect } from '../../src/core/db/connect.js'
import { adminToken, call, holdTableLock, type Outcome } from '../../test/fault-kit.js'
import { latencyCells, ms } from './format.js'
import type { FaultSection } from './section.js'
import { quietService, withOwnDatabase } from './service.js'

// A database that stops keeping up: every read waits on a table lock this
// section holds until STATEMENT_TIMEOUT cancels it, under an open-loop flood
// (4 reads every 5 ms, sent whatever the answers). test/fault-pool.test.ts
// asserts who is refused and when (once the oldest has waited the target,
// each refusal answered while reads admitted before it still wait), the
// bound on what waits, and memory; this is how long each kind of answer
// took, beside the reads once the lock is gone.

const POOL = 2
const STATEMENT_TIMEOUT_S = 1
const STALL_MS = WAIT_TARGET_MS + 1500

export async function measure(): Promise<FaultSection> {
  return withOwnDatabase(async ({ url, adminId }) => {
    const service = await quietService({
      DATABASE_URL: url,
      DATABASE_POOL_MAX: String(POOL),
      STATEMENT_TIMEOUT: String(STATEMENT_TIMEOUT_S),
    })
    const locker = connect(url, { max: 1, statementTimeoutMs: 60_000 })
    try {
      const token = adminToken(adminId)
      const read = () => call(service.url, 'GET', `/users/${adminId}`, { token, timeoutMs: 20_000 })
      const flood = async (durationMs: number): Promise<Outcome[]> => {
        const reads: Array<Promise<Outcome>> = []
        for (const started = performance.now(); performance.now() - started < durationMs; await sleep(5)) {
          for (let i = 0; i < 4; i++) reads.push(read())
        }
        return Promise.all(reads)
      }
      await flood(1000)
      const lock = await holdTableLock(locker, 'users')
      const lockedAt = performance.now()
      let stalled: Promise<Outcome[]>
      try {
        stalled = flood(STALL_MS)
        await sleep(STALL_MS)
      } finally {
        lock.release()
        await lock.done
      }
      const during = await stalled
      const after = await flood(1000)
      const refused = during.filter((o) => o.status === 503 && /not keeping up/.test(o.body?.detail ?? ''))
      const admitted = during.filter((o) => !refused.includes(o))
      const firstRefusal = Math.min(...refused.map((o) => o.ended)) - lockedAt
      const deadlineMs = STATEMENT_TIMEOUT_S * 1000 + DEADLINE_GRACE_MS
      return {
        title: `A pool of ${POOL} stalled by a lock, under an open-loop flood`,
        columns: ['reads', 'answers', 'p50 ms', 'p99 ms', 'max ms', 'bound'],
        rows: [
          [
            'refused at once (503)',
            ...latencyCells(refused),
            `the first ${ms(firstRefusal)} ms after the lock, not before ${WAIT_TARGET_MS} ms`,
          ],
          [
            'admitted while locked (200, or 503 at the deadline)',
            ...latencyCells(admitted),
            `${deadlineMs} ms (STATEMENT_TIMEOUT + 5 s)`,
          ],
          ['once the lock is gone (the baseline)', ...latencyCells(after), ''],
        ],
        note:
          `The real process, DATABASE_POOL_MAX ${POOL}, STATEMENT_TIMEOUT ${STATEMENT_TIMEOUT_S} s, the table ` +
          `locked ${STALL_MS / 1000} s. test/fault-pool.test.ts once held the refusals' median (timed by the ` +
          "service) under a quarter of the admitted reads' median.",
      }
    } finally {
      await locker.end({ timeout: 1 })
      service.kill('SIGKILL')
      await service.exited
    }
  })
}
