import assert from 'node:assert/strict'
import { readFile } from 'node:fs/promises'
import { createServer, connect as netConnect } from 'node:net'
import { availableParallelism } from 'node:os'
import { after, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { testPasswords } from './helpers/passwords.js'
import { RestartPolicy } from '../src/cluster/restart-policy.js'
import { reusePortMissing } from '../src/cluster/reuse-port.js'
import { loadConfig } from '../src/config.js'
import { connect } from '../src/core/db/connect.js'
import {
  adminToken,
  holdRowLock,
  launchService,
  runCommand,
  startLoad,
  summarize,
  waitFor,
  type Outcome,
  type Spawned,
} from './fault-kit.js'
import { call, tally, type Answer } from './helpers/http-client.js'
import { createTestDatabase } from './helpers/server.js'
import { portBelowEphemeral } from './helpers/ports.js'
import { boundFrom, SLOWDOWN, timed } from './helpers/time-bounds.js'

// WORKERS=2 through the real process (`node dist/main.js`): one
// port served by two worker processes under a primary (src/cluster/). Which
// worker answered a request is read from its log line (`worker`), found by
// the request id the test sends; every request goes on a connection of its
// own (Connection: close), so that the kernel spreads them among the
// workers' sockets (SO_REUSEPORT, src/cluster/reuse-port.ts).

const databaseUrl = await createTestDatabase()
const db = connect(databaseUrl, { max: 4, statementTimeoutMs: 60_000 })
after(() => db.end({ timeout: 5 }))
const [{ id: adminId }] = await db<
  [{ id: number }]
>`INSERT INTO users (name, email, role) VALUES ('Workers Admin', 'workers-admin@example.com', 'admin') RETURNING id`
const auth = { authorization: `Bearer ${adminToken(adminId)}` }
const SHUTDOWN_TIMEOUT_MS = 5000

/** The service with WORKERS=2 (unless `env` says otherwise), once every worker listens. */
async function startWorkers(env: Record<string, string> = {}, options?: { detached: boolean }): Promise<Spawned> {
  // PORT=0 is claimed by the primary and let go before the workers bind it (src/claim-port.ts): a port of the kernel's
  // ephemeral range could be taken in between by another test's socket.
  const service = await launchService(
    { DATABASE_URL: databaseUrl, WORKERS: '2', PORT: String(portBelowEphemeral()), ...env },
    options,
  ).listening
  after(() => void (service.alive() && service.kill('SIGKILL')))
  await waitFor('every worker to listen', () => service.logs.some((l) => l.msg === 'every worker is listening'), 20_000)
  return service
}

const workerPids = (service: Spawned) =>
  service.logs
    .filter((l) => l.msg === 'worker started')
    .map((l) => ({ worker: l.worker as number, pid: l.pid as number }))

let sent = 0
/** A request on a new connection, with a request id of its own to find its log line by. */
function fresh(
  service: Spawned,
  method: string,
  path: string,
  headers: Record<string, string> = auth,
  body?: unknown,
  timeoutMs?: number,
): Promise<Answer & { requestId: string }> {
  const requestId = `workers-test-${process.pid}-${++sent}`
  return call(service.url, method, path, {
    headers: { ...headers, connection: 'close', 'x-request-id': requestId },
    body,
    timeoutMs,
  }).then((a) => ({ ...a, requestId }))
}

/** The worker that answered a request, if its log line has come (lines are written within 20 ms). */
const workerOf = (service: Spawned, requestId: string) =>
  service.logs.find((l) => l.msg === 'request' && l.request_id === requestId)?.worker as number | undefined

/** The worker that answered a request, once its log line has come. */
async function servedBy(service: Spawned, requestId: string): Promise<number> {
  await waitFor(`the log line of ${requestId}`, () => workerOf(service, requestId) !== undefined, 10_000, 10)
  return workerOf(service, requestId)!
}

/** The baseline of this file's time bounds (boundFrom): a request on a new connection to its log line, worst of 3. */
async function probeMs(service: Spawned, headers: Record<string, string> = auth): Promise<number> {
  let slowest = 0
  for (let i = 0; i < 3; i++) {
    slowest = Math.max(
      slowest,
      await timed(async () => {
        const answer = await fresh(service, 'GET', '/auth/me', headers)
        assert.equal(answer.status, 200)
        await servedBy(service, answer.requestId)
      }),
    )
  }
  return slowest
}

/** Requests with `headers` on new connections until each worker has answered one: every answer must be 200. */
async function acceptedByBoth(service: Spawned, headers: Record<string, string>): Promise<void> {
  const accepted = new Set<number>()
  for (let i = 0; accepted.size < 2 && i < 40; i++) {
    const a = await fresh(service, 'GET', '/auth/me', headers)
    assert.equal(a.status, 200)
    accepted.add(await servedBy(service, a.requestId))
  }
  assert.equal(accepted.size, 2, 'both workers accepted the token')
}

describe('WORKERS', { concurrency: true }, () => {
  describe('WORKERS=2: one port, two processes', { concurrency: 1 }, async () => {
    // A pool of 24 per worker: the SIGTERM test below may hold up to 20 writes, all on one worker if the kernel's hash
    // sends them there.
    const service = await startWorkers({
      SHUTDOWN_TIMEOUT: String(SHUTDOWN_TIMEOUT_MS / 1000),
      DATABASE_POOL_MAX: '24',
    })

    test(
      'both workers answer on the one port; each request line names its worker, /metrics answers for ' + 'both',
      async () => {
        const answers = await Promise.all(Array.from({ length: 12 }, () => fresh(service, 'GET', `/users/${adminId}`)))
        assert.deepEqual(tally(answers), { 200: 12 })
        const workers = await Promise.all(answers.map((a) => servedBy(service, a.requestId)))
        assert.deepEqual([...new Set(workers)].sort(), [1, 2], `served by ${workers.join(', ')}`)
        // Two processes besides the primary, each its own pid.
        const pids = workerPids(service)
        assert.equal(new Set(pids.map((p) => p.pid).concat(service.pid)).size, 3)
        // The primary's own lines carry no worker; every worker's does.
        assert.ok(service.logs.some((l) => l.msg === 'starting workers' && !('worker' in l)))
        assert.deepEqual(
          service.logs
            .filter((l) => l.msg === 'listening')
            .map((l) => l.worker)
            .sort(),
          [1, 2],
        )

        const metrics = await fresh(service, 'GET', '/metrics')
        assert.equal(metrics.status, 200)
        const text = metrics.body as string
        for (const worker of [1, 2]) {
          assert.match(
            text,
            new RegExp(
              `^http_requests_total\\{worker="${worker}",method="GET",route="/users/\\{id\\}",status="200"\\} \\d+$`,
              'm',
            ),
          )
          assert.match(text, new RegExp(`^process_resident_memory_bytes\\{worker="${worker}"\\} \\d+$`, 'm'))
          assert.match(text, new RegExp(`^worker_restarts_total\\{worker="${worker}"\\} 0$`, 'm'))
        }
        // The two workers' requests by id add up to the 12 (and no more: nothing else read a user).
        const served = [
          ...text.matchAll(
            /^http_requests_total\{worker="\d",method="GET",route="\/users\/\{id\}",status="200"\} (\d+)$/gm,
          ),
        ].map((m) => Number(m[1]))
        assert.equal(
          served.reduce((a, b) => a + b, 0),
          12,
        )
        // One family, one HELP and TYPE, whatever the number of workers (the format's rule).
        assert.equal(text.match(/^# TYPE http_requests_total counter$/gm)?.length, 1)
        assert.match(text, /^# HELP http_requests_total .*\(label worker\)\.$/m)
      },
    )

    test('each worker listens on a socket of its own on the one port', async () => {
      assert.equal(await listeningSockets(service.port), 2)
    })

    test(
      'a second copy started on the port is refused before any worker starts (SO_REUSEPORT would let it share); ' +
        'the first serves on',
      async () => {
        const { code, stderr } = await startOnly({ WORKERS: '2', HOST: '127.0.0.1', PORT: String(service.port) })
        assert.equal(code, 1)
        assert.equal(
          stderr,
          `Cannot start: PORT=${service.port} on HOST=127.0.0.1: cannot listen (EADDRINUSE); is another copy of the ` +
            `service running?\n`,
        )
        assert.equal(await listeningSockets(service.port), 2)
        assert.equal((await fresh(service, 'GET', `/users/${adminId}`)).status, 200)
      },
    )

    test('a logout on one worker: the same token is refused by both within a second', async () => {
      const email = `workers-logout-${Date.now()}@example.com`
      // Made in the database: through the API, a user with a password is a step-up act, which this admin's
      // session-less token cannot make (docs/auth.md, "Step-up").
      const passwordHash = await testPasswords.hash('a long enough password')
      await db`INSERT INTO users (name, email, role, password_hash)
        VALUES ('Logs out', ${email}, 'user', ${passwordHash})`
      const login = await fresh(service, 'POST', '/auth/login', {}, { email, password: 'a long enough password' })
      assert.equal(login.status, 200)
      const bearer = { authorization: `Bearer ${login.body.access_token}` }
      // Accepted by both workers first (each has verified it and holds it in its JWT cache).
      await acceptedByBoth(service, bearer)
      // A second, or five times what one probe of the loop below takes here now.
      const bound = boundFrom(await probeMs(service, bearer))

      const logout = await fresh(service, 'POST', '/auth/logout', bearer)
      assert.equal(logout.status, 204)
      const loggedOutAt = performance.now()
      const loggedOutBy = await servedBy(service, logout.requestId)
      const refusedBy = new Map<number, number>()
      const after: Array<{ worker: number; status: number }> = []
      while (refusedBy.size < 2 && performance.now() - loggedOutAt < bound) {
        const a = await fresh(service, 'GET', '/auth/me', bearer)
        const worker = await servedBy(service, a.requestId)
        after.push({ worker, status: a.status })
        if (a.status === 401 && !refusedBy.has(worker)) refusedBy.set(worker, performance.now() - loggedOutAt)
      }
      const answers = `worker ${loggedOutBy} logged out; bound ${Math.round(bound)} ms; then ${JSON.stringify(after)}`
      assert.deepEqual([...refusedBy.keys()].sort(), [1, 2], answers)
      const refusedAfter = [...refusedBy.values()]
      assert.ok(
        refusedAfter.every((ms) => ms < bound),
        `refused after ${refusedAfter.map(Math.round)} ms; ${answers}`,
      )
      // Once a worker refused it, it never accepts it again.
      assert.deepEqual(
        after.filter(
          (a, i) => a.status === 200 && after.slice(0, i).some((b) => b.worker === a.worker && b.status === 401),
        ),
        [],
      )
    })

    test('a worker killed with SIGKILL is replaced under load; only requests on its connections fail', async () => {
      const [victim] = workerPids(service)
        .filter((p) => p.worker === 1)
        .slice(-1)
      // A reset comes at once: within a second, or five times a request's time here now. A connection left hanging
      // would show as a time-out at three times that.
      const atOnce = boundFrom(await probeMs(service))
      const load = startLoad(6, async (client, seq) => {
        const started = performance.now()
        const a = await fresh(service, 'GET', `/users/${adminId}`, auth, undefined, 3 * atOnce)
        return {
          client,
          seq,
          what: a.requestId,
          started,
          ended: performance.now(),
          status: a.status || undefined,
          error: a.error,
        }
      })
      /** Workers that answered requests started after `since`, as far as their log lines have come. */
      const answeredBy = (since: number) =>
        new Set(
          load.outcomes.filter((o) => o.started > since && o.status === 200).map((o) => workerOf(service, o.what)),
        )
      const both = (workers: Set<number | undefined>) => workers.has(1) && workers.has(2)
      await waitFor('both workers to answer the load', () => both(answeredBy(0)))
      const killedAt = performance.now()
      process.kill(victim!.pid, 'SIGKILL')
      await waitFor(
        'a new worker 1 to listen',
        () => service.logs.filter((l) => l.msg === 'listening' && l.worker === 1).length === 2,
        10_000,
      )
      const replacedAt = performance.now()
      // The replacement, worker 1 again in a new process, serves beside worker 2.
      await waitFor('both workers to answer the load after the replacement', () => both(answeredBy(replacedAt)))
      const outcomes = await load.stop()
      const failed = outcomes.filter((o) => o.status !== 200)
      const died = service.logs.find((l) => l.msg === 'worker died; replacing it')
      // Only requests that reached it before it was gone fail: those in flight on its connections, and connections
      // the kernel queued on its socket while the process was being torn down. Each started before the primary saw
      // the death, and each is refused at once (a reset, a hang-up), none left hanging.
      const seenDead = (died as { seenAt?: number } | undefined)?.seenAt ?? Infinity
      assert.deepEqual(
        failed.filter((o) => o.started > seenDead),
        [],
        'a request started after the primary saw the death failed',
      )
      const reset = (o: Outcome) => /ECONNRESET|socket hang up/.test(o.error ?? '') && o.ended - o.started <= atOnce
      const notAtOnce = failed.filter((o) => !reset(o))
      assert.deepEqual(notAtOnce, [], `failed (bound ${Math.round(atOnce)} ms): ${JSON.stringify(failed)}`)
      assert.equal(died?.pid, victim!.pid)
      assert.equal(died?.signal, 'SIGKILL')
      const [replacement] = workerPids(service)
        .filter((p) => p.worker === 1)
        .slice(-1)
      assert.notEqual(replacement!.pid, victim!.pid)
      assert.ok(
        outcomes.some((o) => o.started < killedAt && o.ended > killedAt),
        'requests were in flight at the kill',
      )
      // The replacement's own figures start again; the primary's count of replacements says it happened.
      const metrics = (await fresh(service, 'GET', '/metrics')).body as string
      assert.match(metrics, /^worker_restarts_total\{worker="1"\} 1$/m)
      assert.match(metrics, /^worker_restarts_total\{worker="2"\} 0$/m)
    })

    test(
      'SIGTERM to the primary under load: requests in flight on both workers finish, new connections are refused, ' +
        'exit 0 within SHUTDOWN_TIMEOUT',
      async () => {
        // Writes of one user wait on a row lock this test holds: requests in flight for as long as it likes.
        const [{ id: userId }] = await db<
          [{ id: number }]
        >`INSERT INTO users (name, email) VALUES ('Held', ${`held-${Date.now()}@example.com`}) RETURNING id`
        const lock = await holdRowLock(db, 'users', userId)
        // The kernel spreads new connections by a hash (SO_REUSEPORT), not in turn, and not evenly over a few
        // connections (ten all reached one worker once in a CI run): writes are added until each worker holds one (its
        // http_requests_in_flight, less the scrape's own on the worker that served it), at most twenty (a pool).
        const held: Array<ReturnType<typeof fresh>> = []
        const waitingOnLock = async () =>
          (
            await db<
              [{ n: number }]
            >`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type =
            'Lock'`
          )[0].n
        const heldByEach = async () => {
          const scrape = await fresh(service, 'GET', '/metrics')
          const by = await servedBy(service, scrape.requestId)
          return [1, 2].map(
            (w) =>
              Number(
                new RegExp(`^http_requests_in_flight\\{worker="${w}"\\} (\\d+)$`, 'm').exec(
                  scrape.body as string,
                )?.[1] ?? 0,
              ) - (w === by ? 1 : 0),
          )
        }
        for (;;) {
          held.push(fresh(service, 'PATCH', `/users/${userId}`, auth, { name: `Held ${held.length}` }))
          await waitFor(
            `${held.length} writes waiting on the lock`,
            async () => (await waitingOnLock()) >= held.length,
            5000,
          )
          if (held.length >= 6 && (await heldByEach()).every((n) => n > 0)) break
          assert.ok(held.length < 20, 'twenty writes on new connections all reached one worker')
        }
        const load = startLoad(4, async (client, seq) => {
          const started = performance.now()
          const a = await fresh(service, 'GET', `/users/${adminId}`, auth)
          if (a.error) await sleep(20)
          return {
            client,
            seq,
            what: a.requestId,
            started,
            ended: performance.now(),
            status: a.status || undefined,
            code: a.body?.code,
            error: a.error,
          }
        })
        await waitFor('the load to be answered', () => load.outcomes.filter((o) => o.status === 200).length >= 8)
        const termAt = performance.now()
        service.kill('SIGTERM')
        // Both workers drain; the port is closed once both have stopped listening.
        const draining = () => service.logs.filter((l) => l.msg === 'shutting down' && l.worker !== undefined).length
        await waitFor('both workers to shut down', () => draining() === 2, 10_000, 10)
        const refusedAfter = await waitFor('a new connection to be refused', () => refused(service.port), 10_000, 10)
        const whileHeld = performance.now()
        // The load meets the closed port while the writes are still held.
        await waitFor('the load to be refused', () => load.outcomes.some((o) => o.started > whileHeld && o.error))
        lock.release()
        await lock.done
        const answers = await Promise.all(held)
        const exit = await service.exited
        const outcomes = await load.stop()
        const exitAfter = exit.at - termAt
        assert.deepEqual(
          answers.map((a) => a.status),
          held.map(() => 200),
        )
        assert.ok(answers.every((a) => a.headers.connection === 'close'))
        const workers = await Promise.all(answers.map((a) => servedBy(service, a.requestId)))
        assert.deepEqual([...new Set(workers)].sort(), [1, 2], 'writes held on both workers')
        assert.ok(whileHeld < exit.at, 'connections were refused while requests were still in flight')
        assert.equal(exit.code, 0)
        // Within SHUTDOWN_TIMEOUT of the signal, and five times what this machine took to act on it (the port closing).
        const deadline = SHUTDOWN_TIMEOUT_MS + SLOWDOWN * refusedAfter
        assert.ok(
          exitAfter < deadline,
          `exit ${Math.round(exitAfter)} ms after SIGTERM (bound ${Math.round(deadline)})`,
        )
        // Under load: before the signal, every answer 200; after it, 200, 503 shutting_down, or a connection refused
        // or closed before any answer (reset, or closed: "socket hang
        // up"), as with one process (test/fault-shutdown.test.ts).
        const unexpected = outcomes.filter(
          (o) =>
            !(
              o.status === 200 ||
              o.code === 'shutting_down' ||
              (o.ended > termAt && /ECONNREFUSED|ECONNRESET|socket hang up/.test(o.error ?? ''))
            ),
        )
        assert.deepEqual(unexpected, [], JSON.stringify(summarize(outcomes)))
        assert.ok(service.logs.some((l) => l.msg === 'stopped' && l.exit_code === 0))
        console.log(
          `# refused ${Math.round(refusedAfter)} ms after SIGTERM; ` +
            `exit ${Math.round(exitAfter)} ms after; load: ${JSON.stringify(summarize(outcomes))}`,
        )
      },
    )
  })

  // Beside the suite above, one service at a time: more processes starting at once only slow each other on two cores.
  describe('WORKERS=2: stops, by a signal to the group or by itself', { concurrency: 1 }, () => {
    test(
      'workers that die again and again are each replaced after a delay of their own that doubles; the other ' +
        'serves throughout, the service never stops, and the slot comes back',
      async () => {
        const service = await startWorkers()
        const lines = (msg: string) => service.logs.filter((l) => l.msg === msg)
        const listened = (worker: number) => lines('listening').filter((l) => l.worker === worker).length
        const latestPid = (worker: number) =>
          workerPids(service)
            .filter((p) => p.worker === worker)
            .at(-1)!.pid

        // A worker's lines go out a moment after it tells the primary it listens: its own line is what is counted.
        await waitFor('both workers to say they listen', () => listened(1) === 1 && listened(2) === 1)
        // Both at once: for a moment nothing serves the port, and the primary says so; both come back.
        process.kill(latestPid(1), 'SIGKILL')
        process.kill(latestPid(2), 'SIGKILL')
        await waitFor('both workers to listen again', () => listened(1) === 2 && listened(2) === 2, 30_000, 10)
        assert.equal(lines('no worker is serving; each is replaced as its delay ends').length, 1)

        // Then worker 1 again and again, each time once its replacement listens: six deaths within seconds, where
        // five within a minute used to stop the whole service.
        for (let deaths = 2; deaths <= 5; deaths++) {
          const pid = latestPid(1)
          process.kill(pid, 'SIGKILL')
          await waitFor(`the death of worker 1 (${pid})`, () => {
            assert.deepEqual(lines('stopping the service'), [], 'the service stopped')
            return lines('worker died; replacing it').some((l) => l.pid === pid)
          })
          // Its socket went with it: a new connection goes to worker 2 (or to worker 1's replacement, once it listens).
          const answer = await fresh(service, 'GET', `/users/${adminId}`)
          assert.equal(answer.status, 200, JSON.stringify(answer))
          const by = await servedBy(service, answer.requestId)
          assert.ok(by === 2 || listened(1) > deaths, `served by worker ${by} while worker 1 was down`)
          await waitFor(`worker 1 to listen again (death ${deaths})`, () => listened(1) === deaths + 1, 30_000, 10)
        }

        const died = lines('worker died; replacing it').map((l) => [l.worker, l.deaths_in_a_row, l.replace_in_ms])
        assert.deepEqual(died.slice(0, 2).sort(), [
          [1, 1, 100],
          [2, 1, 100],
        ])
        assert.deepEqual(died.slice(2), [
          [1, 2, 200],
          [1, 3, 400],
          [1, 4, 800],
          [1, 5, 1600],
        ])
        assert.ok(service.alive(), 'the service is still running')
        assert.deepEqual(lines('stopping the service'), [])
        // The slot is back: the set is whole again (at start, after both came back, after each of worker 1's four
        // returns), and both workers serve on the one port.
        await waitFor('the set to be whole again', () => lines('every worker is listening').length === 6)
        const served = new Set<number>()
        for (let i = 0; served.size < 2 && i < 40; i++) {
          const a = await fresh(service, 'GET', `/users/${adminId}`)
          assert.equal(a.status, 200)
          served.add(await servedBy(service, a.requestId))
        }
        assert.deepEqual([...served].sort(), [1, 2])
        assert.equal(await listeningSockets(service.port), 2)
      },
    )

    test(
      'in development (no JWT_SECRETS) a login on one worker is accepted by both; SIGINT to the whole process ' +
        'group (Ctrl-C): each worker drains once, exit 0',
      async () => {
        // JWT_SECRETS empty is unset: the secret generated into .data/jwt-secret (src/auth/secrets.ts), written by the
        // primary before it forks.
        const service = await startWorkers({ JWT_SECRETS: '' }, { detached: true })
        const email = `workers-dev-${Date.now()}@example.com`
        await db`INSERT INTO users (name, email, role, password_hash) VALUES
        ('Dev', ${email}, 'user', ${await testPasswords.hash('a long enough password')})`
        const login = await fresh(service, 'POST', '/auth/login', {}, { email, password: 'a long enough password' })
        assert.equal(login.status, 200)
        await acceptedByBoth(service, { authorization: `Bearer ${login.body.access_token}` })
        process.kill(-service.pid, 'SIGINT')
        const exit = await service.exited
        assert.equal(exit.code, 0)
        const lines = (msg: string) => service.logs.filter((l) => l.msg === msg)
        // Each worker drains once, on whichever came first: the terminal's SIGINT or its primary's SIGTERM.
        const drains = lines('shutting down')
        assert.deepEqual(
          drains.filter((l) => l.worker === undefined).map((l) => l.signal),
          ['SIGINT'],
        )
        assert.deepEqual(
          drains
            .filter((l) => l.worker !== undefined)
            .map((l) => l.worker)
            .sort(),
          [1, 2],
          JSON.stringify(drains),
        )
        assert.ok(
          drains.every((l) => l.worker === undefined || l.signal === 'SIGINT' || l.signal === 'SIGTERM'),
          JSON.stringify(drains),
        )
        assert.deepEqual(
          lines('worker stopped')
            .map((l) => [l.worker, l.code])
            .sort(),
          [
            [1, 0],
            [2, 0],
          ],
        )
        assert.deepEqual(lines('worker died; replacing it'), [])
      },
    )

    test('a port taken by another program stops the service at start, naming why, exit 1', async () => {
      const taken = createServer()
      await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve))
      after(() => taken.close())
      const port = (taken.address() as { port: number }).port
      const { code, stderr } = await startOnly({ WORKERS: '2', HOST: '127.0.0.1', PORT: String(port) })
      assert.equal(code, 1)
      assert.match(stderr, new RegExp(`^Cannot start: PORT=${port} on HOST=127.0.0.1: cannot listen \\(EADDRINUSE\\)`))
    })

    test('a worker that cannot start (an unreadable certificate) stops the service, naming why, exit 1', async () => {
      const service = launchService({
        DATABASE_URL: databaseUrl,
        WORKERS: '2',
        TLS_CERT_FILE: '/nonexistent/cert.pem',
        TLS_KEY_FILE: '/nonexistent/key.pem',
      })
      after(() => void (service.alive() && service.kill('SIGKILL')))
      const exit = await service.exited
      assert.equal(exit.code, 1)
      const reason = service.logs.find((l) => l.msg === 'stopping the service')
      assert.match(String(reason?.reason), /^worker \d exited before the service was up: .*\/nonexistent\/cert\.pem/)
    })

    test('bad WORKERS values are refused at start, naming the variable', async () => {
      const { code, stderr } = await startOnly({ WORKERS: '0' })
      assert.equal(code, 1)
      assert.equal(stderr, 'Cannot start: WORKERS: must be auto or an integer from 1 to 64 (got "0")\n')
      // The same check, without a process each: every kind of bad value.
      for (const value of ['65', 'two', '-1', '1.5', 'AUTO', ' 2']) {
        assert.throws(() => loadConfig({ WORKERS: value }), {
          message: `WORKERS: must be auto or an integer from 1 to 64 (got ${JSON.stringify(value)})`,
        })
      }
      assert.equal(loadConfig({}).workers, 1)
      assert.equal(loadConfig({ WORKERS: '64' }).workers, 64)
      assert.equal(loadConfig({ WORKERS: 'auto' }).workers, Math.min(availableParallelism(), 64))
    })
  })
})

test(
  'reusePortMissing (src/cluster/reuse-port.ts): Node 22.12+ on a platform that spreads connections; WORKERS>1 is ' +
    'refused elsewhere, naming why',
  () => {
    for (const version of ['22.12.0', '22.23.3', '23.1.0', '24.0.0', '26.10.0', '30.0.0'])
      assert.equal(reusePortMissing(version, 'linux'), undefined, version)
    for (const version of ['20.20.2', '22.11.0', '23.0.0'])
      assert.match(
        reusePortMissing(version, 'linux')!,
        new RegExp(`Node.js 22.12 or later .* this is ${version.replaceAll('.', '\\.')}$`),
      )
    assert.equal(reusePortMissing('26.10.0', 'freebsd'), undefined)
    assert.match(reusePortMissing('26.10.0', 'darwin')!, /which darwin does not have$/)
    // Through the configuration: the variable named, one process suggested.
    if (reusePortMissing() === undefined) assert.equal(loadConfig({ WORKERS: '2' }).workers, 2)
    else
      assert.throws(() => loadConfig({ WORKERS: '2' }), {
        message: /^WORKERS=2: .*; run one process per instance \(WORKERS=1\)$/,
      })
  },
)

describe('RestartPolicy (src/cluster/restart-policy.ts)', () => {
  test(
    "the delay doubles with each quick death of a slot up to 60 s, and starts again once the slot's worker stayed " +
      'up 30 s; another slot has a streak of its own',
    () => {
      const policy = new RestartPolicy()
      // Each worker of slot 1 lives a second.
      const delays = Array.from({ length: 14 }, (_, i) => policy.onDeath(1, i * 1000, i * 1000 + 1000).replaceInMs)
      assert.deepEqual(
        delays,
        [100, 200, 400, 800, 1600, 3200, 6400, 12_800, 25_600, 51_200, 60_000, 60_000, 60_000, 60_000],
      )
      assert.deepEqual(policy.onDeath(2, 20_000, 20_001), { replaceInMs: 100, deathsInARow: 1 })
      // Up 30 s: the streak is over.
      assert.deepEqual(policy.onDeath(1, 600_000, 630_000), { replaceInMs: 100, deathsInARow: 1 })
      assert.deepEqual(policy.onDeath(1, 630_100, 630_200), { replaceInMs: 200, deathsInARow: 2 })
    },
  )

  test('no number of deaths, of one slot or of all, within any time, is a reason to stop: each is replaced', () => {
    const policy = new RestartPolicy()
    for (let i = 0; i < 1000; i++) {
      const verdict = policy.onDeath(1 + (i % 4), i, i + 1)
      assert.deepEqual(Object.keys(verdict).sort(), ['deathsInARow', 'replaceInMs'])
      assert.ok(verdict.replaceInMs > 0 && verdict.replaceInMs <= 60_000, String(verdict.replaceInMs))
    }
    assert.deepEqual(policy.onDeath(1, 2000, 2001), { replaceInMs: 60_000, deathsInARow: 251 })
  })
})

/** How many sockets listen on 127.0.0.1:`port` (IPv4, /proc/net/tcp: state 0A is LISTEN). */
async function listeningSockets(port: number): Promise<number> {
  const local = `0100007F:${port.toString(16).toUpperCase().padStart(4, '0')}`
  const rows = (await readFile('/proc/net/tcp', 'utf8'))
    .split('\n')
    .slice(1)
    .map((row) => row.trim().split(/\s+/))
  return rows.filter((r) => r[1] === local && r[3] === '0A').length
}

/** Whether a connection to 127.0.0.1:`port` is refused now. */
function refused(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = netConnect(port, '127.0.0.1')
    socket.once('connect', () => (socket.destroy(), resolve(false)))
    socket.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'ECONNREFUSED'))
  })
}

/** The entry point with a configuration that stops it before any connection: how it ended. */
const startOnly = (env: Record<string, string>) => runCommand([], { DATABASE_URL: databaseUrl, ...env })
