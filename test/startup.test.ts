import assert from 'node:assert/strict'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer, type Server } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { pickCommand, usage, UsageError, type Commands } from '../src/cli.js'
import { connect } from '../src/core/db/connect.js'
import { call, launchService, OwnCluster, projectRoot, runCommand, waitFor, type CommandExit } from './fault-kit.js'
import { createTestDatabase, TEST_JWT_SECRET } from './helpers/server.js'
import { freePort } from './helpers/ports.js'
import { testHashCostFor } from './helpers/passwords.js'
import { MAIL_NOT_CONFIGURED } from '../src/mail/transport.js'

// Start-up and the command line, as a newcomer meets them (issue 26's
// table): the real entry point (dist/main.js) as a child process with
// exactly the environment given (PATH and HOME besides), its exit code,
// stderr and stdout. Each bad input must give one line per problem naming
// what to fix, no stack trace, never a password, and start nothing. The
// tests of a group run at once: each has its own process (and database), and
// most of their time is that process starting.

/** A line of a stack trace, or the JSON of one. */
const STACK = /\n\s+at |"stack"/
const serverUrl = () => process.env.TEST_SERVER_URL!

/** The shared test cluster's URL for `database` as `user` (with `password`, which trust authentication ignores). */
function clusterUrl(database: string, user = new URL(serverUrl()).username, password?: string): string {
  const url = new URL(serverUrl())
  url.username = user
  if (password) url.password = password
  url.pathname = `/${database}`
  return url.toString()
}

/** A database with nothing in it, not even the schema: whether a start migrated shows. */
async function emptyDatabase(): Promise<{ url: string; migrated(): Promise<boolean> }> {
  // One of the file's databases (test/run.ts drops them as the file ends).
  const url = await createTestDatabase({ empty: true })
  return {
    url,
    async migrated() {
      const sql = connect(url, { max: 1, statementTimeoutMs: 60_000 })
      try {
        const [row] = await sql<[{ table: string | null }]>`SELECT to_regclass('schema_migrations')::text AS table`
        return row.table !== null
      } finally {
        await sql.end({ timeout: 5 })
      }
    },
  }
}

function assertOneLine(exit: CommandExit, expected: string | RegExp): void {
  assert.equal(exit.code, 1, exit.stderr)
  const lines = exit.stderr.split('\n').filter(Boolean)
  assert.equal(lines.length, 1, `one line expected: ${exit.stderr}`)
  if (typeof expected === 'string') assert.equal(lines[0], expected)
  else assert.match(lines[0]!, expected)
  assert.doesNotMatch(exit.stderr, STACK)
}

describe('configuration', { concurrency: true }, () => {
  test('NODE_ENV=production with nothing set: every missing variable at once, one line each', async () => {
    const exit = await runCommand([], { NODE_ENV: 'production' })
    assert.equal(exit.code, 1)
    assert.equal(
      exit.stderr,
      'Cannot start: DATABASE_URL: required when NODE_ENV=production\nCannot start: JWT_SECRETS: required when ' +
        'NODE_ENV=production: comma-separated kid:secret pairs, each secret at least 32 bytes, the first signing; ' +
        'make one with echo "k1:$(openssl rand -base64 48)"\n',
    )
    assert.equal(exit.stdout, '')
  })

  test(
    'DATABSE_URL=… (a typo): refused naming DATABASE_URL, before the development database is started or anything ' +
      'logged',
    async () => {
      const exit = await runCommand([], { DATABSE_URL: clusterUrl('postgres'), PORT: '0' })
      assertOneLine(exit, 'Cannot start: DATABSE_URL: not a variable of this service; did you mean DATABASE_URL?')
      assert.equal(exit.stdout, '')
    },
  )

  test('secrets from <NAME>_FILE, and a variable with its _FILE twin refused naming both', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'upa-startup-'))
    after(() => rmSync(dir, { recursive: true, force: true }))
    const file = join(dir, 'jwt')
    writeFileSync(file, `k1:${TEST_JWT_SECRET}\n`)
    const exit = await runCommand([], {
      NODE_ENV: 'production',
      DATABASE_URL: 'postgres://app:pw@127.0.0.1:1/app',
      JWT_SECRETS: `k1:${TEST_JWT_SECRET}`,
      JWT_SECRETS_FILE: file,
    })
    assertOneLine(exit, 'Cannot start: JWT_SECRETS and JWT_SECRETS_FILE: both are set; set one or the other')
  })

  test(
    'JWT_SECRETS_FILE naming a file of many lines (/etc/shadow by mistake): exit 1, one line naming the variable, ' +
      'never the content',
    async () => {
      const dir = mkdtempSync(join(tmpdir(), 'upa-startup-'))
      after(() => rmSync(dir, { recursive: true, force: true }))
      const file = join(dir, 'shadow')
      writeFileSync(file, `k1:${TEST_JWT_SECRET}\nroot:$6$hunter2salt$hunter2hash:19000:0:99999:7:::\n`)
      const exit = await runCommand([], {
        NODE_ENV: 'production',
        DATABASE_URL: 'postgres://app:pw@127.0.0.1:1/app',
        JWT_SECRETS_FILE: file,
      })
      assertOneLine(
        exit,
        `Cannot start: JWT_SECRETS_FILE: ${file} holds more than one line: a secret file holds one line (and at ` +
          'most a final newline)',
      )
      assert.doesNotMatch(exit.stdout + exit.stderr, /hunter2|root:|k1:/)
      assert.equal(exit.stdout, '')
    },
  )
})

describe(
  'a database that cannot be had: one line naming the variable, host, port, database and user, never the password',
  { concurrency: true },
  () => {
    test('connection refused', async () => {
      const port = await freePort()
      const exit = await runCommand([], {
        DATABASE_URL: `postgres://api:hunter2-secret@127.0.0.1:${port}/app`,
        PORT: '0',
      })
      assertOneLine(
        exit,
        `Cannot start: DATABASE_URL: cannot connect to database "app" on ` +
          `127.0.0.1:${port} as user "api": connection refused (is PostgreSQL running there, listening on that ` +
          `address and port?)`,
      )
      assert.doesNotMatch(exit.stdout + exit.stderr, /hunter2/)
    })

    test('unknown host', async () => {
      const exit = await runCommand([], {
        DATABASE_URL: 'postgres://api:hunter2-secret@db.invalid:5432/app',
        PORT: '0',
      })
      assertOneLine(
        exit,
        /^Cannot start: DATABASE_URL: cannot connect to database "app" on db\.invalid:5432 as user "api": (unknown host|the host name could not be resolved now \(EAI_AGAIN\))$/,
      )
      assert.doesNotMatch(exit.stdout + exit.stderr, /hunter2/)
    })

    test("no such role, no such database (the server's own words)", async () => {
      const role = await runCommand([], {
        DATABASE_URL: clusterUrl('postgres', 'no_such_role', 'hunter2-secret'),
        PORT: '0',
      })
      assertOneLine(
        role,
        /^Cannot start: DATABASE_URL: cannot connect to database "postgres" on the Unix socket \/.*\/\.s\.PGSQL\.\d+ as user "no_such_role": role "no_such_role" does not exist$/,
      )
      const database = await runCommand([], {
        DATABASE_URL: clusterUrl('no_such_database', undefined, 'hunter2-secret'),
        PORT: '0',
      })
      assertOneLine(
        database,
        /^Cannot start: DATABASE_URL: cannot connect to database "no_such_database" on .* as user "\w+": database "no_such_database" does not exist$/,
      )
      assert.doesNotMatch(role.stderr + role.stdout + database.stderr + database.stdout, /hunter2/)
    })

    test('DATABASE_LISTEN_URL is named when it is the one that fails', async () => {
      const { url } = await emptyDatabase()
      const port = await freePort()
      const exit = await runCommand([], {
        DATABASE_URL: url,
        DATABASE_LISTEN_URL: `postgres://api:hunter2-secret@127.0.0.1:${port}/app`,
        PORT: '0',
      })
      assertOneLine(
        exit,
        new RegExp(
          `^Cannot start: DATABASE_LISTEN_URL: cannot connect to database "app" on ` +
            `127\\.0\\.0\\.1:${port} as user "api": connection refused`,
        ),
      )
    })

    test(
      '%zz in the password: refused as a configuration error naming DATABASE_URL, not the driver\'s "URI ' +
        'malformed"',
      async () => {
        const exit = await runCommand([], { DATABASE_URL: 'postgres://api:hunter2%zz@127.0.0.1:5432/app', PORT: '0' })
        assertOneLine(
          exit,
          'Cannot start: DATABASE_URL: its user, password or host holds a % that is not followed by two hexadecimal ' +
            'digits; write a % as %25 (percent-encode the password: encodeURIComponent)',
        )
        assert.doesNotMatch(exit.stdout + exit.stderr, /hunter2|URIError/)
      },
    )

    describe('a wrong password (a cluster of its own, with password authentication for one role)', () => {
      let cluster: OwnCluster
      before(async () => {
        cluster = await OwnCluster.create()
        // First match wins: the role logs in with its password; the superuser keeps trust.
        const hba = join(cluster.data, 'pg_hba.conf')
        writeFileSync(hba, `local all upa_password_role scram-sha-256\n${readFileSync(hba, 'utf8')}`)
        const sql = connect(cluster.url(), { max: 1, statementTimeoutMs: 10_000 })
        try {
          await sql`CREATE ROLE upa_password_role LOGIN PASSWORD 'the-right-password'`
          await sql`SELECT pg_reload_conf()`
        } finally {
          await sql.end({ timeout: 5 })
        }
      })
      after(() => cluster?.destroy())

      test('names the user and database, never the password given', async () => {
        const exit = await runCommand([], {
          DATABASE_URL:
            'postgres://upa_password_role:a-wrong-password@localhost/postgres?host=' +
            encodeURIComponent(cluster.sockets),
          PORT: '0',
        })
        assertOneLine(
          exit,
          /^Cannot start: DATABASE_URL: cannot connect to database "postgres" on the Unix socket .* as user "upa_password_role": password authentication failed for user "upa_password_role"$/,
        )
        assert.doesNotMatch(exit.stdout + exit.stderr, /a-wrong-password|the-right-password/)
      })
    })
  },
)

describe('the port', { concurrency: true }, () => {
  let holder: Server
  let port: number
  before(async () => {
    holder = createServer()
    await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve))
    port = (holder.address() as { port: number }).port
  })
  after(() => holder.close())

  for (const workers of ['1', '2']) {
    test(`in use (WORKERS=${workers}): one line, the same as a primary's, and no migration has run`, async () => {
      const db = await emptyDatabase()
      const exit = await runCommand([], {
        DATABASE_URL: db.url,
        HOST: '127.0.0.1',
        PORT: String(port),
        WORKERS: workers,
      })
      assertOneLine(
        exit,
        `Cannot start: PORT=${port} on HOST=127.0.0.1: cannot listen (EADDRINUSE); is another copy of the service ` +
          `running?`,
      )
      assert.equal(await db.migrated(), false, 'migrations ran before the port was claimed')
    })
  }
})

describe('commands', { concurrency: true }, () => {
  test(
    'migrate in production needs no JWT_SECRETS: it signs nothing, so a migration job is not given ' + 'them',
    async () => {
      const db = await emptyDatabase()
      const exit = await runCommand(['migrate'], { NODE_ENV: 'production', DATABASE_URL: db.url })
      assert.equal(exit.code, 0, exit.stderr)
      assert.equal(await db.migrated(), true)
      const serve = await runCommand([], { NODE_ENV: 'production', DATABASE_URL: db.url, PORT: '0' })
      assertOneLine(serve, /^Cannot start: JWT_SECRETS: required when NODE_ENV=production: /)
    },
  )

  for (const args of [['--help'], ['help'], ['-h']]) {
    test(`${args[0]}: the usage on stdout, exit 0, nothing started`, async () => {
      const exit = await runCommand(args, {})
      assert.equal(exit.code, 0, exit.stderr)
      assert.equal(exit.stderr, '')
      assert.match(exit.stdout, /^Usage: node dist\/main\.js \[command\]\n/)
      for (const line of [
        /^ {2}serve +.*\(the default: no command\)$/m,
        /^ {2}migrate +/m,
        /^ {2}admin <email> +/m,
        /^ {2}help +/m,
        /docs\/operations\.md/,
      ])
        assert.match(exit.stdout, line)
    })
  }

  test('an unknown command (mgirate): refused with the closest and the list, exit 2, nothing started', async () => {
    const db = await emptyDatabase()
    const exit = await runCommand(['mgirate'], { DATABASE_URL: db.url })
    assert.equal(exit.code, 2)
    assert.equal(exit.stdout, '')
    assert.match(
      exit.stderr,
      /^unknown command "mgirate"; did you mean migrate\?\n\nUsage: node dist\/main\.js \[command\]\n/,
    )
    assert.match(exit.stderr, /^ {2}migrate +/m)
    assert.equal(await db.migrated(), false)
  })

  test('arguments a command does not take: exit 2', async () => {
    const exit = await runCommand(['migrate', 'now'], {})
    assert.equal(exit.code, 2)
    assert.match(exit.stderr, /^migrate takes no arguments, not "now"\n/)
  })

  test('the table: --help is help; a command is matched whole; an own property only', () => {
    const ran: string[] = []
    const table: Commands = {
      serve: { summary: 'serves', run: async () => void ran.push('serve') },
      migrate: { summary: 'migrates', run: async () => void ran.push('migrate') },
      help: { summary: 'helps', run: async () => void ran.push('help') },
    }
    assert.equal(pickCommand(table, []).name, 'serve')
    assert.equal(pickCommand(table, ['--help']).name, 'help')
    for (const argv of [['migrat'], ['MIGRATE'], ['toString'], ['--port', '80'], ['constructor']])
      assert.throws(() => pickCommand(table, argv), UsageError, argv.join(' '))
    assert.throws(() => pickCommand(table, ['migrat']), { message: 'unknown command "migrat"; did you mean migrate?' })
    assert.throws(() => pickCommand(table, ['deploy']), { message: 'unknown command "deploy"' })
    assert.match(
      usage(table, join(projectRoot, 'dist/main.js')),
      /^Usage: node .*dist\/main\.js \[command\]\n\nCommands:\n {2}serve {4}serves \(the default: no command\)\n {2}migrate {2}migrates\n {2}help {5}helps\n/,
    )
  })
})

describe('make admin', () => {
  test('without an e-mail: exit 2, what it needs and the usage; no admin made up, nothing started', async () => {
    const db = await emptyDatabase()
    const exit = await runCommand(['admin'], { DATABASE_URL: db.url })
    assert.equal(exit.code, 2, exit.stderr)
    assert.equal(exit.stdout, '')
    assert.match(exit.stderr, /^admin needs the e-mail of the admin to create or reset: admin <email> \(make admin/)
    assert.match(exit.stderr, /^Usage: /m)
    assert.equal(await db.migrated(), false)
  })

  test('its failures say that the admin could not be created, not that something could not start', async () => {
    const exit = await runCommand(['admin', 'someone@example.com'], {
      DATABASE_URL: 'postgres://api@127.0.0.1:1/api',
      ADMIN_PASSWORD: 'a password nobody sees',
    })
    assertOneLine(exit, /^Cannot create the admin: DATABASE_URL: cannot connect to database "api" on 127\.0\.0\.1:1 /)
    const invalid = await runCommand(['admin', 'not-an-email'], { DATABASE_URL: await createTestDatabase() })
    assertOneLine(invalid, /^Cannot create the admin: email /)
  })

  test('a password given on standard input is never printed back; one from ADMIN_PASSWORD_FILE neither', async () => {
    const url = await createTestDatabase()
    const env = { DATABASE_URL: url, JWT_SECRETS: `k:${TEST_JWT_SECRET}`, LOG_LEVEL: 'error', ...testHashCostFor({}) }
    const piped = await runCommand(['admin', 'piped.admin@example.com'], env, 'piped password 123\n')
    assert.equal(piped.code, 0, piped.stderr)
    assert.match(
      piped.stdout,
      /^Created admin piped\.admin@example\.com \(id \d+\) with the password from standard input\.\n$/,
    )

    const dir = mkdtempSync(join(tmpdir(), 'upa-admin-'))
    after(() => rmSync(dir, { recursive: true, force: true }))
    writeFileSync(join(dir, 'password'), 'password from a file\n')
    const filed = await runCommand(['admin', 'piped.admin@example.com'], {
      ...env,
      ADMIN_PASSWORD_FILE: join(dir, 'password'),
    })
    assert.equal(filed.code, 0, filed.stderr)
    assert.match(
      filed.stdout,
      /^Reset admin piped\.admin@example\.com \(id \d+\) with the password from ADMIN_PASSWORD_FILE\.\n$/,
    )
    for (const exit of [piped, filed])
      assert.doesNotMatch(exit.stdout + exit.stderr, /piped password|password from a file/)
  })
})

describe('start-up lines', { concurrency: true }, () => {
  test(
    'without NODE_ENV: development said loudly (a warning with the generated secret and how to run in ' +
      'production), on 127.0.0.1; the database without its password; duration_ms rounded',
    async () => {
      const url = new URL(await createTestDatabase())
      url.password = 'hunter2-secret' // trust authentication ignores it; it must not show
      // HOST and JWT_SECRETS unset (empty counts as unset): what `npm start` meets.
      const service = await launchService({
        DATABASE_URL: url.toString(),
        HOST: '',
        JWT_SECRETS: '',
        LOG_LEVEL: 'info',
      }).listening
      after(() => service.alive() && service.kill('SIGKILL'))
      const listening = service.logs.find((l) => l.msg === 'listening')
      assert.equal(listening?.address, '127.0.0.1')
      const warning = service.logs.find(
        (l) => l.level === 'warn' && l.msg === 'development mode: NODE_ENV is not "production"',
      )
      assert.ok(warning, JSON.stringify(service.logs))
      assert.match(String(warning.jwt_secrets), /^generated, kept in .*jwt-secret$/)
      assert.match(String(warning.for_production), /NODE_ENV=production/)
      const starting = service.logs.find((l) => l.msg === 'starting')
      assert.deepEqual(
        {
          mode: starting?.mode,
          host: starting?.host,
          database_name: starting?.database_name,
          database_user: starting?.database_user,
          pooler: starting?.pooler,
          workers: starting?.workers,
        },
        {
          mode: 'development',
          host: '127.0.0.1',
          database_name: url.pathname.slice(1),
          database_user: url.username,
          pooler: 'none',
          workers: 1,
        },
      )
      assert.match(String(starting?.database_host), /^\//, 'the Unix socket folder of the test cluster')

      for (let i = 0; i < 5; i++) assert.equal((await call(service.url, 'GET', '/healthz')).status, 200)
      await waitFor('the request lines', () => service.logs.filter((l) => l.msg === 'request').length >= 5, 10_000)
      for (const line of service.logs.filter((l) => l.msg === 'request')) {
        const ms = line.duration_ms as number
        assert.ok(ms >= 0 && Math.round(ms * 1000) / 1000 === ms, `duration_ms ${ms} is not rounded to the microsecond`)
      }
      assert.doesNotMatch(JSON.stringify(service.logs) + service.stderr(), /hunter2/)
    },
  )

  test(
    'NODE_ENV=production with secrets from files: 0.0.0.0 unless HOST says otherwise, no development ' + 'warning',
    async () => {
      const dir = mkdtempSync(join(tmpdir(), 'upa-startup-'))
      after(() => rmSync(dir, { recursive: true, force: true }))
      writeFileSync(join(dir, 'url'), `${await createTestDatabase()}\n`)
      writeFileSync(join(dir, 'jwt'), `k1:${TEST_JWT_SECRET}\n`)
      const service = await launchService({
        NODE_ENV: 'production',
        HOST: '',
        JWT_SECRETS: '',
        DATABASE_URL_FILE: join(dir, 'url'),
        JWT_SECRETS_FILE: join(dir, 'jwt'),
      }).listening
      assert.equal(service.logs.find((l) => l.msg === 'listening')?.address, '0.0.0.0')
      assert.equal(service.logs.find((l) => l.msg === 'starting')?.mode, 'production')
      // The one warning: no mail transport is configured (docs/auth.md, "Account recovery: rules").
      assert.deepEqual(
        service.logs.filter((l) => l.level === 'warn').map((l) => l.msg),
        [MAIL_NOT_CONFIGURED],
        JSON.stringify(service.logs),
      )
      service.kill('SIGTERM')
      assert.equal((await service.exited).code, 0)
    },
  )
})
