import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { createHmac, pbkdf2Sync, randomBytes } from 'node:crypto'
import { cpSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { after, describe, test } from 'node:test'
import { pathToFileURL } from 'node:url'
import type { Sql } from 'postgres'
import { connect } from '../src/core/db/connect.js'
import { migrate } from '../src/core/db/migrate.js'
import { launchService, projectRoot, runCommand, troubleIn, type Spawned } from './fault-kit.js'
import { startPgBouncer } from './helpers/pgbouncer.js'
import { createRolePair, postgresProgram } from './helpers/roles.js'
import { callAs, type Answer } from './helpers/http-client.js'
import { startReceiver, type Receiver } from './helpers/webhook-receiver.js'
import { waitUntil } from './helpers/wait.js'

// Least privilege (docs/security.md): the service connects as the runtime
// role that deploy/postgres/runtime-role.psql makes, which may read and
// write the tables but not change the schema, and migrates as the owner
// (DATABASE_MIGRATION_URL). The role is attacked with the statements an
// injection would want (each refused with 42501); the real entry point,
// started as it, migrates an empty database through the owner and serves
// every kind of flow, straight to PostgreSQL and through a real PgBouncer in
// transaction mode; and without the owner's URL it refuses to start,
// saying which migration is pending and what to set.

const roles = await createRolePair()
const connections: Sql[] = []
after(() => Promise.all(connections.map((c) => c.end({ timeout: 5 }))))
const open = (url: string) => {
  const sql = connect(url, { max: 1, statementTimeoutMs: 30_000 })
  connections.push(sql)
  return sql
}
const migrationFiles = readdirSync(new URL('../sql/', import.meta.url))
  .filter((f) => f.endsWith('.sql'))
  .sort()
const ADMIN = { email: 'owner-admin@example.com', password: 'an admin password of the runtime role' }

/** The real entry point with `vars`, stopped when the file is done. */
function startMain(vars: Record<string, string>) {
  const instance = launchService({
    ADMIN_EMAIL: ADMIN.email,
    ADMIN_PASSWORD: ADMIN.password,
    WEBHOOK_ALLOW_PRIVATE: 'true',
    ...vars,
  })
  after(() => instance.kill('SIGKILL'))
  return instance.listening
}

/** The entry point expected to refuse: how it ended. */
const runMain = (vars: Record<string, string>) =>
  runCommand([], { JWT_SECRETS: `k:${'x'.repeat(32)}`, PORT: '0', HOST: '127.0.0.1', ...vars })

const nextPath = (link: string | undefined) => (link ? /<([^>]+)>; rel="next"/.exec(link)?.[1] : undefined)

/**
 * What a client does, through every part of the service that writes:
 * passwords and sessions, refresh, API keys, products with If-Match, a
 * cursor walk, the event log, a webhook delivery, logout and revocation,
 * and deleting a user (whose triggers revoke what it held).
 */
async function exerciseFlows(service: Spawned, receiver: Receiver): Promise<void> {
  const api = (token?: string) => callAs(service.url, token)
  const login = await api()('POST', '/auth/login', { body: ADMIN })
  assert.equal(login.status, 200, JSON.stringify(login.body))
  const admin = login.body.access_token as string

  const tag = randomBytes(3).toString('hex')
  const person = { name: 'Runtime Person', email: `runtime-${tag}@example.com`, password: 'a runtime person password' }
  const user = await api(admin)('POST', '/users', { body: person })
  assert.equal(user.status, 201, JSON.stringify(user.body))
  const session = await api()('POST', '/auth/login', { body: { email: person.email, password: person.password } })
  assert.equal(session.status, 200, JSON.stringify(session.body))
  const refreshed = await api()('POST', '/auth/refresh', { body: { refresh_token: session.body.refresh_token } })
  assert.equal(refreshed.status, 200, JSON.stringify(refreshed.body))
  assert.equal((await api(refreshed.body.access_token)('GET', '/auth/me')).body.user.email, person.email)

  const key = await api(admin)('POST', '/api-keys', {
    body: { name: 'runtime', scopes: ['products:read', 'products:write'] },
  })
  assert.equal(key.status, 201, JSON.stringify(key.body))
  const hook = await api(admin)('POST', '/webhooks', {
    body: { url: receiver.url, event_types: ['product.created', 'product.updated', 'product.deleted'] },
  })
  assert.equal(hook.status, 201, JSON.stringify(hook.body))

  const created: Answer[] = []
  for (let i = 0; i < 5; i++) {
    const res = await api(key.body.key)('POST', '/products', {
      body: { sku: `LP-${tag}-${i}`, name: `Least ${i}`, price: 100 + i, currency: 'EUR' },
    })
    assert.equal(res.status, 201, JSON.stringify(res.body))
    created.push(res)
  }
  const first = created[0]!
  const patched = await api(key.body.key)('PATCH', `/products/${first.body.id}`, {
    headers: { 'if-match': first.headers.etag! },
    body: { price: 999 },
  })
  assert.equal(patched.status, 200, JSON.stringify(patched.body))
  const stale = await api(key.body.key)('PATCH', `/products/${first.body.id}`, {
    headers: { 'if-match': first.headers.etag! },
    body: { price: 1 },
  })
  assert.equal(stale.status, 412, JSON.stringify(stale.body))
  const seen: string[] = []
  for (let path: string | undefined = `/products?q=LP-${tag}&sort=sku&limit=2`; path;) {
    const page = await api(key.body.key)('GET', path)
    assert.equal(page.status, 200, JSON.stringify(page.body))
    seen.push(...page.body.map((p: { sku: string }) => p.sku))
    path = nextPath(page.headers.link as string | undefined)
  }
  assert.deepEqual(
    seen,
    created.map((r) => r.body.sku),
  )
  const last = created[4]!
  assert.equal(
    (await api(admin)('DELETE', `/products/${last.body.id}`, { headers: { 'if-match': last.headers.etag! } })).status,
    204,
  )

  await waitUntil(
    'the events of the product',
    async () =>
      (await api(admin)('GET', `/events?subject_type=product&subject_id=${first.body.id}`)).body?.length === 2,
  )
  const events = await api(admin)('GET', `/events?subject_type=product&subject_id=${first.body.id}`)
  assert.deepEqual(
    events.body.map((e: { type: string }) => e.type),
    ['product.created', 'product.updated'],
  )
  await receiver.waitFor('the deletion delivered', (received) =>
    received.some((r) => JSON.parse(r.body).type === 'product.deleted' && r.body.includes(`"id":${last.body.id}`)),
  )

  assert.equal((await api(refreshed.body.access_token)('POST', '/auth/logout')).status, 204)
  await waitUntil(
    'the logged-out JWT to be refused',
    async () => (await api(refreshed.body.access_token)('GET', '/auth/me')).status === 401,
  )
  assert.equal((await api(admin)('DELETE', `/api-keys/${key.body.id}`)).status, 204)
  await waitUntil(
    'the revoked API key to be refused',
    async () => (await api(key.body.key)('GET', '/products?limit=1')).status === 401,
  )
  assert.equal((await api(admin)('DELETE', `/users/${user.body.id}`)).status, 204)
  assert.deepEqual(troubleIn(service.logs), [], 'nothing failed inside the service')
}

describe('the runtime role', () => {
  test(
    'may read, write, notify and take advisory locks, and read the migrations; every statement that changes the ' +
      "schema, a role or the migrations' ledger is refused with 42501",
    async () => {
      const db = await roles.database()
      // As DATABASE_MIGRATION_URL does: the owner migrates.
      assert.deepEqual(await migrate(open(db.ownerUrl)), migrationFiles)
      const runtime = open(db.runtimeUrl)
      const [{ tables }] = await runtime<
        [{ tables: number }]
      >`SELECT count(*)::int AS tables FROM pg_tables WHERE schemaname = 'public'`
      assert.ok(tables > 5, 'the owner migrated the database')
      // What the service does is allowed.
      await runtime`INSERT INTO products (sku, name, price, currency) VALUES ('LP-ALLOWED', 'Allowed', 1, 'EUR')`
      await runtime`UPDATE products SET price = 2 WHERE sku = 'LP-ALLOWED'`
      await runtime`DELETE FROM products WHERE sku = 'LP-ALLOWED'`
      await runtime`SELECT pg_notify('api_key_changes', 'probe'), pg_advisory_xact_lock(1), nextval('events_id_seq')`
      // The ledger of migrations is read at start-up, and only read.
      const ledger = await runtime<Array<{ name: string }>>`SELECT name FROM schema_migrations ORDER BY version`
      assert.deepEqual(
        ledger.map((r) => r.name),
        migrationFiles,
      )

      const attacks = [
        'DROP TABLE products',
        'DROP TABLE schema_migrations',
        "INSERT INTO schema_migrations (version, name, checksum) VALUES (999, '999_future.sql', 'x')",
        "UPDATE schema_migrations SET checksum = 'x'",
        'DELETE FROM schema_migrations',
        'TRUNCATE schema_migrations',
        'ALTER TABLE users ADD COLUMN evil int',
        'ALTER TABLE users DISABLE TRIGGER ALL',
        'DROP TRIGGER users_updated ON users',
        'TRUNCATE users',
        'CREATE TABLE evil (id int)',
        'CREATE TEMPORARY TABLE evil (id int)',
        'CREATE INDEX evil ON products (name)',
        'CREATE VIEW evil AS SELECT 1',
        "CREATE FUNCTION evil() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "CREATE OR REPLACE FUNCTION api_time(t timestamptz) RETURNS text LANGUAGE sql AS 'SELECT 1'",
        'CREATE SCHEMA evil',
        `ALTER ROLE ${roles.runtime} SUPERUSER`,
        `ALTER ROLE ${roles.runtime} CREATEROLE`,
        'CREATE ROLE evil',
        `GRANT ${roles.owner} TO ${roles.runtime}`,
        "COPY users TO PROGRAM 'true'",
        "SELECT pg_read_file('postgresql.conf')",
      ]
      const answers: Record<string, string> = {}
      for (const statement of attacks) {
        answers[statement] = await runtime.unsafe(statement).then(
          () => 'allowed',
          (err: { code?: string }) => err.code ?? String(err),
        )
      }
      assert.deepEqual(answers, Object.fromEntries(attacks.map((s) => [s, '42501'])))
      const [after_] = await runtime<
        [{ tables: number }]
      >`SELECT count(*)::int AS tables FROM pg_tables WHERE schemaname = 'public'`
      assert.equal(after_.tables, tables)
    },
  )
})

describe("the migrations' ledger", () => {
  test(
    'an older grant that let the runtime role write schema_migrations: the script run again takes it back, and ' +
      'the next migration by the owner too',
    async () => {
      const db = await roles.database()
      await migrate(open(db.ownerUrl))
      const superuser = open(db.superUrl)
      const runtime = open(db.runtimeUrl)
      // What the script granted before it kept the ledger read only.
      const grantWrites = () =>
        superuser`GRANT INSERT, UPDATE, DELETE ON schema_migrations TO ${superuser(roles.runtime)}`
      const markApplied = () =>
        runtime`INSERT INTO schema_migrations (version, name, checksum) VALUES (999, '999_future.sql', 'x')`.then(
          () => 'allowed',
          (err: { code?: string }) => err.code ?? String(err),
        )
      const read = async () =>
        (await runtime<Array<{ name: string }>>`SELECT name FROM schema_migrations ORDER BY version`).map((r) => r.name)

      await grantWrites()
      await roles.grantRuntime(db.name)
      assert.equal(await markApplied(), '42501')
      assert.deepEqual(await read(), migrationFiles)

      await grantWrites()
      const folder = mkdtempSync(join(tmpdir(), 'upa-ledger-'))
      after(() => rmSync(folder, { recursive: true, force: true }))
      for (const name of migrationFiles) cpSync(new URL(`../sql/${name}`, import.meta.url), join(folder, name))
      writeFileSync(join(folder, '999_next_release.sql'), 'CREATE TABLE next_release (id int);\n')
      assert.deepEqual(await migrate(open(db.ownerUrl), pathToFileURL(`${folder}/`)), ['999_next_release.sql'])
      assert.equal(await markApplied(), '42501')
      assert.deepEqual(await read(), [...migrationFiles, '999_next_release.sql'])
    },
  )
})

describe('the service as the runtime role, migrating as the owner', () => {
  test(
    'an empty database: migrated through DATABASE_MIGRATION_URL (the owner owns every table), then every flow ' +
      'works',
    async () => {
      const db = await roles.database()
      const receiver = await startReceiver()
      after(() => receiver.close())
      const service = await startMain({ DATABASE_URL: db.runtimeUrl, DATABASE_MIGRATION_URL: db.ownerUrl })
      assert.deepEqual(service.logs.find((l) => l.msg === 'migrations applied')?.migrations, migrationFiles)
      const superuser = open(db.superUrl)
      const owners = await superuser<Array<{ owner: string }>>`
      SELECT DISTINCT pg_get_userbyid(relowner) AS owner FROM pg_class WHERE relnamespace = 'public'::regnamespace`
      assert.deepEqual(
        owners.map((r) => r.owner),
        [roles.owner],
      )
      await exerciseFlows(service, receiver)
      // The bootstrap admin was made on the owner's connection; the pool and its sessions are the runtime role's.
      const users = await superuser<Array<{ user: string }>>`
      SELECT DISTINCT usename AS user FROM pg_stat_activity WHERE datname = ${db.name} AND pid <>
      pg_backend_pid() AND backend_type = 'client backend'`
      assert.deepEqual(
        users.map((r) => r.user),
        [roles.runtime],
      )
    },
  )

  test(
    'through PgBouncer in transaction mode (as the runtime role), listening directly, migrating as the owner: ' +
      'every flow works',
    async () => {
      const db = await roles.database()
      const bouncer = await startPgBouncer({ user: roles.runtime })
      const receiver = await startReceiver()
      after(() => receiver.close())
      const service = await startMain({
        DATABASE_URL: bouncer.urlFor(db.runtimeUrl),
        DATABASE_LISTEN_URL: db.runtimeUrl,
        DATABASE_MIGRATION_URL: db.ownerUrl,
      })
      assert.ok(
        service.logs.some((l) => String(l.msg).startsWith('DATABASE_URL goes through a transaction pooler')),
        'the pooler was detected',
      )
      assert.deepEqual(service.logs.find((l) => l.msg === 'migrations applied')?.migrations, migrationFiles)
      await exerciseFlows(service, receiver)
      assert.doesNotMatch(bouncer.log(), /ERROR|prepared statement|unsupported startup parameter/)
    },
  )

  test(
    'a database already migrated: the runtime role starts without DATABASE_MIGRATION_URL (nothing ' + 'pending)',
    async () => {
      const db = await roles.database()
      await migrate(open(db.ownerUrl))
      const service = await startMain({ DATABASE_URL: db.runtimeUrl })
      assert.equal(
        service.logs.some((l) => l.msg === 'migrations applied'),
        false,
      )
      const login = await callAs(service.url)('POST', '/auth/login', { body: ADMIN })
      assert.equal(login.status, 200, JSON.stringify(login.body))
    },
  )

  test(
    'pending migrations and no DATABASE_MIGRATION_URL: refuses to start, exit 1, naming the migration, the role ' +
      'and what to set; the database is untouched',
    async () => {
      const db = await roles.database()
      const { code, stderr } = await runMain({ DATABASE_URL: db.runtimeUrl })
      assert.equal(code, 1, stderr)
      assert.equal(
        stderr,
        `Cannot start: sql/${migrationFiles[0]} ` +
          `and ${migrationFiles.length - 1} more are pending, and role ` +
          `"${roles.runtime}" may not change the schema (permission denied for schema public). ` +
          "Set DATABASE_MIGRATION_URL to a connection as the schema's owner (migrations run there, the service as " +
          "DATABASE_URL's role), or run `node dist/main.js migrate` once with it set.\n",
      )
      const [{ tables }] = await open(db.superUrl)<
        [{ tables: number }]
      >`SELECT count(*)::int AS tables FROM pg_tables WHERE schemaname = 'public'`
      assert.equal(tables, 0)
    },
  )
})

/**
 * Whether a SCRAM-SHA-256 verifier (pg_authid.rolpassword) is the one of `password` (RFC 5802: ServerKey =
 * HMAC(SaltedPassword, "Server Key")).
 */
function scramMatches(verifier: string, password: string): boolean {
  const m = /^SCRAM-SHA-256\$([0-9]+):([^$]+)\$[^:]+:(.+)$/.exec(verifier)
  if (!m) return false
  const salted = pbkdf2Sync(password, Buffer.from(m[2]!, 'base64'), Number(m[1]), 32, 'sha256')
  return createHmac('sha256', salted).update('Server Key').digest('base64') === m[3]
}

describe('a runtime role without its grants', () => {
  test(
    'a migrated database whose grants were never given: refuses to start, exit 1, naming the role and the ' + 'script',
    async () => {
      await roles.database() // the role exists (the script made it there)
      const bare = await roles.database({ grant: false })
      await migrate(open(bare.ownerUrl))
      const { code, stderr } = await runMain({ DATABASE_URL: bare.runtimeUrl })
      assert.equal(code, 1, stderr)
      assert.equal(
        stderr,
        `Cannot start: Role "${roles.runtime}" may not read schema_migrations (permission denied for table ` +
          `schema_migrations): ` +
          "grant it what deploy/postgres/runtime-role.psql grants, or connect as the schema's owner.\n",
      )
    },
  )
})

describe('deploy/postgres/runtime-role.sh, as the postgres image runs it from /docker-entrypoint-initdb.d', () => {
  const folder = mkdtempSync(join(tmpdir(), 'upa-initdb-'))
  after(() => rmSync(folder, { recursive: true, force: true }))
  const server = new URL(process.env.TEST_SERVER_URL!)
  /** The image's environment: POSTGRES_USER on POSTGRES_DB over the local socket, psql on PATH. */
  const initdb = (database: string, vars: Record<string, string>) =>
    new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
      const child = execFile(
        'bash',
        [join(projectRoot, 'deploy/postgres/runtime-role.sh')],
        {
          timeout: 30_000,
          env: {
            PATH: `${dirname(postgresProgram('psql'))}:${process.env.PATH}`,
            PGHOST: server.searchParams.get('host') ?? server.hostname,
            POSTGRES_USER: decodeURIComponent(server.username),
            POSTGRES_DB: database,
            RUNTIME_DB_USER: roles.runtime,
            ...vars,
          },
        },
        (_err, stdout, stderr) => resolve({ code: child.exitCode, stdout, stderr }),
      )
    })

  test(
    'on a new database, before any migration: the role with the password of RUNTIME_DB_PASSWORD_FILE; the tables ' +
      'the owner migrates next are its to read and write (the ledger only to read), not to truncate',
    async () => {
      const db = await roles.database({ grant: false })
      const secret = join(folder, 'runtime_password')
      writeFileSync(secret, 'a password from a secret file\n')
      const made = await initdb(db.name, { RUNTIME_DB_PASSWORD_FILE: secret })
      assert.equal(made.code, 0, made.stderr)
      const superuser = open(db.superUrl)
      const [role] = await superuser<
        [{ verifier: string; superuser: boolean; createrole: boolean; createdb: boolean }]
      >`
      SELECT rolpassword AS verifier, rolsuper AS superuser, rolcreaterole AS createrole, rolcreatedb AS
      createdb FROM pg_authid WHERE rolname = ${roles.runtime}`
      assert.ok(
        scramMatches(role.verifier, 'a password from a secret file'),
        "the password is the file's, without its newline",
      )
      assert.deepEqual(
        { ...role, verifier: undefined },
        { verifier: undefined, superuser: false, createrole: false, createdb: false },
      )

      await migrate(open(db.ownerUrl))
      const rights = await superuser<Array<{ table: string; read: boolean; write: boolean; truncate: boolean }>>`
      SELECT tablename AS table, has_table_privilege(${roles.runtime}, format('%I', tablename), 'SELECT') AS read,
        has_table_privilege(${roles.runtime}, format('%I', tablename), 'INSERT, UPDATE, DELETE') AS write,
        has_table_privilege(${roles.runtime}, format('%I', tablename), 'TRUNCATE') AS truncate
      FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename`
      assert.ok(rights.length > 10)
      // Every table to read and write but the migrations' ledger, which the owner's first migration made read only.
      assert.deepEqual(
        rights.filter((r) => !r.read || !r.write || r.truncate),
        [{ table: 'schema_migrations', read: true, write: false, truncate: false }],
      )
      const [settings] = await superuser<[{ config: string[] }]>`
      SELECT setconfig AS config FROM pg_db_role_setting WHERE setrole = ${roles.runtime}::regrole AND
      setdatabase = (SELECT oid FROM pg_database WHERE datname = ${db.name})`
      assert.deepEqual(settings.config, ['statement_timeout=5s', 'idle_in_transaction_session_timeout=5s'])
      // Run again (a restart of the image does not, but an operator may): the same, no error.
      assert.equal((await initdb(db.name, { RUNTIME_DB_PASSWORD: 'a changed password' })).code, 0)
      const [changed] = await superuser<
        [{ verifier: string }]
      >`SELECT rolpassword AS verifier FROM pg_authid WHERE rolname = ${roles.runtime}`
      assert.ok(scramMatches(changed.verifier, 'a changed password'))
    },
  )

  test(
    'without a password, or with both RUNTIME_DB_PASSWORD and RUNTIME_DB_PASSWORD_FILE: exit 1 with one line ' +
      'saying so, nothing made',
    async () => {
      const db = await roles.database({ grant: false })
      const none = await initdb(db.name, {})
      assert.equal(none.code, 1)
      assert.match(none.stderr, /^runtime-role\.sh: set RUNTIME_DB_PASSWORD_FILE \(or RUNTIME_DB_PASSWORD\)/)
      const secret = join(folder, 'both')
      writeFileSync(secret, 'x')
      const both = await initdb(db.name, { RUNTIME_DB_PASSWORD: 'y', RUNTIME_DB_PASSWORD_FILE: secret })
      assert.equal(both.code, 1)
      assert.equal(both.stderr, 'runtime-role.sh: set RUNTIME_DB_PASSWORD or RUNTIME_DB_PASSWORD_FILE, not both\n')
      const [{ granted }] = await open(db.superUrl)<[{ granted: boolean }]>`
      SELECT EXISTS (SELECT FROM pg_default_acl) AS granted`
      assert.equal(granted, false)
    },
  )
})
