import assert from 'node:assert/strict'
import { test } from 'node:test'
import { BoundedMap } from '../src/core/lib/bounded-map.js'

// The one bounded map behind every per-instance cache.

test('holds at most max entries; a new key evicts the oldest, handing it to onEvict', () => {
  const evicted: Array<[string, number]> = []
  const map = new BoundedMap<string, number>(3, (k, v) => evicted.push([k, v]))
  for (const [i, k] of ['a', 'b', 'c', 'd', 'e'].entries()) map.set(k, i)
  assert.equal(map.size, 3)
  assert.deepEqual([...map.keys()], ['c', 'd', 'e'])
  assert.deepEqual(evicted, [
    ['a', 0],
    ['b', 1],
  ])
})

test('setting an existing key keeps its place and evicts nothing; refresh moves it last', () => {
  const map = new BoundedMap<string, number>(2)
  map.set('a', 1)
  map.set('b', 2)
  map.set('a', 3)
  assert.deepEqual(
    [...map],
    [
      ['a', 3],
      ['b', 2],
    ],
  )
  map.refresh('a')
  map.set('c', 4)
  assert.deepEqual(
    [...map],
    [
      ['a', 3],
      ['c', 4],
    ],
    'b, least recently used, left',
  )
  map.refresh('missing')
  assert.equal(map.size, 2)
})

test('an entry whose value is undefined is refreshed like any other', () => {
  const map = new BoundedMap<string, number | undefined>(2)
  map.set('a', undefined)
  map.set('b', 1)
  map.refresh('a')
  assert.deepEqual([...map.keys()], ['b', 'a'])
})

test('refuses a max that is not a positive integer', () => {
  for (const max of [0, -1, 1.5, Number.NaN]) assert.throws(() => new BoundedMap(max), RangeError)
})
