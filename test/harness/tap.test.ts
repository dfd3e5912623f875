import assert from 'node:assert/strict'
import { test } from 'node:test'
import { parseTap } from './tap.js'

// What node:test's tap reporter printed for a file with nested suites, a skip, a failing todo and a diagnostic.
const NESTED = `TAP version 13
# Subtest: suite \\# one
    # Subtest: passes
    ok 1 - passes
      ---
      duration_ms: 0.6
      type: 'test'
      ...
    # p95 12 ms
    # Subtest: fails \\\\ back
    not ok 2 - fails \\\\ back
      ---
      duration_ms: 0.7
      failureType: 'testCodeFailure'
      error: |-
        Expected values to be strictly equal:
        # not a diagnostic
        1 !== 2
      ...
    # Subtest: skipped
    ok 3 - skipped # SKIP why
      ---
      duration_ms: 0.1
      ...
    # Subtest: todo fail
    not ok 4 - todo fail # TODO
      ---
      duration_ms: 0.1
      ...
    # Subtest: inner
        # Subtest: deep fail
        not ok 1 - deep fail
          ---
          duration_ms: 0.3
          ...
        1..1
    not ok 5 - inner
      ---
      failureType: 'subtestsFailed'
      ...
    1..5
not ok 1 - suite \\# one
  ---
  failureType: 'subtestsFailed'
  ...
# Subtest: top
ok 2 - top
  ---
  duration_ms: 3
  ...
# took 2 statements
1..2
# tests 6
# suites 2
# pass 2
# fail 2
# cancelled 0
# skipped 1
# todo 1
# duration_ms 3013.3
`

test('reads the summary, the failed tests through their suites, and the diagnostics with their tests', () => {
  const report = parseTap(NESTED)
  assert.deepEqual(report.counts, { tests: 6, pass: 2, fail: 2, cancelled: 0, skipped: 1, todo: 1 })
  assert.deepEqual(report.failures, ['suite # one > fails \\ back', 'suite # one > inner > deep fail'])
  assert.deepEqual(report.diagnostics, [
    { test: 'passes', text: 'p95 12 ms' },
    { test: 'top', text: 'took 2 statements' },
  ])
})

test('a suite whose own hook failed is named, though its tests passed', () => {
  const tap = [
    '# Subtest: suite',
    '    # Subtest: a',
    '    ok 1 - a',
    '    1..1',
    'not ok 1 - suite',
    '  ---',
    "  failureType: 'hookFailed'",
    '  ...',
    '1..1',
    '# tests 1',
    '# pass 1',
    '# fail 0',
  ].join('\n')
  assert.deepEqual(parseTap(tap).failures, ['suite'])
})

test('output cut off before its summary has no counts', () => {
  const cut = ['TAP version 13', '# Subtest: starts', 'ok 1 - starts', '  ---', '  ...', '# Subtest: hangs']
  const report = parseTap(cut.join('\n'))
  assert.equal(report.counts, undefined)
  assert.deepEqual(report.failures, [])
})
