import assert from 'node:assert/strict'
import { test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { Periodic } from '../src/core/lib/periodic.js'

// Periodic.runAnew: the run a caller gets began after it asked, so what the
// run reads cannot predate the caller's reason to ask (src/events/stream-authority.ts).

/** Work whose runs are numbered and record when they started. */
function counted(ms: number) {
  const starts: number[] = []
  const periodic = new Periodic(async () => {
    starts.push(performance.now())
    await sleep(ms)
    return starts.length
  }, 60_000)
  return { periodic, starts }
}

test('when idle, runAnew starts a run at once', async () => {
  const { periodic, starts } = counted(5)
  assert.equal(await periodic.runAnew(), 1)
  assert.equal(starts.length, 1)
})

test('during a run, runAnew waits for a new one, which every caller meanwhile shares; runNow joins the one under way', async () => {
  const { periodic, starts } = counted(30)
  const first = periodic.runNow()
  await sleep(5)
  const asked = performance.now()
  const [a, b, joined] = await Promise.all([periodic.runAnew(), periodic.runAnew(), periodic.runNow()])
  assert.equal(await first, 1)
  assert.equal(joined, 1)
  assert.deepEqual([a, b], [2, 2])
  assert.equal(starts.length, 2)
  assert.ok(starts[1]! >= asked)
})

test('stop waits for a run asked for during the one under way', async () => {
  const { periodic, starts } = counted(20)
  void periodic.runNow()
  const anew = periodic.runAnew()
  await periodic.stop()
  assert.equal(starts.length, 2)
  assert.equal(await anew, 2)
})
