import assert from 'node:assert/strict'
import { after, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { WAIT_TARGET_MS } from '../src/db/admission.js'
import { connect } from '../src/db/connect.js'
import { call, holdRowLock, percentile, settledHeap, startLoad, summarize, type Outcome } from './fault-kit.js'
import { startServer } from './helpers/server.js'

// The pool exhausted by slow statements (writers queued on a row lock this
// test holds, each cancelled by STATEMENT_TIMEOUT), under an open-loop flood
// of reads that arrive whatever the answers: postgres.js would queue them
// without limit; the service must answer past its bound at once with 503
// database_unavailable and Retry-After, bound the wait of the others, and
// keep its memory flat. Then the 50-way races on one row and one e-mail.

const POOL = 2
const api = await startServer({ DATABASE_POOL_MAX: String(POOL), STATEMENT_TIMEOUT: '1', LOG_LEVEL: 'error' })
const fresh = await startServer()
const locker = connect(api.databaseUrl, { max: 1, statementTimeoutMs: 60_000 })
after(() => locker.end({ timeout: 1 }))
const ms = (x: number) => `${Math.round(x)} ms`
const MB = (x: number) => `${(x / 1048576).toFixed(1)} MB`

describe('pool exhausted by slow statements', () => {
  test(`an open-loop flood of reads while every connection is held: once requests have waited ${WAIT_TARGET_MS} ms on a database that is not keeping up, the rest get 503 at once; every wait is bounded, memory stays flat`, async (t) => {
    const token = api.admin.token
    const held = await api.createUser({ name: 'Held' })
    const readable = await api.createUser({ name: 'Readable' })
    const work = api.deps.databaseWork
    assert.equal(work.targetMs, WAIT_TARGET_MS)

    const lock = await holdRowLock(locker, 'users', held.id)

    // Slow statements: writers wait on the lock until STATEMENT_TIMEOUT cancels them, again and again.
    const writers = startLoad(4, (client, seq) => call(api.url, 'PATCH', `/users/${held.id}`, { token, client, seq, what: 'slow write', body: { name: `w${client}.${seq}` } }))
    // The flood: 4 reads every 5 ms, each sent without waiting for any answer.
    // Only a compact record of each answer is kept, so that the heap figures
    // are the service's, not this client's.
    const compact = (o: Outcome): Outcome => ({ ...o, body: o.body?.detail ? { detail: /not keeping up/.test(o.body.detail) ? 'not keeping up' : '' } : undefined })
    let pending = 0
    let maxPending = 0
    const heap: number[] = []
    async function flood(durationMs: number, sampleHeap: boolean): Promise<Outcome[]> {
      const reads: Array<Promise<Outcome>> = []
      const started = performance.now()
      let seq = 0
      while (performance.now() - started < durationMs) {
        for (let i = 0; i < 4; i++) {
          pending++
          maxPending = Math.max(maxPending, pending)
          reads.push(call(api.url, 'GET', `/users/${readable.id}`, { token, seq: seq++, what: 'read', timeoutMs: 20_000 }).then(compact).finally(() => void pending--))
        }
        await sleep(5)
        if (sampleHeap && seq % 200 === 0) heap.push(await settledHeap())
      }
      return Promise.all(reads)
    }
    let outcomes: Outcome[] = []
    let slow: Outcome[] = []
    let baseline = 0
    let after = 0
    try {
      // A first second of it warms everything up (compiled code, sockets); then the baseline.
      await flood(1000, false)
      baseline = await settledHeap()
      outcomes = await flood(4000, true)
      after = await settledHeap()
    } finally {
      lock.release()
      await lock.done
      slow = await writers.stop()
    }
    const flooded = outcomes

    const refusedAtOnce = flooded.filter((o) => o.status === 503 && /not keeping up/.test(o.body?.detail ?? ''))
    const served = flooded.filter((o) => o.status === 200)
    // What may wait at once: what arrives before the oldest has waited the target, plus what the database finishes meanwhile.
    const arrivalsPerS = flooded.length / 4
    const limit = Math.ceil(arrivalsPerS * (WAIT_TARGET_MS / 1000) * 1.5) + 50
    const refusedMs = refusedAtOnce.map((o) => o.ended - o.started)
    const servedMs = served.map((o) => o.ended - o.started)
    t.diagnostic(
      `${flooded.length} reads in 4 s with ${POOL} connections held by lock waits: ${JSON.stringify(summarize(flooded))}; ` +
        `refused at once p50 ${ms(percentile(refusedMs, 50))} max ${ms(Math.max(...refusedMs))}; served p50 ${ms(percentile(servedMs, 50))} max ${ms(Math.max(...servedMs))}; ` +
        `waiting at most ${work.peak} (bound ${limit}), answers outstanding at most ${maxPending}; slow writes ${JSON.stringify(summarize(slow))}; ` +
        `heap ${MB(baseline)} before, ${MB(Math.min(...heap))}–${MB(Math.max(...heap))} during, ${MB(after)} after (the flood's records still held)`,
    )

    // Every answer is a success or a 503 database_unavailable with Retry-After; nothing hung.
    for (const o of [...flooded, ...slow]) {
      assert.ok(o.status === 200 || (o.status === 503 && o.code === 'database_unavailable' && o.retryAfter), `${o.what}: ${o.error ?? `${o.status} ${o.code}`}`)
    }
    // The bound held and was reached; past it, the answer came at once.
    assert.ok(work.peak <= limit, `peak ${work.peak} > ${limit}`)
    assert.ok(refusedAtOnce.length > 0, 'once the oldest has waited the target, newcomers are refused at once')
    assert.ok(served.length > 10, `${served.length} served`)
    assert.ok(percentile(refusedMs, 99) < 250, `refusals p99 ${ms(percentile(refusedMs, 99))}`)
    // A served read was admitted before the oldest had waited the target, and then waited at most for the statement ahead of it (cancelled after STATEMENT_TIMEOUT).
    assert.ok(Math.max(...servedMs) < WAIT_TARGET_MS + 2000, `a read waited ${ms(Math.max(...servedMs))}`)
    assert.ok(maxPending < limit + 50, `${maxPending} answers outstanding at once`)
    // The slow writes were cancelled by the statement time-out (503), none waited past a few seconds.
    assert.ok(slow.some((o) => o.status === 503))
    assert.ok(Math.max(...slow.map((o) => o.ended - o.started)) < 4000)
    // Memory: bounded during the flood (by the answers outstanding, a few hundred, whose client and server
    // sides both live in this process), back to the baseline after.
    assert.ok(Math.max(...heap) - baseline < 20 * 1048576, `heap rose by ${MB(Math.max(...heap) - baseline)}`)
    assert.ok(after - baseline < 5 * 1048576, `heap grew by ${MB(after - baseline)}`)
    assert.equal(work.active, 0)
    // And the service answers normally again.
    assert.equal((await call(api.url, 'GET', `/users/${readable.id}`, { token })).status, 200)
  })
})

describe('races', () => {
  let serial = 0

  test('50 concurrent updates of one row with the same If-Match: exactly one 200, 49 × 412, one new version', async () => {
    const created = await fresh.request('POST', '/users', { body: { name: 'Race', email: `race.${++serial}@example.com` } })
    const etag = created.headers.get('etag')!
    const results = await Promise.all(Array.from({ length: 50 }, (_, i) => fresh.request('PATCH', `/users/${created.body.id}`, { body: { name: `Racer ${i}` }, headers: { 'if-match': etag } })))
    const statuses = results.map((r) => r.status).sort()
    assert.deepEqual(summarize(results.map((r) => ({ status: r.status, code: r.body?.code }) as Outcome)), { 200: 1, '412 precondition_failed': 49 })
    assert.equal(statuses.length, 50)
    const winner = results.find((r) => r.status === 200)!
    const [row] = await fresh.sql<[{ name: string; version: number }]>`SELECT name, version FROM users WHERE id = ${created.body.id}`
    assert.deepEqual({ ...row }, { name: winner.body.name, version: 2 })
  })

  test('50 concurrent creations with one e-mail: exactly one 201, 49 × 409 email_taken, one row', async () => {
    const email = `same.${++serial}@example.com`
    const results = await Promise.all(Array.from({ length: 50 }, (_, i) => fresh.request('POST', '/users', { body: { name: `Twin ${i}`, email } })))
    assert.deepEqual(summarize(results.map((r) => ({ status: r.status, code: r.body?.code }) as Outcome)), { 201: 1, '409 email_taken': 49 })
    const [{ n }] = await fresh.sql<[{ n: number }]>`SELECT count(*)::int AS n FROM users WHERE lower(email) = ${email}`
    assert.equal(n, 1)
  })
})
