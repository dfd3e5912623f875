import assert from 'node:assert/strict'
import { after, describe, test } from 'node:test'
import type { Sql } from 'postgres'
import { loadConfig } from '../src/config.js'
import { createLogger } from '../src/core/log.js'
import { createService } from '../src/service.js'
import { testHashCostFor } from './helpers/passwords.js'
import { createTestDatabase, TEST_JWT_SECRET } from './helpers/server.js'
import { freePort } from './helpers/ports.js'
import { launchService, spawnCommand, type CommandExit, type Spawned } from './fault-kit.js'

// The first admin: `node dist/main.js admin <email> [password]` (make admin),
// ADMIN_EMAIL + ADMIN_PASSWORD at start-up, and the start-up refusal without
// JWT_SECRETS in production. Each test runs the real entry point as a child
// process against a database of its own, and checks the result through the
// database and a login. Passwords are hashed at the suite's cost but in
// production, which refuses it (testHashCostFor). The tests of a group run at
// once: most of their time is processes starting.

const JWT_SECRETS = `test:${TEST_JWT_SECRET}`
/** A line of a stack trace: operators get a message, not a trace. */
const STACK_LINE = /\bat .*\.ts:\d+/

// ---------------------------------------------------------------------------
// Helpers

/** The entry point as a command, quiet but for errors unless the test says otherwise. */
const runMain = (args: string[], env: Record<string, string>, input?: string) =>
  spawnCommand(args, { LOG_LEVEL: 'error', ...testHashCostFor(env), ...env }, input).exited

/** The service on a port of its own choosing, once it listens (its own "listening" line says where). */
async function startMain(env: Record<string, string>): Promise<Spawned> {
  const service = launchService({ JWT_SECRETS, ...env })
  after(() => void (service.alive() && service.kill('SIGKILL')))
  return service.listening
}

/** SIGTERM, and how the service exited: 0, by itself. */
async function assertStopsCleanly(service: Spawned): Promise<void> {
  service.kill('SIGTERM')
  const exit = await service.exited
  assert.equal(exit.signal, null, service.stderr())
  assert.equal(exit.code, 0, service.stderr())
}

interface Database {
  url: string
  sql: Sql
  /** The application on this database. */
  appUrl: string
  /** POST /auth/login through the application on this database; the status. */
  login(email: string, password: string): Promise<number>
}

/** A fresh migrated database, with the service (createService) on it for logins. */
async function database(): Promise<Database> {
  const url = await createTestDatabase()
  const config = {
    ...loadConfig({ PORT: '0', HOST: '127.0.0.1', LOG_LEVEL: 'error', JWT_SECRETS, ...testHashCostFor({}) }),
    databaseUrl: url,
    databasePooler: 'none' as const,
  }
  const service = createService(
    { ...config, poolMax: 2, statementTimeoutMs: 10_000 },
    { log: createLogger('error', () => {}) },
  )
  after(() => service.close())
  const appUrl = `http://127.0.0.1:${(await service.listen(0, '127.0.0.1')).port}`
  const { sql } = service.deps
  return { url, sql, appUrl, login: (email, password) => loginAt(appUrl, email, password) }
}

async function loginAt(baseUrl: string, email: string, password: string): Promise<number> {
  const res = await fetch(`${baseUrl}/auth/login`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ email, password }),
  })
  await res.arrayBuffer()
  return res.status
}

interface UserRow {
  id: number
  email: string
  name: string
  role: string
  password_hash: string | null
  version: number
}
const usersIn = (sql: Sql) =>
  sql<UserRow[]>`SELECT id, email, name, role, password_hash, version FROM users ORDER BY id`

// A generated password is printed (it is shown nowhere else); a given one never is, only where it came from.
const CREATED =
  /^(Created|Reset) admin (\S+) \(id (\d+)\)(?:\. Password: (.+)| with the password from (ADMIN_PASSWORD|standard input)\.)\n$/
function parseAdminOutput(exit: CommandExit): {
  verb: string
  email: string
  id: number
  password: string | undefined
  source: string | undefined
} {
  assert.equal(exit.code, 0, exit.stderr)
  const m = CREATED.exec(exit.stdout)
  assert.ok(m, `unexpected output: ${JSON.stringify(exit.stdout)}`)
  return { verb: m[1]!, email: m[2]!, id: Number(m[3]), password: m[4], source: m[5] }
}

// ---------------------------------------------------------------------------
// make admin

describe('dist/main.js admin <email> (password from ADMIN_PASSWORD or standard input)', { concurrency: true }, () => {
  test(
    'without a password creates the admin and prints a generated password that logs in; again, it resets it and ' +
      'ends its sessions',
    async () => {
      const db = await database()
      const email = 'first.admin@example.com'

      const first = parseAdminOutput(await runMain(['admin', email], { DATABASE_URL: db.url, JWT_SECRETS }))
      assert.equal(first.verb, 'Created')
      assert.equal(first.email, email)
      assert.ok(first.password && first.password.length >= 16, `a weak generated password: ${first.password}`)
      const [row, ...others] = await usersIn(db.sql)
      assert.equal(others.length, 0)
      assert.deepEqual({ id: row!.id, email: row!.email, role: row!.role }, { id: first.id, email, role: 'admin' })
      assert.ok(!row!.password_hash!.includes(first.password), 'the password is stored in clear')
      assert.equal(await db.login(email, first.password!), 200)

      // Again for the same e-mail: a new password, the old one no longer works, still one row, its sessions ended.
      const second = parseAdminOutput(await runMain(['admin', email], { DATABASE_URL: db.url, JWT_SECRETS }))
      assert.equal(second.verb, 'Reset')
      assert.equal(second.id, first.id)
      assert.ok(second.password && second.password !== first.password)
      const rows = await usersIn(db.sql)
      assert.equal(rows.length, 1)
      assert.equal(rows[0]!.role, 'admin')
      assert.equal(rows[0]!.version, row!.version + 1)
      const [{ live }] = await db.sql<
        [{ live: number }]
      >`SELECT count(*)::int AS live FROM sessions WHERE user_id = ${first.id} AND revoked_at IS NULL`
      assert.equal(live, 0, 'the session of the first login was ended')
      assert.equal(await db.login(email, first.password!), 401)
      assert.equal(await db.login(email, second.password!), 200)
    },
  )

  test(
    'the password from ADMIN_PASSWORD, or the first line of standard input; the e-mail matches without regard to ' +
      'case',
    async () => {
      const db = await database()
      const created = parseAdminOutput(
        await runMain(['admin', 'Case.Admin@Example.com'], {
          DATABASE_URL: db.url,
          JWT_SECRETS,
          ADMIN_PASSWORD: 'first chosen password',
        }),
      )
      assert.deepEqual(
        [created.password, created.source],
        [undefined, 'ADMIN_PASSWORD'],
        'a password given is not printed back',
      )
      const reset = parseAdminOutput(
        await runMain(
          ['admin', 'case.admin@example.COM'],
          { DATABASE_URL: db.url, JWT_SECRETS },
          'second chosen password\nignored\n',
        ),
      )
      assert.equal(reset.verb, 'Reset')
      assert.equal(reset.id, created.id)
      assert.deepEqual([reset.password, reset.source], [undefined, 'standard input'])
      const rows = await usersIn(db.sql)
      assert.deepEqual(
        rows.map((r) => [r.email, r.role]),
        [['Case.Admin@Example.com', 'admin']],
        'one row, the e-mail as first stored',
      )
      assert.equal(await db.login('case.admin@example.com', 'first chosen password'), 401)
      assert.equal(await db.login('Case.Admin@Example.com', 'second chosen password'), 200)
    },
  )

  test(
    'an existing account that is not an admin is not promoted: exit 1 with the way to do it, nothing ' + 'changed',
    async () => {
      const db = await database()
      await db.sql`INSERT INTO users (name, email) VALUES ('Plain Person', 'plain@example.com')`
      const before = await usersIn(db.sql)
      const exit = await runMain(['admin', 'PLAIN@example.com'], {
        DATABASE_URL: db.url,
        JWT_SECRETS,
        ADMIN_PASSWORD: 'promoted password',
      })
      assert.equal(exit.code, 1, exit.stdout)
      assert.match(exit.stderr, /not an admin/)
      assert.doesNotMatch(exit.stderr, STACK_LINE)
      assert.ok(!exit.stderr.includes('promoted password'))
      assert.deepEqual([...(await usersIn(db.sql))], [...before])
      assert.equal(await db.login('plain@example.com', 'promoted password'), 401)
    },
  )

  test('a password on the command line is refused (ps would show it), and not echoed', async () => {
    const db = await database()
    const exit = await runMain(['admin', 'argv.admin@example.com', 'visible in ps'], {
      DATABASE_URL: db.url,
      JWT_SECRETS,
    })
    assert.equal(exit.code, 1)
    assert.match(exit.stderr, /ADMIN_PASSWORD or on standard input/)
    assert.ok(!exit.stderr.includes('visible in ps') && !exit.stdout.includes('visible in ps'))
    assert.equal((await usersIn(db.sql)).length, 0)
  })

  test(
    "the admin's user.created event carries the row as stored, verified; a reset of an unverified admin's password " +
      'records its verification in its user.updated event',
    async () => {
      const db = await database()
      const password = 'an event-checked password'
      const made = parseAdminOutput(
        await runMain(['admin', 'evented.admin@example.com'], {
          DATABASE_URL: db.url,
          JWT_SECRETS,
          ADMIN_PASSWORD: password,
        }),
      )
      const login = await fetch(`${db.appUrl}/auth/login`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ email: 'evented.admin@example.com', password }),
      })
      const { access_token: token } = (await login.json()) as { access_token: string }
      const shown = async (id: number) => {
        const res = await fetch(`${db.appUrl}/users/${id}`, { headers: { authorization: `Bearer ${token}` } })
        assert.equal(res.status, 200)
        return (await res.json()) as Record<string, unknown>
      }
      // Published or not yet: the outbox and the feed together.
      const eventsOf = (id: number) =>
        db.sql<Array<{ type: string; data: Record<string, unknown> }>>`
          SELECT type, data FROM (
            SELECT seq AS n, type, data, subject_type, subject_id FROM event_outbox
            UNION ALL SELECT id, type, data, subject_type, subject_id FROM events
          ) e WHERE subject_type = 'user' AND subject_id = ${id} ORDER BY n`
      const stored = await shown(made.id)
      assert.notEqual(stored.email_verified_at, null)
      const created = (await eventsOf(made.id)).filter((e) => e.type === 'user.created')
      assert.equal(created.length, 1)
      assert.deepEqual(created[0]!.data, stored)

      // An admin whose address was never verified (made before verification existed, or through psql).
      const [old] = await db.sql<[{ id: number }]>`
        INSERT INTO users (name, email, role) VALUES ('Old Admin', 'old.admin@example.com', 'admin') RETURNING id`
      parseAdminOutput(
        await runMain(['admin', 'old.admin@example.com'], {
          DATABASE_URL: db.url,
          JWT_SECRETS,
          ADMIN_PASSWORD: password,
        }),
      )
      const reset = await shown(old.id)
      assert.notEqual(reset.email_verified_at, null)
      const updated = (await eventsOf(old.id)).filter((e) => e.type === 'user.updated')
      assert.deepEqual(updated.at(-1)?.data, reset)
    },
  )

  const refused: Array<[string, string[], Record<string, string>, RegExp]> = [
    ['an e-mail without a domain', ['admin', 'not-an-email'], {}, /email/],
    ['an e-mail without a dot in the domain', ['admin', 'root@localhost'], {}, /email/],
    [
      'a password under 8 characters',
      ['admin', 'short.password@example.com'],
      { ADMIN_PASSWORD: 'seven77' },
      /password/,
    ],
  ]
  test('refuses invalid input: exits non-zero, says why without a stack trace, creates nothing', async () => {
    const db = await database()
    const exits = await Promise.all(
      refused.map(([, args, env]) => runMain(args, { DATABASE_URL: db.url, JWT_SECRETS, ...env })),
    )
    for (const [i, exit] of exits.entries()) {
      const [label, , env, message] = refused[i]!
      assert.notEqual(exit.code, 0, `${label}: exit code`)
      assert.match(exit.stderr, /^Cannot create the admin: /, label)
      assert.notEqual(exit.code, null, `${label}: killed, not exited`)
      assert.match(exit.stderr, message, label)
      assert.doesNotMatch(exit.stderr, STACK_LINE, `${label}: a stack trace`)
      assert.equal(exit.stdout, '', `${label}: printed ${exit.stdout}`)
      if (env.ADMIN_PASSWORD) assert.ok(!exit.stderr.includes(env.ADMIN_PASSWORD), `${label}: the password is echoed`)
    }
    assert.equal((await usersIn(db.sql)).length, 0, 'a user was created')
  })
})

// ---------------------------------------------------------------------------
// ADMIN_EMAIL + ADMIN_PASSWORD at start-up

describe('ADMIN_EMAIL and ADMIN_PASSWORD at start-up', { concurrency: true }, () => {
  test('create the admin when no admin exists (plain users do not count); it logs in; SIGTERM exits 0', async () => {
    const db = await database()
    await db.sql`INSERT INTO users (name, email) VALUES ('Plain Person', 'plain@example.com')`
    const service = await startMain({
      DATABASE_URL: db.url,
      ADMIN_EMAIL: 'boot@example.com',
      ADMIN_PASSWORD: 'bootstrap password',
    })

    const rows = await usersIn(db.sql)
    assert.deepEqual(
      rows.map((r) => [r.email, r.role]),
      [
        ['plain@example.com', 'user'],
        ['boot@example.com', 'admin'],
      ],
    )
    assert.equal(await loginAt(service.url, 'boot@example.com', 'bootstrap password'), 200)
    await assertStopsCleanly(service)
  })

  test('ADMIN_EMAIL naming an existing account that is not an admin: start-up refused, nothing promoted', async () => {
    const db = await database()
    await db.sql`INSERT INTO users (name, email) VALUES ('Self Registered', 'early@example.com')`
    const exit = await runMain([], {
      DATABASE_URL: db.url,
      JWT_SECRETS,
      ADMIN_EMAIL: 'early@example.com',
      ADMIN_PASSWORD: 'takeover password',
    })
    assert.equal(exit.code, 1)
    assert.match(exit.stderr, /not an admin/)
    assert.ok(!exit.stderr.includes('takeover password'))
    assert.deepEqual(
      (await usersIn(db.sql)).map((r) => [r.email, r.role]),
      [['early@example.com', 'user']],
    )
  })

  test('do nothing when an admin exists: no new admin, and no password reset of an existing one', async () => {
    const db = await database()
    const out = parseAdminOutput(
      await runMain(['admin', 'sitting@example.com'], {
        DATABASE_URL: db.url,
        JWT_SECRETS,
        ADMIN_PASSWORD: 'the sitting password',
      }),
    )
    const before = await usersIn(db.sql)

    const [newcomer, sameEmail] = await Promise.all([
      startMain({ DATABASE_URL: db.url, ADMIN_EMAIL: 'newcomer@example.com', ADMIN_PASSWORD: 'newcomer password' }),
      startMain({ DATABASE_URL: db.url, ADMIN_EMAIL: 'sitting@example.com', ADMIN_PASSWORD: 'a replacement password' }),
    ])
    assert.deepEqual([...(await usersIn(db.sql))], [...before], 'start-up changed the users')
    assert.equal(out.source, 'ADMIN_PASSWORD')
    assert.equal(await loginAt(sameEmail.url, 'sitting@example.com', 'the sitting password'), 200)
    assert.equal(await loginAt(newcomer.url, 'newcomer@example.com', 'newcomer password'), 401)

    await Promise.all([newcomer, sameEmail].map(assertStopsCleanly))
  })
})

// ---------------------------------------------------------------------------
// Production

describe('NODE_ENV=production', { concurrency: true }, () => {
  test('without JWT_SECRETS the service exits 1 naming JWT_SECRETS', async () => {
    const url = await createTestDatabase()
    const port = await freePort()
    const exit = await runMain([], { NODE_ENV: 'production', DATABASE_URL: url, PORT: String(port), HOST: '127.0.0.1' })
    assert.equal(exit.code, 1, exit.stderr)
    assert.match(exit.stderr, /JWT_SECRETS/)
    assert.doesNotMatch(exit.stderr, STACK_LINE)
  })

  test('with JWT_SECRETS it starts (the refusal is about the secret alone)', async () => {
    const url = await createTestDatabase()
    await assertStopsCleanly(await startMain({ NODE_ENV: 'production', DATABASE_URL: url }))
  })
})
