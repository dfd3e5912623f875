import assert from 'node:assert/strict'
import { test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { DatabaseWork, SWEEP_MS } from '../src/db/admission.js'
import { HttpError } from '../src/http/problem.js'

// The bound on waiting for the database, as a unit: the fault tests
// (test/fault-pool.test.ts, test/fault-db-outage.test.ts) show it against a
// real pool and a frozen server.

const isUnavailable = (retryAfter: string) => (err: unknown) =>
  err instanceof HttpError && err.status === 503 && err.code === 'database_unavailable' && err.options.headers?.['retry-after'] === retryAfter

test('work within the bound runs and gives its value or its error', async () => {
  const work = new DatabaseWork(2, 1000)
  assert.equal(await work.run(async () => 42), 42)
  await assert.rejects(work.run(async () => { throw new Error('boom') }), /boom/)
  await assert.rejects(work.run(() => { throw new Error('sync boom') }), /sync boom/)
  assert.equal(work.active, 0)
})

test('past the bound, work is refused at once with 503 and Retry-After: 1, and never started', async () => {
  const work = new DatabaseWork(2, 1000)
  let release!: () => void
  const gate = new Promise<void>((resolve) => (release = resolve))
  const held = [work.run(() => gate), work.run(() => gate)]
  let started = false
  await assert.rejects(work.run(async () => void (started = true)), isUnavailable('1'))
  assert.equal(started, false)
  assert.equal(work.refused, 1)
  release()
  await Promise.all(held)
  assert.equal(await work.run(async () => 'room again'), 'room again')
  assert.equal(work.peak, 2)
})

test('work past its deadline is answered 503 with Retry-After: 5 within one sweep, and keeps its place until it settles', async () => {
  const work = new DatabaseWork(1, 200)
  let release!: () => void
  const gate = new Promise<void>((resolve) => (release = resolve))
  const started = performance.now()
  await assert.rejects(work.run(() => gate), isUnavailable('5'))
  const waited = performance.now() - started
  assert.ok(waited >= 200 && waited < 200 + SWEEP_MS + 100, `answered after ${waited.toFixed(0)} ms`)
  assert.equal(work.overdue, 1)
  // Abandoned, not cancelled: it still counts against the bound.
  await assert.rejects(work.run(async () => 'no room'), isUnavailable('1'))
  release()
  await sleep(0)
  assert.equal(work.active, 0)
  assert.equal(await work.run(async () => 'room'), 'room')
})

test('work that finishes in time is not answered twice', async () => {
  const work = new DatabaseWork(10, 150)
  const results = await Promise.allSettled(Array.from({ length: 10 }, (_, i) => work.run(async () => (await sleep(20 + i * 5), i))))
  assert.deepEqual(results.map((r) => r.status === 'fulfilled' && r.value), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
  await sleep(300)
  assert.equal(work.overdue, 0)
})
