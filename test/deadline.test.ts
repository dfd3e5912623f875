import assert from 'node:assert/strict'
import { test } from 'node:test'
import { settledBy, withDeadline } from '../src/core/lib/settled-by.js'

// The one race against a deadline (src/core/lib/settled-by.ts): the work's
// value when it comes first, the late answer otherwise, and no timer left behind.

const never = new Promise<string>(() => {})
const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length

test("the work's value when it settles first; its rejection too", async () => {
  const before = timers()
  assert.equal(await withDeadline(Promise.resolve('done'), 60_000, () => 'late'), 'done')
  await assert.rejects(
    withDeadline(Promise.reject(new Error('failed')), 60_000, () => 'late'),
    /failed/,
  )
  assert.equal(timers(), before, "the deadline's timer outlived the race")
})

test('the late answer when the deadline passes first; a late that throws rejects', async () => {
  assert.equal(await withDeadline(never, 0, () => 'late'), 'late')
  await assert.rejects(
    withDeadline(never, 0, () => {
      throw new Error('no answer in time')
    }),
    /no answer in time/,
  )
})

test('settledBy never rejects, and returns at the deadline when the work has not settled', async () => {
  await settledBy(Promise.reject(new Error('ignored')), performance.now() + 60_000)
  await settledBy(never, performance.now())
})
