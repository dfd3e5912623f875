import assert from 'node:assert/strict'
import { after, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { reusePortMissing } from '../src/cluster/reuse-port.js'
import { connect } from '../src/core/db/connect.js'
import {
  adminToken,
  connectionRefused,
  holdRowLock,
  launchService,
  RawClient,
  troubleIn,
  waitFor,
  type Spawned,
} from './fault-kit.js'
import { call, type Answer } from './helpers/http-client.js'
import { createTestDatabase } from './helpers/server.js'

// SHUTDOWN_DELAY through the real process (`node dist/main.js`):
// between the signal and the drain, /readyz answers 503 but the listening
// socket stays open and every request is served as usual, so that a load
// balancer (a Kubernetes Service's endpoints) stops routing here before new
// connections are refused. Then the drain of test/fault-shutdown.test.ts,
// bounded by SHUTDOWN_TIMEOUT from its start. Without the variable (0), the
// drain begins at the signal: test/fault-shutdown.test.ts and
// test/workers.test.ts run with the default.

const databaseUrl = await createTestDatabase()
const db = connect(databaseUrl, { max: 4, statementTimeoutMs: 60_000 })
after(() => db.end({ timeout: 5 }))
const [{ id: adminId }] = await db<
  [{ id: number }]
>`INSERT INTO users (name, email, role) VALUES ('Delay Admin', 'delay-admin@example.com', 'admin') RETURNING id`
const auth = { authorization: `Bearer ${adminToken(adminId)}` }

async function start(env: Record<string, string>): Promise<Spawned> {
  const service = await launchService({ DATABASE_URL: databaseUrl, ...env }).listening
  after(() => void (service.alive() && service.kill('SIGKILL')))
  return service
}

/** A request on a connection of its own, made now. */
const fresh = (service: Spawned, method: string, path: string, body?: unknown): Promise<Answer> =>
  call(service.url, method, path, { headers: { ...auth, connection: 'close' }, body, timeoutMs: 10_000 })

const logged = (service: Spawned, msg: string) => service.logs.filter((l) => l.msg === msg)
const ms = (x: number) => `${Math.round(x)} ms`

test(
  'SIGTERM with SHUTDOWN_DELAY=3: for 3 s /readyz is 503 and says why, /healthz 200, new connections are accepted ' +
    'and served (reads and writes, Connection: close); then the drain finishes the request in flight, refuses new ' +
    'connections, exit 0 within delay + timeout',
  async () => {
    const DELAY = 3
    const TIMEOUT = 4
    const service = await start({
      SHUTDOWN_DELAY: String(DELAY),
      SHUTDOWN_TIMEOUT: String(TIMEOUT),
      STATEMENT_TIMEOUT: '30',
    })
    const [{ id: heldId }] = await db<
      [{ id: number }]
    >`INSERT INTO users (name, email) VALUES ('Held', ${`held-${Date.now()}@example.com`}) RETURNING id`
    // A keep-alive connection opened before the signal, one request answered on it.
    const kept = await new RawClient(service.port).open()
    const keptRequest = `GET /users/${adminId} HTTP/1.1\r\nHost: x\r\nAuthorization: ${auth.authorization}\r\n\r\n`
    kept.write(keptRequest)
    await waitFor('the kept-alive connection to get its first answer', () => kept.responses().length === 1, 5000)
    assert.equal(kept.responses()[0]!.headers.connection, 'keep-alive')
    assert.equal((await fresh(service, 'GET', '/readyz')).status, 200)

    const termAt = performance.now()
    service.kill('SIGTERM')
    await waitFor(
      'the service to say it is not ready',
      () =>
        logged(
          service,
          'not ready: serving for SHUTDOWN_DELAY while load balancers stop sending requests here, then draining',
        ).length === 1,
      2000,
      10,
    )

    const readyz = await fresh(service, 'GET', '/readyz')
    const healthz = await fresh(service, 'GET', '/healthz')
    const read = await fresh(service, 'GET', `/users/${adminId}`)
    const created = await fresh(service, 'POST', '/products', {
      name: 'Made during the delay',
      sku: `DELAY-${Date.now()}`,
      price: 100,
      currency: 'EUR',
    })
    kept.write(keptRequest)
    await waitFor('the kept-alive connection to get its second answer', () => kept.responses().length === 2, 5000)
    await kept.closed
    // A write that waits on a row lock across the start of the drain.
    const lock = await holdRowLock(db, 'users', heldId)
    const inFlight = fresh(service, 'PATCH', `/users/${heldId}`, { name: 'Drained' })
    await waitFor(
      'the write to wait on the lock',
      async () =>
        (
          await db<
            [{ n: number }]
          >`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type =
          'Lock'`
        )[0].n === 1,
      5000,
    )
    const stillAccepting = performance.now()

    assert.ok(
      stillAccepting - termAt < DELAY * 1000,
      `the checks above ran within the delay (${ms(stillAccepting - termAt)})`,
    )
    assert.equal(readyz.status, 503)
    assert.equal(readyz.body.code, 'shutting_down')
    assert.match(readyz.body.detail, /still serves for [0-3] s \(SHUTDOWN_DELAY\)/)
    assert.equal(readyz.headers['retry-after'], '1')
    assert.equal(healthz.status, 200)
    assert.equal(read.status, 200)
    assert.equal(read.body.id, adminId)
    assert.equal(created.status, 201, JSON.stringify(created.body))
    for (const answer of [readyz, healthz, read, created]) assert.equal(answer.headers.connection, 'close')
    // The connection kept alive from before is answered, told to close, and closed.
    const second = kept.responses()[1]!
    assert.equal(second.status, 200)
    assert.equal(second.headers.connection, 'close')

    // The drain: the listener closes at the end of the delay, not before.
    await waitFor('new connections to be refused', () => connectionRefused(service.port), (DELAY + 2) * 1000, 20)
    const refusedAt = performance.now()
    assert.ok(
      refusedAt - termAt >= DELAY * 1000 - 50,
      `connections refused ${ms(refusedAt - termAt)} after SIGTERM, before the end of the ${DELAY} s delay`,
    )
    // The drain has begun with the write still waiting on the lock: it finishes.
    lock.release()
    await lock.done
    const drained = await inFlight
    assert.equal(drained.status, 200, JSON.stringify(drained.body))
    assert.equal(drained.headers.connection, 'close')
    const exit = await service.exited
    assert.equal(exit.code, 0)
    assert.ok(
      exit.at - termAt < (DELAY + TIMEOUT) * 1000,
      `exit ${ms(exit.at - termAt)} after SIGTERM (SHUTDOWN_DELAY ${DELAY} s + SHUTDOWN_TIMEOUT ${TIMEOUT} s)`,
    )
    const [stored] = await db<[{ name: string }]>`SELECT name FROM users WHERE id = ${heldId}`
    assert.equal(stored.name, 'Drained')
    assert.equal(logged(service, 'draining').length, 1)
    assert.equal(logged(service, 'stopped').length, 1)
    assert.deepEqual(troubleIn(service.logs), [])
  },
)

test(
  "the same signal again ends SHUTDOWN_DELAY at once; another signal does not (a worker gets its terminal's " +
    "SIGINT and its primary's SIGTERM)",
  async () => {
    const service = await start({ SHUTDOWN_DELAY: '60', SHUTDOWN_TIMEOUT: '5' })
    const termAt = performance.now()
    service.kill('SIGTERM')
    await waitFor(
      'the service to say it is not ready',
      () =>
        logged(
          service,
          'not ready: serving for SHUTDOWN_DELAY while load balancers stop sending requests here, then draining',
        ).length === 1,
      2000,
      10,
    )
    service.kill('SIGINT')
    // Nothing to wait for but time: a SIGINT that ended the delay would close the listener at once.
    await sleep(250)
    assert.equal((await fresh(service, 'GET', '/healthz')).status, 200, 'still serving after a SIGINT')
    assert.equal(logged(service, 'draining').length, 0)
    service.kill('SIGTERM')
    const exit = await service.exited
    assert.equal(exit.code, 0)
    assert.ok(exit.at - termAt < 10_000, `exit ${ms(exit.at - termAt)} after the first SIGTERM, of a 60 s delay`)
    const skipped = logged(service, 'the drain begins now, before the end of SHUTDOWN_DELAY (a second signal)')
    assert.equal(skipped.length, 1)
    assert.ok((skipped[0]!.skipped_ms as number) > 50_000, `skipped ${skipped[0]!.skipped_ms} ms of the delay`)
  },
)

describe('WORKERS=2 with SHUTDOWN_DELAY', { skip: reusePortMissing() }, () => {
  test(
    'SIGTERM to the primary: every worker keeps serving new connections for the delay with /readyz 503, then ' +
      'drains; none is killed although the delay is longer than SHUTDOWN_TIMEOUT + 2 s; exit 0',
    async () => {
      const DELAY = 4
      const service = await start({ WORKERS: '2', SHUTDOWN_DELAY: String(DELAY), SHUTDOWN_TIMEOUT: '1' })
      await waitFor('every worker to listen', () => logged(service, 'every worker is listening').length === 1, 20_000)
      const termAt = performance.now()
      service.kill('SIGTERM')
      await waitFor(
        'both workers to say they are not ready',
        () =>
          logged(
            service,
            'not ready: serving for SHUTDOWN_DELAY while load balancers stop sending requests here, then draining',
          ).length === 2,
        3000,
        10,
      )
      // Requests on connections of their own, until each worker has answered: its log line names it.
      const servedBy = new Set<number>()
      const answers: Answer[] = []
      for (let i = 0; servedBy.size < 2 && i < 40; i++) {
        const requestId = `delay-workers-${i}`
        const answer = await call(service.url, 'GET', '/readyz', {
          headers: { connection: 'close', 'x-request-id': requestId },
          timeoutMs: 5000,
        })
        answers.push(answer)
        await waitFor(
          `the log line of ${requestId}`,
          () => service.logs.some((l) => l.request_id === requestId),
          2000,
          10,
        )
        servedBy.add(service.logs.find((l) => l.request_id === requestId)!.worker as number)
      }
      const users = await fresh(service, 'GET', `/users/${adminId}`)
      const checkedAt = performance.now()
      assert.ok(checkedAt - termAt < DELAY * 1000, `the checks above ran within the delay (${ms(checkedAt - termAt)})`)
      assert.deepEqual([...servedBy].sort(), [1, 2])
      assert.deepEqual(
        answers.map((a) => a.status).filter((s) => s !== 503),
        [],
      )
      assert.equal(users.status, 200)
      const exit = await service.exited
      assert.equal(exit.code, 0)
      assert.ok(exit.at - termAt >= DELAY * 1000 - 50, `exit ${ms(exit.at - termAt)} after SIGTERM`)
      assert.ok(exit.at - termAt < (DELAY + 1 + 2) * 1000, `exit ${ms(exit.at - termAt)} after SIGTERM`)
      assert.deepEqual(
        logged(service, 'worker stopped')
          .map((l) => [l.worker, l.code, l.signal])
          .sort(),
        [
          [1, 0, null],
          [2, 0, null],
        ],
      )
      assert.deepEqual(logged(service, 'workers still running past SHUTDOWN_DELAY + SHUTDOWN_TIMEOUT were killed'), [])
    },
  )
})
