import assert from 'node:assert/strict'
import { after, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { DatabaseAdmission, DatabaseBusy, SWEEP_MS } from '../src/core/db/admission.js'
import { busyProblem } from '../src/core/http/database-problems.js'
import { withLoopLag } from './fault-kit.js'
import { waitUntil } from './helpers/wait.js'

// Database admission, as a unit, with a simulated
// database: `connections` statements at a time, each `serviceMs`, the rest
// queued first in, first out (as postgres.js queues them). The fault tests
// (test/fault-pool.test.ts, test/helpers/db-outage.ts) show the bound
// against a real pool and a frozen server; how long requests wait against the
// target, and how many are refused, with many more clients than connections
// is a figure of `make bench-faults` (bench/faults/admission.ts).

/** A DatabaseBusy, answered 503 database_unavailable with this Retry-After. */
const isUnavailable = (retryAfter: string) => (err: unknown) => {
  if (!(err instanceof DatabaseBusy)) return false
  const problem = busyProblem(err)
  return problem.code === 'database_unavailable' && problem.options.headers?.['retry-after'] === retryAfter
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
async function closedLoop(
  work: DatabaseAdmission,
  clients: number,
  durationMs: number,
  request: () => Promise<unknown>,
) {
  const end = performance.now() + durationMs
  let served = 0
  let refused = 0
  let longest = 0
  const servedPerClient = new Array<number>(clients).fill(0)
  await Promise.all(
    Array.from({ length: clients }, async (_, client) => {
      while (performance.now() < end) {
        const started = performance.now()
        try {
          await work.run(request)
          served++
          servedPerClient[client]!++
        } catch (err) {
          if (!isUnavailable('1')(err)) throw err
          refused++
          await sleep(1)
        }
        longest = Math.max(longest, performance.now() - started)
      }
    }),
  )
  return { served, refused, longest, leastServed: Math.min(...servedPerClient) }
}

// Work on a frozen database: it settles only when the test file ends (the
// sweep that enforces deadlines runs while any work is unsettled).
const thawAll: Array<() => void> = []
const frozen = () => new Promise<void>((resolve) => thawAll.push(resolve))
after(() => thawAll.forEach((thaw) => thaw()))

test('work gives its value or its error', async () => {
  const work = new DatabaseAdmission({ floor: 2, targetMs: 200, deadlineMs: 1000 })
  assert.equal(await work.run(async () => 42), 42)
  await assert.rejects(
    work.run(async () => {
      throw new Error('boom')
    }),
    /boom/,
  )
  await assert.rejects(
    work.run(() => {
      throw new Error('sync boom')
    }),
    /sync boom/,
  )
  assert.equal(work.active, 0)
  assert.equal(work.finished, 3)
})

test(
  'many times more clients than connections is no reason to refuse: on a database that keeps up, every client is ' +
    'served and nobody refused',
  async () => {
    // 10 connections, 4 ms a statement, 200 clients: each request queues behind 19 others. How long that
    // is depends on the machine (the simulated statements are timers), so the target is set from the
    // longest wait the same load shows first with nothing refused, five times over: the wait stays within
    // the target because the database keeps up, not because this machine is quick.
    const db = new SimulatedDatabase(10)
    const unbounded = new DatabaseAdmission({ floor: 10, targetMs: 60_000, deadlineMs: 60_000 })
    const alone = await closedLoop(unbounded, 200, 300, () => db.statement(4, 'row'))
    const work = new DatabaseAdmission({ floor: 10, targetMs: 5 * alone.longest, deadlineMs: 60_000 })
    const result = await closedLoop(work, 200, 600, () => db.statement(4, 'row'))
    assert.equal(result.refused, 0, JSON.stringify({ alone, result }))
    assert.ok(result.leastServed >= 1, `every client served: ${JSON.stringify(result)}`)
    assert.ok(work.peak >= 190, `peak ${work.peak}: nearly all 200 waited at once`)
  },
)

test('one slow statement among fast ones refuses nobody, though it is the oldest past the target', async () => {
  // A target of 300 ms, far above the fast statements' wait (a few ms), so that an event loop held up
  // for a while on a busy machine does not pass for a database that stopped keeping up.
  const db = new SimulatedDatabase(10)
  const work = new DatabaseAdmission({ floor: 10, targetMs: 300, deadlineMs: 5000 })
  const slow = work.run(() => sleep(800, 'report'))
  const result = await closedLoop(work, 30, 700, () => db.statement(2, 'row'))
  assert.equal(await slow, 'report')
  assert.equal(result.refused, 0, JSON.stringify(result))
  assert.equal(work.refused, 0)
})

test(
  'a frozen database: newcomers are admitted until the oldest has waited the target, then refused at once, never ' +
    'started',
  async () => {
    const targetMs = 300
    const work = new DatabaseAdmission({ floor: 2, targetMs, deadlineMs: 60_000 })
    const heldAt = performance.now()
    const held = Array.from({ length: 5 }, () => work.run(frozen))
    for (const h of held) h.catch(() => {})
    // Within the target: still admitted (a burst after a quiet spell is not a failure).
    const early = work.run(frozen)
    early.catch(() => {})
    assert.ok(performance.now() - heldAt < targetMs, 'the newcomer came within the target')
    assert.equal(work.active, 6)
    await waitUntil('the oldest to have waited the target', () => performance.now() - heldAt > targetMs)
    let started = false
    // At once: refused before the event loop turns (a bound in milliseconds
    // fails on a busy machine, not on a wrong rule).
    const refusal = work.run(async () => void (started = true))
    const first = await Promise.race([
      refusal.then(
        () => 'ran',
        () => 'refused',
      ),
      new Promise((resolve) => setImmediate(() => resolve('waited'))),
    ])
    assert.equal(first, 'refused')
    await assert.rejects(refusal, isUnavailable('1'))
    assert.equal(started, false)
    assert.equal(work.refused, 1)
    assert.equal(work.active, 6)
  },
)

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
  await assert.rejects(
    work.run(async () => 'refused'),
    isUnavailable('1'),
  )
  thaw()
  await Promise.all(held)
  assert.equal(await work.run(async () => 'served'), 'served')
  // The same backlog again, now finished within the window: admitted.
  assert.equal(await work.run(async () => 'served again'), 'served again')
})

test(
  'an open-loop flood on a slow database: what waits stays near what the database finishes in the target, the ' +
    'rest is refused at once',
  async () => {
    // 2 connections, 20 ms a statement: 100 a second, 20 in the 200 ms target.
    // Requests arrive at up to 1,000 a second for 0.6 s: without the bound, 540 would queue.
    const db = new SimulatedDatabase(2)
    const work = new DatabaseAdmission({ floor: 2, targetMs: 200, deadlineMs: 60_000 })
    const answers: Array<Promise<string>> = []
    const floodMs = 600
    const end = performance.now() + floodMs
    while (performance.now() < end) {
      answers.push(
        work
          .run(() => db.statement(20, 'row'))
          .then(
            () => 'served',
            (err) => (isUnavailable('1')(err) ? 'refused' : 'other'),
          ),
      )
      await sleep(1)
    }
    const outcomes = await Promise.all(answers)
    const served = outcomes.filter((o) => o === 'served').length
    const refused = outcomes.filter((o) => o === 'refused').length
    assert.equal(served + refused, outcomes.length)
    // Served: at most what the database finishes during the flood (2 every 20 ms) and what waited at its
    // end; every other arrival refused. (A busy machine sends fewer: the bound follows them.)
    const finishable = 2 * (floodMs / 20) + work.peak
    assert.ok(
      refused > 0 && refused >= outcomes.length - finishable,
      `${refused} of ${outcomes.length} refused, at most ${finishable} could be served`,
    )
    // At most the target's arrivals (one a millisecond at most: 200) plus what the database finishes in it (20)
    // ever waited.
    assert.ok(work.peak < 300, `peak ${work.peak}`)
  },
)

test(
  'work past its deadline is answered 503 with Retry-After: 5 within one sweep, and counts until it ' + 'settles',
  async () => {
    const deadlineMs = 200
    const work = new DatabaseAdmission({ floor: 1, targetMs: 100, deadlineMs })
    let release!: () => void
    const gate = new Promise<void>((resolve) => (release = resolve))
    const started = performance.now()
    // The sweep is a timer: it runs as late as the event loop is held up, measured meanwhile.
    const { lagMs } = await withLoopLag(() =>
      assert.rejects(
        work.run(() => gate),
        isUnavailable('5'),
      ),
    )
    const waited = performance.now() - started
    assert.ok(waited >= deadlineMs, `answered after ${waited.toFixed(0)} ms, before the deadline`)
    const bound = deadlineMs + SWEEP_MS + 2 * lagMs + 50
    assert.ok(waited < bound, `answered after ${waited.toFixed(0)} ms, the loop held up at most ${lagMs.toFixed(0)} ms`)
    assert.equal(work.overdue, 1)
    // Abandoned, not cancelled: it is still the oldest work, and nothing finished since.
    assert.equal(work.active, 1)
    await assert.rejects(
      work.run(async () => 'no room'),
      isUnavailable('1'),
    )
    release()
    await sleep(0)
    assert.equal(work.active, 0)
    assert.equal(await work.run(async () => 'room'), 'room')
    assert.equal(work.overdue, 1)
  },
)

test(
  'work that finishes in time is not answered twice: the sweep that finds overdue work passes over what ' + 'settled',
  async () => {
    const deadlineMs = 200
    const work = new DatabaseAdmission({ floor: 10, targetMs: 1000, deadlineMs })
    let release!: () => void
    const gate = new Promise<void>((resolve) => (release = resolve))
    // One held past the deadline keeps the sweep running; the others settle at once, before any sweep.
    const held = work.run(() => gate)
    const quick = await Promise.allSettled(Array.from({ length: 9 }, (_, i) => work.run(async () => i)))
    assert.deepEqual(
      quick.map((r) => r.status === 'fulfilled' && r.value),
      [0, 1, 2, 3, 4, 5, 6, 7, 8],
    )
    await assert.rejects(held, isUnavailable('5'))
    // Sweeps after the deadline: only the held work was ever overdue.
    const sweptAt = performance.now()
    await waitUntil('two more sweeps', () => performance.now() - sweptAt > 2 * SWEEP_MS)
    assert.equal(work.overdue, 1)
    release()
  },
)

test("work with its own deadline (a batch's) keeps it; work begun after it still meets the service's", async () => {
  const work = new DatabaseAdmission({ floor: 10, targetMs: 1000, deadlineMs: 100 })
  let release!: () => void
  const gate = new Promise<string>((resolve) => (release = () => resolve('done')))
  let longOutcome = 'running'
  const long = work
    .run(() => gate, 60_000)
    .then(
      (value) => (longOutcome = value),
      () => (longOutcome = 'answered 503'),
    )
  await assert.rejects(
    work.run(() => gate),
    (err) => err instanceof DatabaseBusy && err.reason === 'overdue' && err.deadlineMs === 100,
  )
  assert.equal(longOutcome, 'running', 'the older work with the longer deadline was not answered with it')
  release()
  await long
  assert.equal(longOutcome, 'done')
  assert.equal(work.overdue, 1)
})

test('work of a longer deadline (a batch) past the target refuses nobody until it is as many times late', async () => {
  const work = new DatabaseAdmission({ floor: 1, targetMs: 100, deadlineMs: 1000 })
  let release!: () => void
  const gate = new Promise<void>((resolve) => (release = resolve))
  const batch = work.run(() => gate, 10_000)
  await sleep(150)
  // Past the target, but a tenth of its own: a request alone still waits for nothing the database is not working off.
  assert.equal(await work.run(async () => 'admitted'), 'admitted')
  assert.equal(work.refused, 0)
  release()
  await batch
})
