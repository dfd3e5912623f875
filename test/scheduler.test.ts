import assert from 'node:assert/strict'
import { test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { createLogger } from '../src/core/log.js'
import { Scheduler, SchedulerStopped } from '../src/core/scheduler.js'

// Job.runAnew: the run a caller gets began after it asked, so what the
// run reads cannot predate the caller's reason to ask (src/events/stream-authority.ts).
// Job.runNow joins the run under way. Both on a scheduler never started: its
// timers wait for start, explicit runs do not.

/** A job whose runs are numbered and record when they started; its period is long enough never to come. */
function counted(ms: number) {
  const starts: number[] = []
  const scheduler = new Scheduler(createLogger('error', () => {}))
  const job = scheduler.add({
    name: 'counted',
    periodMs: 60_000,
    run: async () => {
      starts.push(performance.now())
      await sleep(ms)
      return starts.length
    },
  })
  return { scheduler, job, starts }
}

test('when idle, runAnew starts a run at once', async () => {
  const { job, starts } = counted(5)
  assert.equal(await job.runAnew(), 1)
  assert.equal(starts.length, 1)
})

test(
  'during a run, runAnew waits for a new one, which every caller meanwhile shares; runNow joins the one under ' + 'way',
  async () => {
    const { job, starts } = counted(30)
    const first = job.runNow()
    await sleep(5)
    const asked = performance.now()
    const [a, b, joined] = await Promise.all([job.runAnew(), job.runAnew(), job.runNow()])
    assert.equal(await first, 1)
    assert.equal(joined, 1)
    assert.deepEqual([a, b], [2, 2])
    assert.equal(starts.length, 2)
    assert.ok(starts[1]! >= asked)
  },
)

test('stop waits for the run under way; a run asked for meanwhile, and any after, is refused', async () => {
  const { scheduler, job, starts } = counted(20)
  const first = job.runNow()
  const anew = job.runAnew()
  await scheduler.stop(performance.now() + 10_000)
  assert.equal(await first, 1)
  await assert.rejects(anew, SchedulerStopped)
  await assert.rejects(job.runNow(), SchedulerStopped)
  assert.equal(starts.length, 1)
})

test('two jobs of one name are refused, as is a period that is not positive', () => {
  const scheduler = new Scheduler(createLogger('error', () => {}))
  scheduler.add({ name: 'x', periodMs: 10, run: async () => {} })
  assert.throws(() => scheduler.add({ name: 'x', periodMs: 10, run: async () => {} }), /two jobs are named x/)
  assert.throws(() => scheduler.add({ name: 'y', periodMs: 0, run: async () => {} }), /positive period/)
})

test('a failing job is logged with its name once per run of failures, and once when it works again', async () => {
  const lines: Array<Record<string, unknown>> = []
  const scheduler = new Scheduler(createLogger('info', (line) => void lines.push(JSON.parse(line))))
  let fail = true
  const job = scheduler.add({
    name: 'flaky',
    periodMs: 60_000,
    run: async () => {
      if (fail) throw new Error('boom')
    },
  })
  await assert.rejects(job.runNow(), /boom/)
  await assert.rejects(job.runNow(), /boom/)
  fail = false
  await job.runNow()
  assert.deepEqual(
    lines.map((l) => [l.level, l.msg, l.job]),
    [
      ['warn', 'background job failed; it runs again every period', 'flaky'],
      ['info', 'background job works again', 'flaky'],
    ],
  )
})
