import assert from 'node:assert/strict'
import { after, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { DatabaseAdmission, DatabaseBusy, SWEEP_MS } from '../src/core/db/admission.js'
import { busyProblem } from '../src/core/http/database-problems.js'

// Database admission, as a unit, with a simulated
// database: `connections` statements at a time, each `serviceMs`, the rest
// queued first in, first out (as postgres.js queues them). The fault tests
// (test/fault-pool.test.ts, test/fault-db-outage.test.ts) show the bound
// against a real pool and a frozen server, and `make bench` against a healthy
// one under 128 to 1,000 connections.

/** A DatabaseBusy, answered 503 database_unavailable with this Retry-After. */
const isUnavailable = (retryAfter: string) => (err: unknown) => {
  if (!(err instanceof DatabaseBusy)) return false
  const problem = busyProblem(err)
  return problem.status === 503 && problem.code === 'database_unavailable' && problem.options.headers?.['retry-after'] === retryAfter
}

class SimulatedDatabase {
  private busy = 0
  private readonly queue: Array<() => void> = []
  constructor(private readonly connections: number) {}

  async statement<T>(serviceMs: number, value: T): Promise<T> {
    if (this.busy >= this.connections) await new Promise<void>((resolve) => this.queue.push(resolve))
    else this.busy++
    await sleep(serviceMs)
    const next = this.queue.shift()
    if (next) next()
    else this.busy--
    return value
  }
}

/** `clients` closed-loop clients (each sends its next request when its last is answered) for `durationMs`. */
async function closedLoop(work: DatabaseAdmission, clients: number, durationMs: number, request: () => Promise<unknown>) {
  const end = performance.now() + durationMs
  let served = 0
  let refused = 0
  let longest = 0
  await Promise.all(
    Array.from({ length: clients }, async () => {
      while (performance.now() < end) {
        const started = performance.now()
        try {
          await work.run(request)
          served++
        } catch (err) {
          if (!isUnavailable('1')(err)) throw err
          refused++
          await sleep(1)
        }
        longest = Math.max(longest, performance.now() - started)
      }
    }),
  )
  return { served, refused, longest }
}

// Work on a frozen database: it settles only when the test file ends (the
// sweep that enforces deadlines runs while any work is unsettled).
const thawAll: Array<() => void> = []
const frozen = () => new Promise<void>((resolve) => thawAll.push(resolve))
after(() => thawAll.forEach((thaw) => thaw()))

test('work gives its value or its error', async () => {
  const work = new DatabaseAdmission({ floor: 2, targetMs: 200, deadlineMs: 1000 })
  assert.equal(await work.run(async () => 42), 42)
  await assert.rejects(work.run(async () => { throw new Error('boom') }), /boom/)
  await assert.rejects(work.run(() => { throw new Error('sync boom') }), /sync boom/)
  assert.equal(work.active, 0)
  assert.equal(work.finished, 3)
})

test('a healthy database under many times more clients than connections: every request is served while the wait stays within the target', async () => {
  // 10 connections, 4 ms a statement (5 with timer granularity): about 2,000
  // statements a second. 200 clients queue for about 100 ms each, 20 times
  // the statement's time, but the database finishes more than are waiting
  // within the 400 ms target: waiting is not the problem, so nobody is refused.
  // (The simulated statements are timers: on a busy machine each takes longer,
  // and the target leaves room for four times the statement's time.)
  const db = new SimulatedDatabase(10)
  const work = new DatabaseAdmission({ floor: 10, targetMs: 400, deadlineMs: 5000 })
  const result = await closedLoop(work, 200, 1500, () => db.statement(4, 'row'))
  assert.equal(result.refused, 0, JSON.stringify(result))
  assert.ok(result.served > 1000, JSON.stringify(result))
  assert.ok(work.peak >= 190, `peak ${work.peak}`)
})

test('one slow statement among fast ones refuses nobody, though it is the oldest past the target', async () => {
  // A target of 300 ms, far above the fast statements' wait (a few ms), so that an event loop held up
  // for a while on a busy machine does not pass for a database that stopped keeping up.
  const db = new SimulatedDatabase(10)
  const work = new DatabaseAdmission({ floor: 10, targetMs: 300, deadlineMs: 5000 })
  const slow = work.run(() => sleep(1200, 'report'))
  const result = await closedLoop(work, 30, 1000, () => db.statement(2, 'row'))
  assert.equal(await slow, 'report')
  assert.equal(result.refused, 0, JSON.stringify(result))
  assert.equal(work.refused, 0)
})

test('a frozen database: newcomers are admitted until the oldest has waited the target, then refused at once, never started', async () => {
  const work = new DatabaseAdmission({ floor: 2, targetMs: 300, deadlineMs: 60_000 })
  const held = Array.from({ length: 5 }, () => work.run(frozen))
  for (const h of held) h.catch(() => {})
  await sleep(100)
  // Within the target: still admitted (a burst after a quiet spell is not a failure).
  const early = work.run(frozen)
  early.catch(() => {})
  assert.equal(work.active, 6)
  await sleep(250)
  let started = false
  // At once: refused before the event loop turns (a bound in milliseconds fails on a busy machine, not on a wrong rule).
  const refusal = work.run(async () => void (started = true))
  const first = await Promise.race([refusal.then(() => 'ran', () => 'refused'), new Promise((resolve) => setImmediate(() => resolve('waited')))])
  assert.equal(first, 'refused')
  await assert.rejects(refusal, isUnavailable('1'))
  assert.equal(started, false)
  assert.equal(work.refused, 1)
  assert.equal(work.active, 6)
})

test('below the floor (the pool has a free connection) nobody is refused, even on a stalled database', async () => {
  const work = new DatabaseAdmission({ floor: 3, targetMs: 100, deadlineMs: 60_000 })
  for (let i = 0; i < 2; i++) work.run(frozen).catch(() => {})
  await sleep(200)
  const third = work.run(frozen)
  third.catch(() => {})
  assert.equal(work.active, 3)
  await assert.rejects(work.run(frozen), isUnavailable('1'))
})

test('once the database answers again, requests are admitted again', async () => {
  const work = new DatabaseAdmission({ floor: 2, targetMs: 200, deadlineMs: 60_000 })
  let thaw!: () => void
  const thawed = new Promise<void>((resolve) => (thaw = resolve))
  const held = Array.from({ length: 4 }, () => work.run(() => thawed))
  await sleep(300)
  await assert.rejects(work.run(async () => 'refused'), isUnavailable('1'))
  thaw()
  await Promise.all(held)
  assert.equal(await work.run(async () => 'served'), 'served')
  // The same backlog again, now finished within the window: admitted.
  assert.equal(await work.run(async () => 'served again'), 'served again')
})

test('an open-loop flood on a slow database: what waits stays near what the database finishes in the target, the rest is refused at once', async () => {
  // 2 connections, 20 ms a statement: 100 a second, 20 in the 200 ms target.
  // Requests arrive at 1,000 a second for a second: without the bound, 900 would queue.
  const db = new SimulatedDatabase(2)
  const work = new DatabaseAdmission({ floor: 2, targetMs: 200, deadlineMs: 60_000 })
  const answers: Array<Promise<string>> = []
  const end = performance.now() + 1000
  while (performance.now() < end) {
    answers.push(work.run(() => db.statement(20, 'row')).then(() => 'served', (err) => (isUnavailable('1')(err) ? 'refused' : 'other')))
    await sleep(1)
  }
  const outcomes = await Promise.all(answers)
  const served = outcomes.filter((o) => o === 'served').length
  const refused = outcomes.filter((o) => o === 'refused').length
  assert.equal(served + refused, outcomes.length)
  // Served: at most what the database finishes in the flood's second (2 × 1000 / 20) and what waited at
  // its end; every other arrival refused. (A busy machine sends fewer than 1,000: the bound follows them.)
  const finishable = 2 * (1000 / 20) + work.peak
  assert.ok(refused > 0 && refused >= outcomes.length - finishable, `${refused} of ${outcomes.length} refused, at most ${finishable} could be served`)
  // At most the target's arrivals (about 200) plus what the database finishes in it (20) ever waited.
  assert.ok(work.peak < 300, `peak ${work.peak}`)
})

test('work past its deadline is answered 503 with Retry-After: 5 within one sweep, and counts until it settles', async () => {
  const work = new DatabaseAdmission({ floor: 1, targetMs: 100, deadlineMs: 200 })
  let release!: () => void
  const gate = new Promise<void>((resolve) => (release = resolve))
  const started = performance.now()
  await assert.rejects(work.run(() => gate), isUnavailable('5'))
  const waited = performance.now() - started
  assert.ok(waited >= 200 && waited < 200 + SWEEP_MS + 100, `answered after ${waited.toFixed(0)} ms`)
  assert.equal(work.overdue, 1)
  // Abandoned, not cancelled: it is still the oldest work, and nothing finished since.
  assert.equal(work.active, 1)
  await assert.rejects(work.run(async () => 'no room'), isUnavailable('1'))
  release()
  await sleep(0)
  assert.equal(work.active, 0)
  assert.equal(await work.run(async () => 'room'), 'room')
  assert.equal(work.overdue, 1)
})

test('work that finishes in time is not answered twice', async () => {
  const work = new DatabaseAdmission({ floor: 10, targetMs: 1000, deadlineMs: 150 })
  const results = await Promise.allSettled(Array.from({ length: 10 }, (_, i) => work.run(async () => (await sleep(20 + i * 5), i))))
  assert.deepEqual(results.map((r) => r.status === 'fulfilled' && r.value), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
  await sleep(300)
  assert.equal(work.overdue, 0)
})
