import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Sql } from 'postgres'
import { testPasswords } from './helpers/passwords.js'
import { hashSecret } from '../src/auth/tokens.js'
import { DEADLINE_GRACE_MS } from '../src/core/db/admission.js'
import { connect } from '../src/core/db/connect.js'
import { READINESS_TTL_MS } from '../src/health/readiness.js'
import { adminToken, call, OwnCluster, percentile, spawnService, startLoad, summarize, waitFor, type Outcome, type Spawned } from './fault-kit.js'

// The database goes away under load, for real: this file's own PostgreSQL
// cluster is stopped (fast: a clean shutdown that aborts open transactions;
// immediate: a crash), restarted, and frozen (SIGSTOP: a server that accepts
// connections and never answers). The service is the real process
// (`node --import tsx src/main.ts`). What it must do: answer 503
// database_unavailable within a bounded time, never hang or 500, keep
// /healthz at 200 and /readyz at 503 while the database is down, commit every
// write it acknowledged and no part of one it did not, and serve again by
// itself once the database is back. The figures measured are printed
// (t.diagnostic) for docs/operations.md.

const STATEMENT_TIMEOUT = 1
/** src/core/db/admission.ts: a request to the API whose database stage has not finished by then gets a 503. */
const DEADLINE_MS = STATEMENT_TIMEOUT * 1000 + DEADLINE_GRACE_MS

let cluster: OwnCluster
let service: Spawned
let db: Sql
let token: string
const seeded: number[] = []

before(async () => {
  cluster = await OwnCluster.create()
  const { url, adminId } = await cluster.createDatabase()
  token = adminToken(adminId)
  service = await spawnService({ DATABASE_URL: url, STATEMENT_TIMEOUT: String(STATEMENT_TIMEOUT), LOG_LEVEL: 'info', SHUTDOWN_TIMEOUT: '2' })
  db = connect(url, { max: 2, statementTimeoutMs: 10_000 })
  for (let i = 0; i < 16; i++) {
    const res = await call(service.url, 'POST', '/users', { token, body: { name: `Seed ${i}`, email: `seed.${i}@example.com` } })
    assert.equal(res.status, 201, JSON.stringify(res.body))
    seeded.push(res.body.id)
  }
})

after(async () => {
  if (service?.alive()) {
    service.kill('SIGTERM')
    await service.exited
  }
  await db?.end({ timeout: 1 })
  await cluster?.destroy()
})

const isUnavailable = (o: Outcome) => o.status === 503 && o.code === 'database_unavailable' && o.retryAfter !== null
const ms = (x: number) => `${Math.round(x)} ms`

/**
 * A mixed load: reads, creations, a page of a collection, and updates of one
 * row by several clients at once, so that at any moment some transaction is
 * waiting on that row's lock with a statement in flight: the moment
 * postgres.js 3.4.9 crashed on (src/core/db/postgres-patch.mjs).
 */
function mixedLoad(clients: number, tag: string) {
  return startLoad(clients, (client, seq) => {
    const id = seeded[client % seeded.length]!
    const o = { token, client, seq, timeoutMs: 20_000 }
    switch (client % 4) {
      case 0: return call(service.url, 'GET', `/users/${id}`, { ...o, what: 'read' })
      case 1: return call(service.url, 'PATCH', `/users/${seeded[0]}`, { ...o, what: 'update', body: { name: `${tag} ${client}.${seq}` } })
      case 2: return call(service.url, 'POST', '/users', { ...o, what: 'create', body: { name: 'Load', email: `${tag}.${client}.${seq}@example.com` } })
      default: return call(service.url, 'GET', '/users?limit=5', { ...o, what: 'list' })
    }
  })
}

/** /healthz and /readyz every 50 ms. */
function probes() {
  return startLoad(2, async (client, seq) => {
    const o = await call(service.url, 'GET', client === 0 ? '/healthz' : '/readyz', { client, seq, timeoutMs: 20_000 })
    await sleep(50)
    return o
  })
}

function assertNoHangNorError(outcomes: Outcome[]): void {
  const broken = outcomes.filter((o) => o.error !== undefined || !(o.status! < 300 || isUnavailable(o)))
  assert.deepEqual(broken.map((o) => `${o.what}: ${o.error ?? `${o.status} ${o.code} retry-after=${o.retryAfter}`}`), [], 'every answer is a success or a 503 database_unavailable with Retry-After')
}

const serviceErrors = () => service.logs.filter((l) => l.level === 'error')

test('PostgreSQL stopped under load: 503 database_unavailable within 1 s, /readyz 503, /healthz 200; started again: served again within 1.5 s by the same process', async (t) => {
  for (const mode of ['fast', 'immediate'] as const) {
    const load = mixedLoad(12, `outage-${mode}`)
    const probe = probes()
    let downAt = 0, startAt = 0, upAt = 0, recoveredIn = Infinity
    try {
      await sleep(1000)
      await cluster.stop(mode)
      downAt = performance.now()
      await sleep(3000)
      startAt = performance.now()
      await cluster.start()
      upAt = performance.now()
      recoveredIn = await waitFor('a success after the restart', () => load.outcomes.some((o) => o.started >= upAt && o.status! < 300), 10_000, 10)
      await sleep(2000)
    } finally {
      await load.stop()
      await probe.stop()
    }
    const outcomes = load.outcomes
    const probed = probe.outcomes
    const during = outcomes.filter((o) => o.started >= downAt && o.ended <= startAt)
    const latencies = during.map((o) => o.ended - o.started)
    const first503 = Math.min(...outcomes.filter((o) => isUnavailable(o) && o.ended >= downAt).map((o) => o.ended)) - downAt
    t.diagnostic(`stop -m ${mode}: first 503 ${ms(first503)} after the stop; 503 latency p50 ${ms(percentile(latencies, 50))}, p99 ${ms(percentile(latencies, 99))}, max ${ms(Math.max(...latencies))} (${during.length} requests); first success ${ms(recoveredIn)} after the start; ${outcomes.length} requests in all`)

    assertNoHangNorError(outcomes)
    assertNoHangNorError(probed.filter((o) => o.what.includes('readyz')))
    assert.ok(service.alive(), 'the process is still running')

    // While the database was down: every request that needed it got its 503, quickly.
    assert.ok(during.length >= 50, `${during.length} requests during the outage`)
    assert.deepEqual(summarize(during), { '503 database_unavailable': during.length })
    assert.ok(Math.max(...latencies) < 1000, `a 503 took ${ms(Math.max(...latencies))}`)
    // /readyz keeps the database's answer for READINESS_TTL_MS: the outage shows there once the last success is that old.
    const readyDuring = probed.filter((o) => o.what === 'GET /readyz' && o.started >= downAt + READINESS_TTL_MS + 100 && o.ended <= startAt)
    assert.ok(readyDuring.length >= 5)
    for (const o of readyDuring) assert.equal(o.status, 503)
    const health = probed.filter((o) => o.what === 'GET /healthz')
    assert.deepEqual(summarize(health), { 200: health.length }, '/healthz never depends on the database')
    // Nor waits for it: as quick as before the stop (its slowest then, on this machine now), or under 500 ms.
    const took = (some: typeof health) => Math.max(...some.map((o) => o.ended - o.started))
    const before = health.filter((o) => o.ended < downAt)
    assert.ok(before.length > 0, 'probes before the stop')
    assert.ok(took(health) < Math.max(500, 3 * took(before)), `/healthz took up to ${ms(took(health))}, ${ms(took(before))} before the stop`)

    // Back: every request started more than 1.5 s after the database was up succeeded.
    assert.ok(recoveredIn < 1500, `first success ${ms(recoveredIn)} after the database was up`)
    const afterRecovery = outcomes.filter((o) => o.started >= upAt + 1500)
    assert.ok(afterRecovery.length > 0)
    assert.deepEqual(afterRecovery.filter((o) => !(o.status! < 300)).map((o) => `${o.what} ${o.status} ${o.code}`), [])
    for (const o of probed.filter((o) => o.what === 'GET /readyz' && o.started >= upAt + 1500)) assert.equal(o.status, 200)
  }
  assert.deepEqual(serviceErrors(), [])
})

test('PostgreSQL restarted three times while transactional writes run: the process stays up, every answer is 2xx or 503, every acknowledged write is stored, none is half stored', async (t) => {
  // Writers that each own a row and update it with If-Match, so that every
  // committed update is visible in the row's version.
  const owned: Array<{ id: number; etag: string; acked: number; unknown: Set<number>; acks: number; resyncs: number }> = []
  for (let i = 0; i < 8; i++) {
    const res = await call(service.url, 'POST', '/users', { token, body: { name: `Writer ${i} s-1`, email: `writer${i}.s-1@example.com` } })
    assert.equal(res.status, 201)
    owned.push({ id: res.body.id, etag: '"v1"', acked: -1, unknown: new Set(), acks: 0, resyncs: 0 })
  }
  // A user to log in as: a login is a transaction of several inserts (a session, its refresh token).
  const password = 'a password for the fault test'
  const [loginUser] = await db<[{ email: string }]>`
    INSERT INTO users (name, email, password_hash) VALUES ('Login', 'login.outage@example.com', ${await testPasswords.hash(password)}) RETURNING email`
  const created = new Map<string, number | undefined>() // e-mail → id when 201
  const tokens: string[] = []

  const writers = startLoad(8, async (client, seq) => {
    const row = owned[client]!
    const o = await call(service.url, 'PATCH', `/users/${row.id}`, {
      token, client, seq, what: 'update', headers: { 'if-match': row.etag }, timeoutMs: 20_000,
      body: { name: `Writer ${client} s${seq}`, email: `writer${client}.s${seq}@example.com` },
    })
    if (o.status === 200) {
      row.etag = o.etag!
      row.acked = seq
      row.acks++
    } else if (isUnavailable(o)) {
      row.unknown.add(seq)
    } else if (o.status === 412) {
      // An update answered 503 had committed after all: start again from what is stored.
      const current = await call(service.url, 'GET', `/users/${row.id}`, { token, timeoutMs: 20_000 })
      if (current.status === 200) {
        row.etag = current.etag!
        row.resyncs++
      }
    }
    return o
  })
  const creators = startLoad(4, async (client, seq) => {
    const email = `creator${client}.${seq}@example.com`
    const o = await call(service.url, 'POST', '/users', { token, client, seq, what: 'create', body: { name: `Creator ${client} ${seq}`, email }, timeoutMs: 20_000 })
    created.set(email, o.status === 201 ? o.body.id : undefined)
    return o
  })
  // Contenders: updates of one shared row without If-Match, each setting a name and an e-mail that belong together.
  const shared = seeded[1]!
  const contenders = startLoad(4, (client, seq) =>
    call(service.url, 'PATCH', `/users/${shared}`, { token, client, seq, what: 'contended update', timeoutMs: 20_000, body: { name: `Contender ${client} ${seq}`, email: `contender${client}.${seq}@example.com` } }),
  )
  const logins = startLoad(2, async (client, seq) => {
    const o = await call(service.url, 'POST', '/auth/login', { client, seq, what: 'login', body: { email: loginUser.email, password }, timeoutMs: 20_000 })
    if (o.status === 200) tokens.push(o.body.refresh_token)
    return o
  })

  const restarts: string[] = []
  try {
    for (const mode of ['immediate', 'fast', 'immediate'] as const) {
      await sleep(1200)
      const at = performance.now()
      await cluster.stop(mode)
      await sleep(300)
      await cluster.start()
      restarts.push(`${mode} ${ms(performance.now() - at)}`)
    }
    await sleep(2500)
  } finally {
    await Promise.all([writers.stop(), creators.stop(), contenders.stop(), logins.stop()])
  }
  const outcomes = [...writers.outcomes, ...creators.outcomes, ...contenders.outcomes, ...logins.outcomes]
  const counts = summarize(outcomes)
  const resyncs = owned.reduce((n, r) => n + r.resyncs, 0)
  t.diagnostic(`restarts (stop, 300 ms, start): ${restarts.join(', ')}; answers: ${JSON.stringify(counts)}; updates answered 503 yet committed, found by a 412: ${resyncs}`)

  assert.ok(service.alive(), 'the process is still running')
  const broken = outcomes.filter((o) => o.error !== undefined || !(o.status! < 300 || isUnavailable(o) || (o.status === 412 && o.what === 'update')))
  assert.deepEqual(broken.map((o) => `${o.what}: ${o.error ?? `${o.status} ${o.code}`}`), [])
  assert.ok((counts['503 database_unavailable'] ?? 0) > 0, 'the restarts were felt')
  assert.ok(outcomes.filter((o) => o.status! < 300 && o.ended > performance.now() - 1500).length > 0, 'writes succeed again at the end')

  // Updates: the stored row is the last acknowledged update, or a later one
  // that was answered 503 (its commit raced the crash), never a mix of two.
  for (const [client, row] of owned.entries()) {
    const [stored] = await db<[{ name: string; email: string; version: number }]>`SELECT name, email, version FROM users WHERE id = ${row.id}`
    const seq = Number(/ s(-?\d+)$/.exec(stored.name)![1])
    assert.equal(stored.email, `writer${client}.s${seq}@example.com`, 'name and e-mail come from the same update')
    assert.ok(seq === row.acked || (seq > row.acked && row.unknown.has(seq)), `writer ${client}: stored s${seq}, last acknowledged s${row.acked}`)
    const committedUnacked = stored.version - 1 - row.acks
    assert.ok(committedUnacked >= 0 && committedUnacked <= row.unknown.size, `writer ${client}: version ${stored.version} after ${row.acks} acknowledged updates and ${row.unknown.size} answered 503`)
  }
  const [contended] = await db<[{ name: string; email: string }]>`SELECT name, email FROM users WHERE id = ${shared}`
  const [, who, when] = /^Contender (\d+) (\d+)$/.exec(contended.name)!
  assert.equal(contended.email, `contender${who}.${when}@example.com`, 'the shared row holds one update whole')
  // Creations: every 201 is stored as sent; a 503 is stored entirely or not at all.
  const rows = await db<Array<{ id: number; email: string; name: string }>>`SELECT id, email, name FROM users WHERE email LIKE 'creator%'`
  const byEmail = new Map(rows.map((r) => [r.email, r]))
  for (const [email, id] of created) {
    const stored = byEmail.get(email)
    if (id !== undefined) assert.equal(stored?.id, id, `${email} was acknowledged`)
    if (stored) assert.match(stored.name, /^Creator \d+ \d+$/)
  }
  // Logins: every acknowledged session is stored with its refresh token; no session lacks one.
  assert.ok(tokens.length > 0)
  for (const refresh of tokens) {
    const [found] = await db`SELECT 1 FROM refresh_tokens r JOIN sessions s ON s.id = r.session_id WHERE r.token_hash = ${hashSecret(refresh)}`
    assert.ok(found, 'an acknowledged login is stored')
  }
  const [{ halves }] = await db<[{ halves: number }]>`
    SELECT count(*)::int AS halves FROM sessions s WHERE (SELECT count(*) FROM refresh_tokens r WHERE r.session_id = s.id) <> 1`
  assert.equal(halves, 0, 'a session without exactly one refresh token is a login half stored')
  assert.deepEqual(serviceErrors(), [])
})

test('PostgreSQL frozen (SIGSTOP: connections accepted, nothing answered): the API answers 503 within STATEMENT_TIMEOUT + 5 s, /healthz stays fast, served again once it thaws', async (t) => {
  const load = mixedLoad(8, 'frozen')
  const probe = startLoad(1, async (client, seq) => {
    const o = await call(service.url, 'GET', '/healthz', { client, seq, timeoutMs: 20_000 })
    await sleep(50)
    return o
  })
  // The public routes that touch the database wait under the same bound: login (its statements; it also waits for a hash slot), refresh, /readyz.
  const publicLoad = startLoad(3, async (client, seq) => {
    const o = { client, seq, timeoutMs: 20_000 }
    const outcome =
      client === 0 ? await call(service.url, 'POST', '/auth/login', { ...o, what: 'login', body: { email: `nobody.${seq}@example.com`, password: 'not the password' } })
      : client === 1 ? await call(service.url, 'POST', '/auth/refresh', { ...o, what: 'refresh', body: { refresh_token: `upa_rt_${'A'.repeat(43)}` } })
      : await call(service.url, 'GET', '/readyz', { ...o, what: 'readyz' })
    await sleep(50)
    return outcome
  })
  let frozenAt = 0, thawedAt = 0, recoveredIn = Infinity
  try {
    await sleep(1000)
    const pids = await cluster.pids()
    assert.ok(pids.length >= 2, `cluster processes: ${pids}`)
    frozenAt = performance.now()
    for (const pid of pids) process.kill(pid, 'SIGSTOP')
    try {
      await sleep(DEADLINE_MS + 2500)
    } finally {
      for (const pid of pids) process.kill(pid, 'SIGCONT')
      thawedAt = performance.now()
    }
    recoveredIn = await waitFor('a success after the thaw', () => load.outcomes.some((o) => o.started >= thawedAt && o.status! < 300), 10_000, 10)
    await sleep(1500)
  } finally {
    await load.stop()
    await probe.stop()
    await publicLoad.stop()
  }
  const outcomes = load.outcomes
  const probed = probe.outcomes
  // Sent while frozen: a login sent before may have done its statements already and answer 401 meanwhile.
  const publicDuring = publicLoad.outcomes.filter((o) => o.started >= frozenAt && o.ended <= thawedAt)
  for (const what of ['login', 'refresh', 'readyz']) {
    // /readyz keeps the database's last answer for READINESS_TTL_MS (src/health/readiness.ts).
    const answered = publicDuring.filter((o) => o.what.endsWith(what) && (what !== 'readyz' || o.started >= frozenAt + READINESS_TTL_MS + 100))
    assert.ok(answered.length >= 1, `${what} answered while frozen: ${JSON.stringify(summarize(publicLoad.outcomes))}`)
    for (const o of answered) {
      assert.ok(isUnavailable(o), `${o.what} while frozen: ${o.error ?? `${o.status} ${o.code}`}`)
      assert.ok(o.ended - o.started <= DEADLINE_MS + 1500, `${o.what} took ${ms(o.ended - o.started)}`)
    }
  }
  const publicBroken = publicLoad.outcomes.filter((o) => o.error !== undefined || !(o.status === 401 || o.status === 200 || isUnavailable(o)))
  assert.deepEqual(publicBroken.map((o) => `${o.what}: ${o.error ?? o.status}`), [], 'login and refresh answer 401 (bad credentials) or 503, /readyz 200 or 503')
  // Answered while frozen: the requests in flight when it froze, and those sent since.
  const during = outcomes.filter((o) => o.ended > frozenAt + 100 && o.ended <= thawedAt)
  const latencies = during.map((o) => o.ended - o.started)
  t.diagnostic(`frozen ${ms(thawedAt - frozenAt)}: 503 latency min ${ms(Math.min(...latencies))}, max ${ms(Math.max(...latencies))} (${during.length} requests; connect_timeout 5 s, deadline ${DEADLINE_MS / 1000} s); first success ${ms(recoveredIn)} after the thaw`)

  assertNoHangNorError(outcomes)
  assert.ok(service.alive())
  assert.ok(during.length >= 8, `${during.length} answers while frozen (8 clients)`)
  for (const o of during) assert.ok(isUnavailable(o), `${o.what}: ${o.status}`)
  assert.ok(Math.max(...latencies) <= DEADLINE_MS + 1500, `a 503 took ${ms(Math.max(...latencies))}`)
  const health = probed.filter((o) => o.what === 'GET /healthz' && o.started >= frozenAt && o.ended <= thawedAt)
  assert.ok(health.length >= 20)
  assert.deepEqual(summarize(health), { 200: health.length })
  assert.ok(Math.max(...health.map((o) => o.ended - o.started)) < 500)
  assert.ok(recoveredIn < 3000, `first success ${ms(recoveredIn)} after the thaw`)
  assert.deepEqual(serviceErrors(), [])
})
