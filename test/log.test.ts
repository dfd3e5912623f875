import assert from 'node:assert/strict'
import { test } from 'node:test'
import { setImmediate as nextTurn } from 'node:timers/promises'
import { batchedWriter, createLogger } from '../src/log.js'

test('lines logged in one turn of the event loop reach the sink in one write, in order, at the end of that turn', async () => {
  const writes: string[] = []
  const out = batchedWriter((text) => void writes.push(text))
  const log = createLogger('info', out.write)
  log.info('first', { n: 1 })
  log.debug('below the level')
  log.warn('second')
  assert.equal(writes.length, 0)
  await nextTurn()
  assert.equal(writes.length, 1)
  const lines = writes[0]!.split('\n')
  assert.equal(lines.pop(), '')
  assert.deepEqual(lines.map((l) => JSON.parse(l).msg), ['first', 'second'])
  await nextTurn()
  assert.equal(writes.length, 1, 'nothing is written when nothing waits')
})

test('64 KiB waiting are written at once; flush() writes what waits without waiting for the turn', () => {
  const writes: string[] = []
  const out = batchedWriter((text) => void writes.push(text))
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
