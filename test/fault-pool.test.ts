import assert from 'node:assert/strict'
import { after, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { DEADLINE_GRACE_MS, SWEEP_MS, WAIT_TARGET_MS } from '../src/core/db/admission.js'
import { connect } from '../src/core/db/connect.js'
import { call, holdTableLock, settledHeap, summarize, type Outcome } from './fault-kit.js'
import { startServer } from './helpers/server.js'

// A database that stops keeping up (a table lock this test holds: every read
// waits until STATEMENT_TIMEOUT cancels it, so two connections finish two
// statements a second), under an open-loop flood of reads that arrive
// whatever the answers: postgres.js would queue them without limit; the
// service must refuse newcomers at once with 503 database_unavailable and
// Retry-After once the oldest has waited the target, bound the wait of the
// others, keep its memory flat, and serve again as soon as the lock goes.
// Then the 50-way races on one row and one e-mail.
//
// Every bound below is counted from what this run did (its own arrivals, its
// own lock time, its own reads once the lock is gone), not from how fast the
// machine is: a busy machine sends fewer reads, and the bounds follow. How
// long refusals and admitted reads take is a figure of
// `make bench-faults` (bench/faults/admission.ts).

const POOL = 2
const STATEMENT_TIMEOUT_S = 1
const api = await startServer({
  DATABASE_POOL_MAX: String(POOL),
  STATEMENT_TIMEOUT: String(STATEMENT_TIMEOUT_S),
  LOG_LEVEL: 'error',
})
const fresh = await startServer()
const locker = connect(api.databaseUrl, { max: 1, statementTimeoutMs: 60_000 })
after(() => locker.end({ timeout: 1 }))
const ms = (x: number) => `${Math.round(x)} ms`
const MB = (x: number) => `${(x / 1048576).toFixed(1)} MB`

/** The most of `times` that fall within any window of `windowMs`. */
function mostWithin(times: number[], windowMs: number): number {
  const sorted = [...times].sort((a, b) => a - b)
  let most = 0
  for (let first = 0, last = 0; last < sorted.length; last++) {
    while (sorted[last]! - sorted[first]! > windowMs) first++
    most = Math.max(most, last - first + 1)
  }
  return most
}

describe('a database that stops keeping up', () => {
  test(
    `an open-loop flood of reads while every statement waits on a lock: once the oldest has ` +
      `waited ${WAIT_TARGET_MS} ms, newcomers get 503 at once; every wait is bounded, memory stays flat, and reads ` +
      `are served again when the lock goes`,
    async () => {
      const token = api.admin.token
      const readable = await api.createUser({ name: 'Readable' })
      const work = api.deps.databaseAdmission
      assert.equal(work.targetMs, WAIT_TARGET_MS)

      // The flood: 4 reads every 5 ms, each sent without waiting for any answer.
      // Only a compact record of each answer is kept, so that the heap figures
      // are the service's, not this client's.
      const compact = (o: Outcome): Outcome => ({
        ...o,
        body: o.body?.detail ? { detail: /not keeping up/.test(o.body.detail) ? 'not keeping up' : '' } : undefined,
      })
      let pending = 0
      let maxPending = 0
      let sent = 0
      const heap: number[] = []
      /** The flood until `over()` holds (given how long it has run, ms). */
      async function flood(over: (ms: number) => boolean, sampleHeap: boolean): Promise<Array<Promise<Outcome>>> {
        const reads: Array<Promise<Outcome>> = []
        const started = performance.now()
        let seq = 0
        let sampledAt = started
        while (!over(performance.now() - started)) {
          for (let i = 0; i < 4; i++) {
            pending++
            maxPending = Math.max(maxPending, pending)
            const what = `read-${++sent}`
            reads.push(
              call(api.url, 'GET', `/users/${readable.id}`, {
                token,
                seq: seq++,
                what,
                headers: { 'x-request-id': what },
                timeoutMs: 20_000,
              })
                .then(compact)
                .finally(() => void pending--),
            )
          }
          await sleep(5)
          // By time, not by count: a busy machine sends fewer reads, and must still be sampled.
          if (sampleHeap && performance.now() - sampledAt >= 500) {
            heap.push(await settledHeap())
            sampledAt = performance.now()
          }
        }
        return reads
      }

      // A first part of a second of it, locked too (shorter than the target, so nobody is refused), warms
      // up the code of every path. Then the baseline, without the keep-alive connections the flood leaves
      // open (they would stay for the keep-alive time, and count as growth).
      const warmUp = await holdTableLock(locker, 'users')
      const warming = await flood((ms) => ms >= 600, false).finally(() => warmUp.release())
      await warmUp.done
      await Promise.all(warming)
      api.closeIdleConnections()
      const baseline = await settledHeap()
      work.peak = work.active
      maxPending = pending

      const lock = await holdTableLock(locker, 'users')
      const lockedAt = performance.now()
      let stalled: Array<Promise<Outcome>> = []
      let releasedAt = 0
      try {
        // Until a second past the target and refusals seen (a busy machine sends fewer reads, and later), or 30 s.
        stalled = await flood((ms) => (ms >= WAIT_TARGET_MS + 1000 && work.refused >= 20) || ms > 30_000, true)
      } finally {
        lock.release()
        await lock.done
        releasedAt = performance.now()
      }
      // What the lock left waiting is served (or was answered 503 at its deadline); then the flood again.
      const stalledOutcomes = await Promise.all(stalled)
      const drainedAt = performance.now()
      const recovering = await flood((ms) => ms >= 500, true)
      const outcomes = [...stalledOutcomes, ...(await Promise.all(recovering))]
      api.closeIdleConnections()
      const after = await settledHeap()

      const refused = outcomes.filter((o) => o.status === 503 && /not keeping up/.test(o.body?.detail ?? ''))
      const admitted = stalledOutcomes.filter((o) => !refused.includes(o))
      const afterwards = outcomes.filter((o) => o.started >= drainedAt)
      const servedAfterwards = afterwards.filter((o) => o.status === 200)
      // What may wait at once: what arrives before the oldest has waited the target, plus the few the
      // locked database finishes. Counted from when this client sent them, which is up to a heap sample's
      // pause (a few hundred ms, in which nothing is sent or received) away from when the service saw them.
      const limit =
        mostWithin(
          stalledOutcomes.map((o) => o.started),
          WAIT_TARGET_MS + 500,
        ) + 50
      // The deadline is kept by a sweep (every SWEEP_MS) in a loop this flood keeps busy: a read may be
      // answered past it by as much as five times the longest read took once the lock was gone.
      const deadlineMs = STATEMENT_TIMEOUT_S * 1000 + DEADLINE_GRACE_MS
      const slack = SWEEP_MS + 5 * Math.max(...afterwards.map((o) => o.ended - o.started))

      // Every answer is a success or a 503 database_unavailable with Retry-After; nothing hung.
      for (const o of outcomes) {
        assert.ok(
          o.status === 200 || (o.status === 503 && o.code === 'database_unavailable' && o.retryAfter),
          `${o.what}: ${o.error ?? `${o.status} ${o.code}`}`,
        )
      }
      // Refused only once the oldest had waited the target (an answer cannot come before the decision),
      // and then at once: a refusal answered while the lock held waited for nothing, so reads admitted
      // before it were still waiting when it was answered.
      assert.ok(refused.length > 0, 'once the oldest has waited the target, newcomers are refused at once')
      assert.ok(
        Math.min(...refused.map((o) => o.ended)) - lockedAt >= WAIT_TARGET_MS,
        'nobody is refused before a request has waited the target',
      )
      const queuedAhead = (r: Outcome) => admitted.some((a) => a.started < r.started && a.ended > r.ended)
      const refusedWhileLocked = refused.filter((r) => r.ended < releasedAt)
      assert.ok(refusedWhileLocked.length > 0, 'refusals while the lock held')
      const waitedInLine = refusedWhileLocked.filter((r) => !queuedAhead(r)).map((r) => r.what)
      assert.deepEqual(waitedInLine, [], 'each refusal was answered while reads admitted before it still waited')
      // The bound held; what was admitted waited at most its deadline (then 503).
      assert.ok(work.peak <= limit, `peak ${work.peak} > ${limit}`)
      assert.ok(maxPending < limit + 100, `${maxPending} answers outstanding at once`)
      const waited = Math.max(...admitted.map((o) => o.ended - o.started))
      assert.ok(waited < deadlineMs + slack, `a read waited ${ms(waited)} (bound ${ms(deadlineMs + slack)})`)
      // Once what the lock left waiting was answered, every read was served again: no refusal outlived the stall.
      assert.ok(
        afterwards.length > 0 && servedAfterwards.length === afterwards.length,
        `${servedAfterwards.length} of ${afterwards.length} served once the stall was drained`,
      )
      // Memory: bounded during the flood by the answers outstanding (a few hundred, whose client and server
      // sides both live in this process: about 25 KB each), back to the baseline after.
      assert.ok(heap.length >= 2, `${heap.length} heap samples`)
      const rose = Math.max(...heap) - baseline
      assert.ok(rose < maxPending * 50 * 1024, `heap rose by ${MB(rose)} for ${maxPending} answers outstanding`)
      assert.ok(after - baseline < 5 * 1048576, `heap grew by ${MB(after - baseline)}`)
      assert.equal(work.active, 0)
      // And the service answers normally again.
      assert.equal((await call(api.url, 'GET', `/users/${readable.id}`, { token })).status, 200)
    },
  )
})

describe('races', () => {
  let serial = 0

  test(
    '50 concurrent updates of one row with the same If-Match: exactly one 200, 49 × 412, one new ' + 'version',
    async () => {
      const created = await fresh.request('POST', '/users', {
        body: { name: 'Race', email: `race.${++serial}@example.com` },
      })
      const etag = created.headers.get('etag')!
      const results = await Promise.all(
        Array.from({ length: 50 }, (_, i) =>
          fresh.request('PATCH', `/users/${created.body.id}`, {
            body: { name: `Racer ${i}` },
            headers: { 'if-match': etag },
          }),
        ),
      )
      const statuses = results.map((r) => r.status).sort()
      assert.deepEqual(summarize(results.map((r) => ({ status: r.status, code: r.body?.code }) as Outcome)), {
        200: 1,
        '412 precondition_failed': 49,
      })
      assert.equal(statuses.length, 50)
      const winner = results.find((r) => r.status === 200)!
      const [row] = await fresh.sql<
        [{ name: string; version: number }]
      >`SELECT name, version FROM users WHERE id = ${created.body.id}`
      assert.deepEqual({ ...row }, { name: winner.body.name, version: 2 })
    },
  )

  test('50 concurrent creations with one e-mail: exactly one 201, 49 × 409 email_taken, one row', async () => {
    const email = `same.${++serial}@example.com`
    const results = await Promise.all(
      Array.from({ length: 50 }, (_, i) => fresh.request('POST', '/users', { body: { name: `Twin ${i}`, email } })),
    )
    assert.deepEqual(summarize(results.map((r) => ({ status: r.status, code: r.body?.code }) as Outcome)), {
      201: 1,
      '409 email_taken': 49,
    })
    const [{ n }] = await fresh.sql<[{ n: number }]>`SELECT count(*)::int AS n FROM users WHERE lower(email) = ${email}`
    assert.equal(n, 1)
  })
})
