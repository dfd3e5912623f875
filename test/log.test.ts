import assert from 'node:assert/strict'
import { test } from 'node:test'
import { batchedWriter, createLogger } from '../src/core/log.js'

test('lines logged within the delay reach the sink in one write, in order, once the delay has passed', (t) => {
  // The writer's timer runs on the test's clock: the delay passes when the test says, however busy the machine.
  t.mock.timers.enable({ apis: ['setTimeout'] })
  const DELAY_MS = 200
  const writes: string[] = []
  const out = batchedWriter((text) => void writes.push(text), DELAY_MS)
  const log = createLogger('info', out.write)
  log.info('first', { n: 1 })
  log.debug('below the level')
  t.mock.timers.tick(DELAY_MS - 1)
  log.warn('second')
  assert.equal(writes.length, 0)
  t.mock.timers.tick(1)
  assert.equal(writes.length, 1)
  const lines = writes[0]!.split('\n')
  assert.equal(lines.pop(), '')
  assert.deepEqual(
    lines.map((l) => JSON.parse(l).msg),
    ['first', 'second'],
  )
  t.mock.timers.tick(2 * DELAY_MS)
  assert.equal(writes.length, 1, 'nothing is written when nothing waits')
  log.info('third')
  t.mock.timers.tick(DELAY_MS - 1)
  assert.equal(writes.length, 1, 'a later line starts a new delay')
  t.mock.timers.tick(1)
  assert.equal(writes.length, 2)
})

test('64 KiB waiting are written at once; flush() writes what waits without waiting for the delay', () => {
  const writes: string[] = []
  const out = batchedWriter((text) => void writes.push(text), 1000)
  const line = `${'x'.repeat(1023)}\n`
  for (let i = 0; i < 64; i++) out.write(line)
  assert.equal(writes.length, 1)
  assert.equal(writes[0]!.length, 65536)
  out.write('last\n')
  out.flush()
  assert.deepEqual(writes.slice(1), ['last\n'])
  out.flush()
  assert.equal(writes.length, 2)
})

test(
  'with atomicBytes (workers sharing one pipe), each write is whole lines of at most that many bytes, counted in ' +
    'UTF-8; a longer line goes alone',
  () => {
    const writes: string[] = []
    const out = batchedWriter((text) => void writes.push(text), 1000, 100)
    const lines = ['a'.repeat(39), 'é'.repeat(30), 'b'.repeat(38), 'c'.repeat(150), 'd'.repeat(9)].map((l) => `${l}\n`)
    for (const line of lines) out.write(line)
    out.flush()
    assert.equal(writes.join(''), lines.join(''))
    // 40 + 61 bytes are over 100: the accented line (30 characters, 61 bytes) starts the next write, with the 39 bytes
    // after it; the long line alone.
    assert.deepEqual(writes, [lines[0], lines[1]! + lines[2], lines[3], lines[4]])
    for (const w of writes)
      assert.ok(w.endsWith('\n') && (Buffer.byteLength(w) <= 100 || w.split('\n').length === 2), JSON.stringify(w))
  },
)
