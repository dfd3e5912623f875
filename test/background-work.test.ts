import assert from 'node:assert/strict'
import { test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { BackgroundWork } from '../src/core/background-work.js'
import { createLogger } from '../src/core/log.js'
import { waitUntil } from './helpers/wait.js'

// The bound and the stop of work a request does not wait for
// (src/core/background-work.ts); through the API in test/account-recovery.test.ts.

function setUp(concurrency: number, capacity: number) {
  const lines: Array<Record<string, unknown>> = []
  const log = createLogger('debug', (text) => {
    for (const line of text.split('\n')) if (line) lines.push(JSON.parse(line) as Record<string, unknown>)
  })
  return { work: new BackgroundWork('test-work', log, { concurrency, capacity }), lines }
}

/** A piece of work that ends when `finish` is called, and counts how many run at once. */
function gated(counter: { now: number; most: number }) {
  let finish: () => void = () => {}
  const done = new Promise<void>((resolve) => (finish = resolve))
  const run = async () => {
    counter.most = Math.max(counter.most, ++counter.now)
    await done
    counter.now--
  }
  return { run, finish: () => finish() }
}

test('runs `concurrency` at a time, holds `capacity` at most, and takes more as the held work ends', async () => {
  const { work } = setUp(2, 3)
  const counter = { now: 0, most: 0 }
  const pieces = [gated(counter), gated(counter), gated(counter), gated(counter)]
  assert.deepEqual(
    pieces.map((p) => work.submit('piece', p.run)),
    [true, true, true, false],
  )
  await waitUntil('two pieces running', () => counter.now === 2, 2000)
  await sleep(20)
  assert.equal(counter.now, 2, 'no third piece started')
  pieces[0]!.finish()
  await waitUntil('the first piece done', () => work.held === 2, 2000)
  await waitUntil('the waiting piece started in the freed place', () => counter.now === 2, 2000)
  assert.equal(work.submit('piece', pieces[3]!.run), true)
  for (const p of pieces) p.finish()
  await waitUntil('every piece done', () => work.held === 0, 2000)
  assert.equal(counter.most, 2)
})

test(
  "a failure is logged with the work's name and the error's message, never what the work was given; the next " +
    'piece runs',
  async () => {
    const { work, lines } = setUp(1, 10)
    const secret = 'person@example.com'
    let ran = false
    work.submit('password reset', () => Promise.reject(new Error('connection refused')))
    work.submit('password reset', async () => void (ran = secret.length > 0))
    await waitUntil(
      'the second piece ran and the failure was logged',
      () => ran && lines.some((l) => l.msg === 'background work failed'),
      2000,
    )
    const failed = lines.filter((l) => l.msg === 'background work failed')
    assert.equal(failed.length, 1)
    assert.equal(failed[0]!.component, 'test-work')
    assert.equal(failed[0]!.work, 'password reset')
    assert.equal(failed[0]!.error_message, 'connection refused')
    assert.ok(!JSON.stringify(lines).includes(secret))
  },
)

test(
  'stop takes nothing new, waits for the held work, and drops what is left at the deadline with a log ' + 'line',
  async () => {
    const { work } = setUp(1, 10)
    const counter = { now: 0, most: 0 }
    const [first, second] = [gated(counter), gated(counter)]
    work.submit('piece', first.run)
    work.submit('piece', second.run)
    const stopped = work.stop(performance.now() + 5000)
    assert.equal(
      work.submit('piece', async () => {}),
      false,
      'nothing new once stopping',
    )
    setTimeout(() => first.finish(), 20)
    setTimeout(() => second.finish(), 40)
    await stopped
    assert.equal(work.held, 0)
    assert.equal(counter.most, 1)

    const late = setUp(1, 10)
    const stuck = gated(counter)
    late.work.submit('piece', stuck.run)
    late.work.submit('piece', async () => {})
    await waitUntil('the stuck piece running', () => counter.now === 1, 2000)
    await late.work.stop(performance.now() + 30)
    await waitUntil(
      'the drop logged',
      () => late.lines.some((l) => l.msg === 'background work dropped at shutdown'),
      2000,
    )
    const dropped = late.lines.find((l) => l.msg === 'background work dropped at shutdown')
    assert.deepEqual({ running: dropped?.running, waiting: dropped?.waiting }, { running: 1, waiting: 1 })
    stuck.finish()
  },
)
