import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Sql } from 'postgres'
import { testPasswords } from './passwords.js'
import { hashSecret } from '../../src/auth/tokens.js'
import { DEADLINE_GRACE_MS, SWEEP_MS } from '../../src/core/db/admission.js'
import { connect } from '../../src/core/db/connect.js'
import { READINESS_TTL_MS } from '../../src/health/readiness.js'
import {
  freshAdminToken,
  call,
  everyClient,
  OwnCluster,
  spawnService,
  startLoad,
  summarize,
  waitFor,
  type Outcome,
  type Spawned,
} from '../fault-kit.js'

// The database goes away under load, for real: the test file's own PostgreSQL
// cluster is stopped (fast: a clean shutdown that aborts open transactions;
// immediate: a crash), restarted, and frozen (SIGSTOP: a server that accepts
// connections and never answers). The service is the real process
// (`node dist/main.js`). What it must do: answer 503
// database_unavailable within a bounded time, never hang or 500, keep
// /healthz at 200 and /readyz at 503 while the database is down, commit every
// write it acknowledged and no part of one it did not, and serve again by
// itself once the database is back. How quickly (the first 503 after the
// stop, the first success after the start or the thaw, how long /healthz
// takes meanwhile) is a figure of `make bench-faults`
// (bench/faults/db-outage.ts). The tests wait for each state they need
// rather than for a time. Two files run these tests, so that they run at once
// in two lanes of `make test`, each with a cluster and a service of its own:
// test/fault-db-outage.test.ts (stopped) and test/fault-db-restart.test.ts
// (restarted, frozen).

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
  service = await spawnService({
    DATABASE_URL: url,
    STATEMENT_TIMEOUT: String(STATEMENT_TIMEOUT),
    LOG_LEVEL: 'info',
    SHUTDOWN_TIMEOUT: '2',
  })
  db = connect(url, { max: 2, statementTimeoutMs: 10_000 })
  // A fresh login's token: the writers below set other users' e-mail, a step-up act (docs/auth.md, "Step-up").
  token = await freshAdminToken(db, adminId)
  for (let i = 0; i < 16; i++) {
    const res = await call(service.url, 'POST', '/users', {
      token,
      body: { name: `Seed ${i}`, email: `seed.${i}@example.com` },
    })
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
 * postgres.js 3.4.9 crashed on (src/driver-patch/postgres.mjs).
 */
function mixedLoad(clients: number, tag: string) {
  return startLoad(clients, (client, seq) => {
    const id = seeded[client % seeded.length]!
    const o = { token, client, seq, timeoutMs: 20_000 }
    switch (client % 4) {
      case 0:
        return call(service.url, 'GET', `/users/${id}`, { ...o, what: 'read' })
      case 1:
        return call(service.url, 'PATCH', `/users/${seeded[0]}`, {
          ...o,
          what: 'update',
          body: { name: `${tag} ${client}.${seq}` },
        })
      case 2:
        return call(service.url, 'POST', '/users', {
          ...o,
          what: 'create',
          body: { name: 'Load', email: `${tag}.${client}.${seq}@example.com` },
        })
      default:
        return call(service.url, 'GET', '/users?limit=5', { ...o, what: 'list' })
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
  assert.deepEqual(
    broken.map((o) => `${o.what}: ${o.error ?? `${o.status} ${o.code} retry-after=${o.retryAfter}`}`),
    [],
    'every answer is a success or a 503 database_unavailable with Retry-After',
  )
}

/**
 * How late the service may answer past a bound it keeps by a timer (the deadline's sweep, every
 * SWEEP_MS): five times the longest answer the same load got before the fault, on this machine now.
 */
const slackAfter = (before: Outcome[]) => SWEEP_MS + 5 * Math.max(...before.map((o) => o.ended - o.started))

const serviceErrors = () => service.logs.filter((l) => l.level === 'error')
const healthy = (o: Outcome) => o.status! < 300

/** PostgreSQL stopped and started again (fast, then immediate). */
export function stoppedDatabaseTests(): void {
  test(
    'PostgreSQL stopped under load: 503 database_unavailable with Retry-After before the deadline, /readyz 503, ' +
      '/healthz 200; started again: served again by the same process',
    async () => {
      for (const mode of ['fast', 'immediate'] as const) {
        const load = mixedLoad(12, `outage-${mode}`)
        const probe = probes()
        const readyz = (o: Outcome) => o.what === 'GET /readyz'
        let downAt = 0,
          startAt = 0,
          upAt = 0,
          recoveredAt = 0
        // /readyz keeps the database's answer for READINESS_TTL_MS: the outage shows there once the last
        // success is that old.
        const readyzDown = (o: Outcome) => readyz(o) && o.started >= downAt + READINESS_TTL_MS + 100
        try {
          await waitFor('every client served', () => everyClient(load.outcomes, healthy), 20_000)
          await cluster.stop(mode)
          downAt = performance.now()
          await waitFor(
            'every client to get its 503, and /readyz its',
            () =>
              everyClient(load.outcomes, (o) => o.started >= downAt && isUnavailable(o)) &&
              probe.outcomes.some((o) => readyzDown(o) && o.status === 503),
            20_000,
          )
          startAt = performance.now()
          await cluster.start()
          upAt = performance.now()
          const servedAgain = () => everyClient(load.outcomes, (o) => o.started >= upAt && healthy(o))
          await waitFor('every client served again', servedAgain, 20_000)
          recoveredAt = performance.now()
          // Served from then on: each client's next two requests, and /readyz.
          await waitFor(
            'more answers after the recovery',
            () =>
              everyClient(load.outcomes, (o) => o.started >= recoveredAt, 2) &&
              probe.outcomes.some((o) => readyz(o) && o.started >= recoveredAt && o.status === 200),
            20_000,
          )
        } finally {
          await load.stop()
          await probe.stop()
        }
        const outcomes = load.outcomes
        const probed = probe.outcomes

        assertNoHangNorError(outcomes)
        assertNoHangNorError(probed.filter(readyz))
        assert.ok(service.alive(), 'the process is still running')

        // While the database was down: every request that needed it got its 503, before the deadline.
        const during = outcomes.filter((o) => o.started >= downAt && o.ended <= startAt)
        assert.deepEqual(summarize(during), { '503 database_unavailable': during.length })
        const bound = DEADLINE_MS + slackAfter(outcomes.filter((o) => o.ended < downAt))
        const longest = Math.max(...during.map((o) => o.ended - o.started))
        assert.ok(longest < bound, `a 503 took ${ms(longest)} (bound ${ms(bound)})`)
        const readyzWhileDown = probed.filter((o) => readyzDown(o) && o.ended <= startAt)
        for (const o of readyzWhileDown) assert.equal(o.status, 503)
        const health = probed.filter((o) => o.what === 'GET /healthz')
        assert.deepEqual(summarize(health), { 200: health.length }, '/healthz never depends on the database')

        // Back: every request sent once each client had been served again succeeded, and /readyz is 200 again.
        const afterRecovery = outcomes.filter((o) => o.started >= recoveredAt)
        assert.deepEqual(
          afterRecovery.filter((o) => !healthy(o)).map((o) => `${o.what} ${o.status} ${o.code}`),
          [],
        )
        const readyAgain = probed.filter((o) => readyz(o) && o.started >= recoveredAt && o.status === 200)
        const firstReady = Math.min(...readyAgain.map((o) => o.started))
        for (const o of probed.filter((o) => readyz(o) && o.started > firstReady)) assert.equal(o.status, 200)
      }
      assert.deepEqual(serviceErrors(), [])
    },
  )
}

/** PostgreSQL restarted under transactional writes, and frozen. */
export function restartedAndFrozenDatabaseTests(): void {
  test(
    'PostgreSQL restarted three times while transactional writes run: the process stays up, every answer is 2xx ' +
      'or 503, every acknowledged write is stored, none is half stored',
    async () => {
      // Writers that each own a row and update it with If-Match, so that every
      // committed update is visible in the row's version.
      const owned: Array<{
        id: number
        etag: string
        acked: number
        unknown: Set<number>
        acks: number
        resyncs: number
      }> = []
      for (let i = 0; i < 8; i++) {
        const res = await call(service.url, 'POST', '/users', {
          token,
          body: { name: `Writer ${i} s-1`, email: `writer${i}.s-1@example.com` },
        })
        assert.equal(res.status, 201)
        owned.push({ id: res.body.id, etag: '"v1"', acked: -1, unknown: new Set(), acks: 0, resyncs: 0 })
      }
      // A user to log in as: a login is a transaction of several inserts (a session, its refresh token).
      const password = 'a password for the fault test'
      const [loginUser] = await db<[{ email: string }]>`
      INSERT INTO users (name, email, password_hash) VALUES ('Login',
      'login.outage@example.com', ${await testPasswords.hash(password)}) RETURNING email`
      const created = new Map<string, number | undefined>() // e-mail → id when 201
      const tokens: string[] = []

      const writers = startLoad(8, async (client, seq) => {
        const row = owned[client]!
        const o = await call(service.url, 'PATCH', `/users/${row.id}`, {
          token,
          client,
          seq,
          what: 'update',
          headers: { 'if-match': row.etag },
          timeoutMs: 20_000,
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
        const o = await call(service.url, 'POST', '/users', {
          token,
          client,
          seq,
          what: 'create',
          body: { name: `Creator ${client} ${seq}`, email },
          timeoutMs: 20_000,
        })
        created.set(email, o.status === 201 ? o.body.id : undefined)
        return o
      })
      // Contenders: updates of one shared row without If-Match, each setting a name and an e-mail that belong together.
      const shared = seeded[1]!
      const contenders = startLoad(4, (client, seq) =>
        call(service.url, 'PATCH', `/users/${shared}`, {
          token,
          client,
          seq,
          what: 'contended update',
          timeoutMs: 20_000,
          body: { name: `Contender ${client} ${seq}`, email: `contender${client}.${seq}@example.com` },
        }),
      )
      const logins = startLoad(2, async (client, seq) => {
        const o = await call(service.url, 'POST', '/auth/login', {
          client,
          seq,
          what: 'login',
          body: { email: loginUser.email, password },
          timeoutMs: 20_000,
        })
        if (o.status === 200) tokens.push(o.body.refresh_token)
        return o
      })

      // Between the restarts, and after the last: until every writer, creator and login client has been served again.
      const loops = [writers, creators, contenders, logins]
      const servedSince = (at: number) =>
        loops.every((l) => everyClient(l.outcomes, (o) => o.started >= at && o.status! < 300))
      try {
        await waitFor('every client served', () => servedSince(0), 20_000)
        for (const mode of ['immediate', 'fast', 'immediate'] as const) {
          await cluster.stop(mode)
          await sleep(300)
          await cluster.start()
          const upAt = performance.now()
          await waitFor(`every client served after the restart (${mode})`, () => servedSince(upAt), 20_000)
        }
      } finally {
        await Promise.all(loops.map((l) => l.stop()))
      }
      const outcomes = [...writers.outcomes, ...creators.outcomes, ...contenders.outcomes, ...logins.outcomes]
      const counts = summarize(outcomes)

      assert.ok(service.alive(), 'the process is still running')
      const broken = outcomes.filter(
        (o) =>
          o.error !== undefined || !(o.status! < 300 || isUnavailable(o) || (o.status === 412 && o.what === 'update')),
      )
      assert.deepEqual(
        broken.map((o) => `${o.what}: ${o.error ?? `${o.status} ${o.code}`}`),
        [],
      )
      assert.ok((counts['503 database_unavailable'] ?? 0) > 0, `the restarts were felt: ${JSON.stringify(counts)}`)

      // Updates: the stored row is the last acknowledged update, or a later one
      // that was answered 503 (its commit raced the crash), never a mix of two.
      for (const [client, row] of owned.entries()) {
        const [stored] = await db<
          [{ name: string; email: string; version: number }]
        >`SELECT name, email, version FROM users WHERE id = ${row.id}`
        const seq = Number(/ s(-?\d+)$/.exec(stored.name)![1])
        assert.equal(stored.email, `writer${client}.s${seq}@example.com`, 'name and e-mail come from the same update')
        assert.ok(
          seq === row.acked || (seq > row.acked && row.unknown.has(seq)),
          `writer ${client}: stored s${seq}, last acknowledged s${row.acked}`,
        )
        const committedUnacked = stored.version - 1 - row.acks
        assert.ok(
          committedUnacked >= 0 && committedUnacked <= row.unknown.size,
          `writer ${client}: version ${stored.version} ` +
            `after ${row.acks} acknowledged updates and ${row.unknown.size} answered 503`,
        )
      }
      const [contended] = await db<
        [{ name: string; email: string }]
      >`SELECT name, email FROM users WHERE id = ${shared}`
      const [, who, when] = /^Contender (\d+) (\d+)$/.exec(contended.name)!
      assert.equal(contended.email, `contender${who}.${when}@example.com`, 'the shared row holds one update whole')
      // Creations: every 201 is stored as sent; a 503 is stored entirely or not at all.
      const rows = await db<
        Array<{ id: number; email: string; name: string }>
      >`SELECT id, email, name FROM users WHERE email LIKE 'creator%'`
      const byEmail = new Map(rows.map((r) => [r.email, r]))
      for (const [email, id] of created) {
        const stored = byEmail.get(email)
        if (id !== undefined) assert.equal(stored?.id, id, `${email} was acknowledged`)
        if (stored) assert.match(stored.name, /^Creator \d+ \d+$/)
      }
      // Logins: every acknowledged session is stored with its refresh token; no session lacks one.
      assert.ok(tokens.length > 0)
      for (const refresh of tokens) {
        const [found] = await db`SELECT 1 FROM refresh_tokens r JOIN sessions s ON s.id = r.session_id
            WHERE r.token_hash = ${hashSecret(refresh)}`
        assert.ok(found, 'an acknowledged login is stored')
      }
      const [{ halves }] = await db<[{ halves: number }]>`
      SELECT count(*)::int AS halves FROM sessions s WHERE (SELECT count(*) FROM refresh_tokens r WHERE r.session_id
      = s.id) <> 1`
      assert.equal(halves, 0, 'a session without exactly one refresh token is a login half stored')
      assert.deepEqual(serviceErrors(), [])
    },
  )

  test(
    'PostgreSQL frozen (SIGSTOP: connections accepted, nothing answered): the API answers 503 within ' +
      'STATEMENT_TIMEOUT + 5 s, /healthz answers without waiting for it, served again once it thaws',
    async () => {
      const load = mixedLoad(8, 'frozen')
      const probe = startLoad(1, async (client, seq) => {
        const o = await call(service.url, 'GET', '/healthz', { client, seq, timeoutMs: 20_000 })
        await sleep(50)
        return o
      })
      // The public routes that touch the database wait under the same bound: login (its statements; it also waits for a
      // hash slot), refresh, /readyz.
      const publicLoad = startLoad(3, async (client, seq) => {
        const o = { client, seq, timeoutMs: 20_000 }
        const outcome =
          client === 0
            ? await call(service.url, 'POST', '/auth/login', {
                ...o,
                what: 'login',
                body: { email: `nobody.${seq}@example.com`, password: 'not the password' },
              })
            : client === 1
              ? await call(service.url, 'POST', '/auth/refresh', {
                  ...o,
                  what: 'refresh',
                  body: { refresh_token: `upa_rt_${'A'.repeat(43)}` },
                })
              : await call(service.url, 'GET', '/readyz', { ...o, what: 'readyz' })
        await sleep(50)
        return outcome
      })
      /**
       * The public answers given while frozen, to requests sent then: a login sent before may have done its
       * statements already and answer 401 meanwhile.
       */
      let frozenAt = Infinity,
        thawedAt = Infinity
      const publicWhileFrozen = (what: string) =>
        publicLoad.outcomes.filter(
          (o) =>
            o.what.endsWith(what) &&
            o.started >= frozenAt &&
            o.ended <= thawedAt &&
            // /readyz keeps the database's last answer for READINESS_TTL_MS (src/health/readiness.ts).
            (what !== 'readyz' || o.started >= frozenAt + READINESS_TTL_MS + 100),
        )
      try {
        const served = () => everyClient(load.outcomes, healthy) && everyClient(publicLoad.outcomes, () => true)
        await waitFor('every client served', served, 20_000)
        const pids = await cluster.pids()
        assert.ok(pids.length >= 2, `cluster processes: ${pids}`)
        frozenAt = performance.now()
        for (const pid of pids) process.kill(pid, 'SIGSTOP')
        try {
          // Until the requests in flight when it froze have had their
          // 503 at the deadline, and the public routes theirs.
          await waitFor(
            'a 503 for every client',
            () =>
              everyClient(load.outcomes, (o) => o.ended > frozenAt && isUnavailable(o)) &&
              ['login', 'refresh', 'readyz'].every((what) => publicWhileFrozen(what).length > 0),
            30_000,
          )
        } finally {
          for (const pid of pids) process.kill(pid, 'SIGCONT')
          thawedAt = performance.now()
        }
        const servedAgain = () => everyClient(load.outcomes, (o) => o.started >= thawedAt && healthy(o))
        await waitFor('every client served after the thaw', servedAgain, 20_000)
      } finally {
        await load.stop()
        await probe.stop()
        await publicLoad.stop()
      }
      const outcomes = load.outcomes
      const bound = DEADLINE_MS + slackAfter(outcomes.filter((o) => o.ended < frozenAt))
      for (const what of ['login', 'refresh', 'readyz']) {
        const answered = publicWhileFrozen(what)
        assert.ok(
          answered.length >= 1,
          `${what} answered while frozen: ${JSON.stringify(summarize(publicLoad.outcomes))}`,
        )
        for (const o of answered) {
          assert.ok(isUnavailable(o), `${o.what} while frozen: ${o.error ?? `${o.status} ${o.code}`}`)
          assert.ok(o.ended - o.started < bound, `${o.what} took ${ms(o.ended - o.started)} (bound ${ms(bound)})`)
        }
      }
      const publicBroken = publicLoad.outcomes.filter(
        (o) => o.error !== undefined || !(o.status === 401 || o.status === 200 || isUnavailable(o)),
      )
      assert.deepEqual(
        publicBroken.map((o) => `${o.what}: ${o.error ?? o.status}`),
        [],
        'login and refresh answer 401 (bad credentials) or 503, /readyz 200 or 503',
      )

      assertNoHangNorError(outcomes)
      assert.ok(service.alive())
      // Sent while frozen: 503 (refused once the oldest has waited the target). In flight when it froze: a
      // 503 at the deadline, unless its answer was on its way already. Each before the deadline's bound.
      const sent = outcomes.filter((o) => o.started >= frozenAt && o.ended <= thawedAt)
      assert.deepEqual(summarize(sent), { '503 database_unavailable': sent.length })
      const unavailable = outcomes.filter((o) => o.ended > frozenAt && o.ended <= thawedAt && isUnavailable(o))
      const longest = Math.max(...unavailable.map((o) => o.ended - o.started))
      assert.ok(longest < bound, `a 503 took ${ms(longest)} (bound ${ms(bound)})`)
      // /healthz never waits for the database: each sent in the first half of the deadline was answered 200
      // before the thaw.
      const health = probe.outcomes.filter((o) => o.started >= frozenAt && o.started <= frozenAt + DEADLINE_MS / 2)
      assert.ok(health.length >= 1)
      const waited = health.filter((o) => o.status !== 200 || o.ended > thawedAt)
      assert.deepEqual(
        waited.map((o) => `${o.status} ${ms(o.ended - o.started)}`),
        [],
      )
      assert.deepEqual(summarize(probe.outcomes), { 200: probe.outcomes.length })
      assert.deepEqual(serviceErrors(), [])
    },
  )
}
