import assert from 'node:assert/strict'
import { after, test } from 'node:test'
import { connect } from '../src/core/db/connect.js'
import { classifyDatabaseError } from '../src/core/db/errors.js'
import { failureProblem } from '../src/core/http/database-problems.js'
import { createTestDatabase } from './helpers/server.js'

// What a request gets when PostgreSQL aborts its transaction to resolve a
// conflict with another (two writers locking the same rows in opposite
// orders): a retryable 503, not a 500, for a real deadlock error.

const url = await createTestDatabase()
const [one, two] = [
  connect(url, { max: 1, statementTimeoutMs: 10_000 }),
  connect(url, { max: 1, statementTimeoutMs: 10_000 }),
]
after(() => Promise.all([one.end({ timeout: 1 }), two.end({ timeout: 1 })]))

test(
  'a deadlock PostgreSQL breaks is a 503 database_unavailable with Retry-After: 1, which changed ' + 'nothing',
  async () => {
    const [a, b] = await one<Array<{ id: number }>>`
      INSERT INTO users (name, email)
      VALUES ('Deadlock A', 'deadlock.a@example.com'), ('Deadlock B', 'deadlock.b@example.com')
      RETURNING id`
    let bothLocked!: () => void
    let firstLocks = 0
    const locked = new Promise<void>((resolve) => (bothLocked = resolve))
    const lockInOrder = (sql: typeof one, first: number, second: number) =>
      sql.begin(async (tx) => {
        await tx`UPDATE users SET name = name || '.' WHERE id = ${first}`
        if (++firstLocks === 2) bothLocked()
        await locked
        await tx`UPDATE users SET name = name || '.' WHERE id = ${second}`
      })
    const outcomes = await Promise.allSettled([lockInOrder(one, a!.id, b!.id), lockInOrder(two, b!.id, a!.id)])
    const failed = outcomes.filter((o): o is PromiseRejectedResult => o.status === 'rejected')
    assert.equal(failed.length, 1, 'PostgreSQL aborts one of the two')
    assert.equal((failed[0]!.reason as { code?: string }).code, '40P01')
    assert.equal(classifyDatabaseError(failed[0]!.reason), 'deadlock')
    const problem = failureProblem(failed[0]!.reason)
    assert.equal(problem?.code, 'database_unavailable')
    assert.equal(problem?.options.headers?.['retry-after'], '1')
    // The aborted one changed nothing: each name carries exactly the two dots of the one that committed.
    const names = await one<
      Array<{ name: string }>
    >`SELECT name FROM users WHERE id IN (${a!.id}, ${b!.id}) ORDER BY id`
    assert.deepEqual(
      names.map((r) => r.name),
      ['Deadlock A.', 'Deadlock B.'],
    )
  },
)

test('the database layer classifies its errors, and the HTTP layer answers each with its 503 and Retry-After', () => {
  // 'code routine': the SQLSTATE and the server function that raised it (postgres.js gives both).
  const withCode = (text: string) => {
    const [code, routine] = text.split(' ')
    return Object.assign(new Error('from the driver'), { code, ...(routine ? { routine } : {}) })
  }
  const table = [
    ['ECONNREFUSED', 'unavailable', '5'],
    ['CONNECTION_CLOSED', 'unavailable', '5'],
    ['08006', 'unavailable', '5'],
    ['57P01', 'unavailable', '5'],
    ['57014', 'unavailable', '5'],
    ['53300', 'unavailable', '5'],
    ['25P03', 'unavailable', '5'],
    ['55000 CheckMyDatabase', 'unavailable', '5'],
    ['40P01', 'deadlock', '1'],
    ['40001', 'serialization', '1'],
  ] as const
  for (const [code, failure, retryAfter] of table) {
    assert.equal(classifyDatabaseError(withCode(code)), failure, code)
    const problem = failureProblem(withCode(code))
    assert.deepEqual(
      [problem?.code, problem?.options.headers?.['retry-after']],
      ['database_unavailable', retryAfter],
      code,
    )
  }
  // A unique violation is its resource's to answer; a plain error or a non-Error is nobody's: a 500.
  for (const err of [withCode('23505'), withCode('55000 LockAcquire'), new Error('bug'), 'thrown text']) {
    assert.equal(classifyDatabaseError(err), undefined)
    assert.equal(failureProblem(err), undefined)
  }
})
