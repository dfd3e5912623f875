import assert from 'node:assert/strict'
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import type { Sql } from 'postgres'
import { connect } from '../src/core/db/connect.js'
import { parseConnectionString } from '../src/core/db/connection-string.js'
import { call, launchService, OwnCluster, runCommand, waitFor, type CommandExit } from './fault-kit.js'
import { certificateFromAuthority, createCertificateAuthority, type TestCertificate } from './helpers/certificates.js'
import { onFreePorts } from './helpers/ports.js'
import { createTestDatabase } from './helpers/server.js'

// TLS to the database and the socket forms of its URL (docs/operations.md,
// "TLS to the database"), as an operator writes them, against a real
// PostgreSQL of this file's own: ssl = on, with a certificate for
// `localhost` only (not 127.0.0.1) from a CA of the file's own, which no
// process here trusts unless told; listening on 127.0.0.1, where pg_hba.conf
// takes connections over TLS only (hostssl), and the role upa_cert by its
// client certificate only (`cert`). The service runs as production does
// (dist/main.js): it must start and serve with what should work, and say in
// one line, naming the variable, why it cannot start with what should not.

const STACK = /\n\s+at |"stack"/
const DATABASE = 'tls_app'

let dir: string
let cluster: OwnCluster
let admin: Sql
let ca: string
let otherCa: string
let client: TestCertificate
/** The URL of `user` on this file's cluster at `host` (localhost or 127.0.0.1), with these parameters. */
let url: (user: string, host: string, params: Record<string, string>) => string

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'upa-database-tls-'))
  for (const name of ['ca', 'other']) mkdirSync(join(dir, name))
  const authority = createCertificateAuthority(join(dir, 'ca'))
  ca = authority.cert
  otherCa = createCertificateAuthority(join(dir, 'other')).cert
  const server = certificateFromAuthority(dir, 'server', authority, { names: ['DNS:localhost'] })
  client = certificateFromAuthority(dir, 'upa_cert', authority, { names: [], client: true })
  cluster = await onFreePorts(1, ([port]) =>
    OwnCluster.create({
      port,
      settings: { ssl: 'on', ssl_cert_file: 'server.crt', ssl_key_file: 'server.key', ssl_ca_file: 'ca.crt' },
      prepare: async (c) => {
        await c.place('server.crt', readFileSync(server.cert, 'utf8'))
        await c.place('server.key', readFileSync(server.key, 'utf8'))
        await c.place('ca.crt', readFileSync(ca, 'utf8'))
        // First match wins: the Unix socket for this file's own set-up; over TCP, TLS or nothing.
        await c.place(
          'pg_hba.conf',
          ['local all all trust', 'hostssl all upa_cert 127.0.0.1/32 cert', 'hostssl all all 127.0.0.1/32 trust'].join(
            '\n',
          ) + '\n',
        )
      },
    }),
  )
  url = (user, host, params) =>
    `postgres://${user}@${host}:${cluster.port}/${DATABASE}?${new URLSearchParams(params).toString()}`
  admin = connect(cluster.url(), { max: 1, statementTimeoutMs: 10_000 })
  // upa_cert owns the database and migrates it; upa_app, the service's role, has its rights through it.
  await admin`CREATE ROLE upa_cert LOGIN`
  await admin`CREATE ROLE upa_app LOGIN IN ROLE upa_cert`
  await admin`CREATE DATABASE ${admin(DATABASE)} OWNER upa_cert`
  await admin`CREATE DATABASE tls_extra OWNER upa_app`
})

after(async () => {
  await admin?.end({ timeout: 5 })
  await cluster?.destroy()
  rmSync(dir, { recursive: true, force: true })
})

function assertOneLine(exit: CommandExit, expected: RegExp): void {
  assert.equal(exit.code, 1, exit.stderr)
  const lines = exit.stderr.split('\n').filter(Boolean)
  assert.equal(lines.length, 1, `one line expected: ${exit.stderr}`)
  assert.match(lines[0]!, expected)
  assert.doesNotMatch(exit.stderr, STACK)
}

const escaped = (text: string) => text.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')

test(
  'verify-full with sslrootcert, require, and a client certificate with verify-ca at a host the certificate does ' +
    'not name: the service migrates, serves, and every connection it holds is encrypted',
  async () => {
    const service = await launchService({
      DATABASE_URL: url('upa_app', 'localhost', { sslmode: 'verify-full', sslrootcert: ca }),
      DATABASE_LISTEN_URL: url('upa_app', '127.0.0.1', { sslmode: 'require', application_name: 'upa-listen' }),
      DATABASE_MIGRATION_URL: url('upa_cert', '127.0.0.1', {
        sslmode: 'verify-ca',
        sslrootcert: ca,
        sslcert: client.cert,
        sslkey: client.key,
      }),
    }).listening
    after(() => service.alive() && service.kill('SIGKILL'))
    assert.equal((await call(service.url, 'GET', '/readyz')).status, 200)

    // Migrated by upa_cert, which can log in with its client certificate only.
    const owned = connect(cluster.url(DATABASE), { max: 1, statementTimeoutMs: 10_000 })
    after(() => owned.end({ timeout: 5 }))
    const [table] = await owned<[{ owner: string }]>`
      SELECT tableowner AS owner FROM pg_tables WHERE schemaname = 'public' AND tablename = 'schema_migrations'`
    assert.equal(table?.owner, 'upa_cert')

    // The service's sessions: over TCP (this file's own come through the Unix socket).
    const sessions = () => admin<Array<{ user: string; application: string; ssl: boolean }>>`
      SELECT a.usename AS user, a.application_name AS application, s.ssl
      FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
      WHERE a.datname = ${DATABASE} AND a.backend_type = 'client backend' AND a.client_addr IS NOT NULL`
    await waitFor('the listening connection', async () =>
      (await sessions()).some((s) => s.application === 'upa-listen'),
    )
    const held = await sessions()
    assert.ok(
      held.some((s) => s.application === 'users-products-api'),
      `the pool's connections: ${JSON.stringify(held)}`,
    )
    assert.deepEqual(
      held.filter((s) => !s.ssl || s.user !== 'upa_app'),
      [],
    )
    service.kill('SIGTERM')
    assert.equal((await service.exited).code, 0)
  },
)

describe('refused: one line naming the variable and the cause, no stack trace', { concurrency: true }, () => {
  test("sslrootcert holding a CA that did not sign the server's certificate", async () => {
    const exit = await runCommand(['migrate'], {
      DATABASE_URL: url('upa_app', 'localhost', { sslmode: 'verify-full', sslrootcert: otherCa }),
    })
    assertOneLine(
      exit,
      new RegExp(
        `^Cannot start: DATABASE_URL: cannot connect to database "${DATABASE}" on localhost:${cluster.port} as ` +
          `user "upa_app": the server's certificate is not signed by sslrootcert \\(${escaped(otherCa)}\\)`,
      ),
    )
  })

  test('verify-full at 127.0.0.1, which the certificate does not name (it names localhost)', async () => {
    const exit = await runCommand(['migrate'], {
      DATABASE_URL: url('upa_app', '127.0.0.1', { sslmode: 'verify-full', sslrootcert: ca }),
    })
    assertOneLine(
      exit,
      /^Cannot start: DATABASE_URL: cannot connect to database "tls_app" on 127\.0\.0\.1:\d+ as user "upa_app": the server's certificate does not match host "127\.0\.0\.1" \(it names DNS:localhost\)/,
    )
  })

  test("sslrootcert=system: the CAs this process trusts, which the server's is not among", async () => {
    const exit = await runCommand(['migrate'], {
      DATABASE_URL: url('upa_app', 'localhost', { sslrootcert: 'system' }),
    })
    assertOneLine(
      exit,
      /^Cannot start: DATABASE_URL: cannot connect to .*: the server's certificate is not signed by a CA this process trusts \(Node's bundled list and NODE_EXTRA_CA_CERTS\)/,
    )
  })

  test('sslmode=disable where the server takes TLS connections only', async () => {
    const exit = await runCommand(['migrate'], { DATABASE_URL: url('upa_app', '127.0.0.1', { sslmode: 'disable' }) })
    assertOneLine(
      exit,
      /^Cannot start: DATABASE_URL: cannot connect to .*: no pg_hba\.conf entry for host "127\.0\.0\.1", user "upa_app", database "tls_app", no encryption$/,
    )
  })

  test('DATABASE_MIGRATION_URL for the certificate role without sslcert: named as the one that failed', async () => {
    const exit = await runCommand(['migrate'], {
      DATABASE_URL: url('upa_app', 'localhost', { sslmode: 'verify-full', sslrootcert: ca }),
      DATABASE_MIGRATION_URL: url('upa_cert', 'localhost', { sslmode: 'verify-full', sslrootcert: ca }),
    })
    assertOneLine(
      exit,
      /^Cannot start: DATABASE_MIGRATION_URL: cannot connect to database "tls_app" on localhost:\d+ as user "upa_cert": connection requires a valid client certificate$/,
    )
  })

  test(
    "DATABASE_POOLER=none, migrations on DATABASE_MIGRATION_URL: DATABASE_URL's certificate, first met when the " +
      'pool opens, is said the same way',
    async () => {
      const exit = await runCommand([], {
        DATABASE_URL: url('upa_app', 'localhost', { sslmode: 'verify-full', sslrootcert: otherCa }),
        DATABASE_MIGRATION_URL: url('upa_cert', 'localhost', {
          sslmode: 'verify-full',
          sslrootcert: ca,
          sslcert: client.cert,
          sslkey: client.key,
        }),
        DATABASE_POOLER: 'none',
        PORT: '0',
        JWT_SECRETS: `k:${'s'.repeat(32)}`,
        LOG_LEVEL: 'error',
      })
      assertOneLine(
        exit,
        /^Cannot start: DATABASE_URL: cannot connect to database "tls_app" on localhost:\d+ as user "upa_app": the server's certificate is not signed by sslrootcert/,
      )
    },
  )

  test('an sslrootcert that cannot be read: said before anything connects', async () => {
    const missing = join(dir, 'missing.pem')
    const exit = await runCommand(['migrate'], {
      DATABASE_URL: url('upa_app', 'localhost', { sslmode: 'verify-full', sslrootcert: ca }),
      DATABASE_LISTEN_URL: url('upa_app', 'localhost', { sslmode: 'verify-full', sslrootcert: missing }),
    })
    assertOneLine(
      exit,
      new RegExp(
        `^Cannot start: DATABASE_LISTEN_URL: sslrootcert: cannot read ${escaped(missing)} \\(no such file\\)$`,
      ),
    )
  })
})

test('NODE_EXTRA_CA_CERTS holding the CA: verify-full without sslrootcert works', async () => {
  const exit = await runCommand(['migrate'], {
    DATABASE_URL: `postgres://upa_app@localhost:${cluster.port}/tls_extra?sslmode=verify-full`,
    NODE_EXTRA_CA_CERTS: ca,
    LOG_LEVEL: 'info',
  })
  assert.equal(exit.code, 0, exit.stderr)
  assert.match(exit.stdout, /"msg":"database is up to date"/)
})

test("libpq's socket forms: postgres://user@/db?host=<folder>, the folder percent-encoded as host", async (t) => {
  const target = parseConnectionString(await createTestDatabase())
  if (!target.socket) return t.skip('the test cluster is reached over TCP (DATABASE_URL), not a Unix socket')
  const port = target.ports[0] === 5432 ? '' : `&port=${target.ports[0]}`
  const forms = [
    `postgres://${target.user}@/${target.database}?host=${target.socket}${port}`,
    `postgres://${target.user}@${encodeURIComponent(target.socket)}:${target.ports[0]}/${target.database}`,
  ]
  for (const exit of await Promise.all(
    forms.map((form) => runCommand(['migrate'], { DATABASE_URL: form, LOG_LEVEL: 'info' })),
  )) {
    assert.equal(exit.code, 0, exit.stderr)
    assert.match(exit.stdout, /"msg":"database is up to date"/)
  }
})
