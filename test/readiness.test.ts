import assert from 'node:assert/strict'
import { test } from 'node:test'
import { READINESS_TTL_MS } from '../src/health/readiness.js'
import { startServer } from './helpers/server.js'

// /readyz is public and exempt from the rate limit, so its database check
// is shared for a second (src/health/readiness.ts): a flood of it costs at
// most a query a second, counted here by the service's own
// db_queries_total. Draining is never cached: it shows at once.

const api = await startServer()

async function queriesSoFar(): Promise<number> {
  const scrape = await api.request('GET', '/metrics')
  assert.equal(scrape.status, 200)
  return Number(/^db_queries_total (\d+)$/m.exec(scrape.text)![1])
}

async function flood(n: number): Promise<number[]> {
  return (await Promise.all(Array.from({ length: n }, () => api.request('GET', '/readyz', { auth: null })))).map(
    (r) => r.status,
  )
}

test('100 concurrent /readyz cost one query, not 100; a second later the database is asked again', async () => {
  const before = await queriesSoFar()
  assert.deepEqual(await flood(100), Array(100).fill(200))
  const afterFirst = await queriesSoFar()
  // One query for the flood; the margin is for the service's own background statements, never a hundred.
  assert.ok(
    afterFirst - before >= 1 && afterFirst - before <= 5,
    `db_queries_total ${before} → ${afterFirst} for 100 /readyz`,
  )

  // The service's clock, which the test moves (src/core/lib/clock.ts), not a second of waiting.
  api.clock.advance(READINESS_TTL_MS)
  assert.deepEqual(await flood(100), Array(100).fill(200))
  const afterSecond = await queriesSoFar()
  assert.ok(
    afterSecond - afterFirst >= 1 && afterSecond - afterFirst <= 5,
    `db_queries_total ${afterFirst} → ${afterSecond}: asked again once the answer is a second old`,
  )
})

test('draining turns /readyz 503 at once, within the second its database answer is kept', async () => {
  assert.equal((await api.request('GET', '/readyz', { auth: null })).status, 200)
  api.deps.stopping.draining = true
  try {
    const draining = await api.request('GET', '/readyz', { auth: null })
    assert.equal(draining.status, 503)
    assert.equal(draining.body.code, 'shutting_down')
    assert.equal(draining.headers.get('retry-after'), '1')
  } finally {
    api.deps.stopping.draining = false
  }
})
