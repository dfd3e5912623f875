import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, test } from 'node:test'
import { promisify } from 'node:util'
import type { Sql } from 'postgres'
import { connect } from '../src/core/db/connect.js'
import { launchService, runCommand, serviceEnv, type Spawned } from './fault-kit.js'
import { dumpDatabase, restoreDatabase } from './helpers/backup.js'
import { callAs } from './helpers/http-client.js'
import { createRolePair, postgresProgram } from './helpers/roles.js'
import { testDatabaseServer } from './helpers/server.js'

// A managed PostgreSQL (RDS, Cloud SQL, Azure) gives no superuser: its
// administrator (a member of rds_superuser, cloudsqlsuperuser or
// azure_pg_admin) may log in, create roles and databases, and nothing a
// superuser alone may do. As such a role only, docs/operations.md's steps
// ("Managed PostgreSQL", "Backup and restore"): the role script, the
// `migrate` command, the service as the runtime role; then the backup, the
// instance lost (its database and runtime role gone), the roles made again by
// the script, the restore, and the service serving what it served.

const run = promisify(execFile)
const roles = await createRolePair({ managed: true })
const folder = mkdtempSync(join(tmpdir(), 'upa-managed-'))
after(() => rmSync(folder, { recursive: true, force: true }))
const migrationFiles = readdirSync(new URL('../sql/', import.meta.url))
  .filter((f) => f.endsWith('.sql'))
  .sort()
const ADMIN = { email: 'managed-admin@example.com', password: 'an admin password on a managed server' }
const maintenanceUrl = roles.urlAs(roles.owner, new URL(testDatabaseServer().serverUrl).pathname.slice(1))

/** `work` on a connection of its own to `url`, closed after it. */
async function on<T>(url: string, work: (sql: Sql) => Promise<T>): Promise<T> {
  const sql = connect(url, { max: 1, statementTimeoutMs: 30_000 })
  try {
    return await work(sql)
  } finally {
    await sql.end({ timeout: 5 })
  }
}

/** The SQLSTATE `statement` fails with, or 'allowed'. */
const outcome = (sql: Sql, statement: string) =>
  sql.unsafe(statement).then(
    () => 'allowed',
    (err: { code?: string }) => err.code ?? String(err),
  )

function startMain(vars: Record<string, string>): Promise<Spawned> {
  const instance = launchService({ ADMIN_EMAIL: ADMIN.email, ADMIN_PASSWORD: ADMIN.password, ...vars })
  after(() => instance.kill('SIGKILL'))
  return instance.listening
}

/** How the script stopped: psql's standard error. */
const refusal = (running: Promise<string>) =>
  running.then(
    (output) => assert.fail(`the script ran through: ${output}`),
    (err: { stderr?: string }) => err.stderr ?? String(err),
  )

test(
  'as the administrator only: the role script, migrate, the service as the runtime role; pg_dump, the instance ' +
    'lost, the roles made again by the script, pg_restore: the service serves the same data',
  async () => {
    const source = await roles.database({ grant: false })
    const administrator = await on(source.ownerUrl, async (sql) => {
      const [row] = await sql<[{ superuser: boolean; createrole: boolean; createdb: boolean; owns: boolean }]>`
        SELECT rolsuper AS superuser, rolcreaterole AS createrole, rolcreatedb AS createdb,
          (SELECT datdba = r.oid FROM pg_database WHERE datname = current_database()) AS owns
        FROM pg_roles r WHERE rolname = current_user`
      return row
    })
    assert.deepEqual(administrator, { superuser: false, createrole: true, createdb: true, owns: true })

    // docs/operations.md, "Managed PostgreSQL": the script as the administrator, then `migrate` as it.
    const granted = await roles.grantRuntime(source.name)
    assert.doesNotMatch(granted, /WARNING|ERROR/)
    assert.match(granted, /may read and write the tables of/)
    const migrated = await runCommand(['migrate'], {
      ...serviceEnv,
      DATABASE_URL: source.runtimeUrl,
      DATABASE_MIGRATION_URL: source.ownerUrl,
    })
    assert.equal(migrated.code, 0, migrated.stderr)
    const applied = migrated.stdout
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line) as { msg: string; migrations?: string[] })
      .find((l) => l.msg === 'migrations applied')
    assert.deepEqual(applied?.migrations, migrationFiles)

    const first = await startMain({ DATABASE_URL: source.runtimeUrl })
    const login = await callAs(first.url)('POST', '/auth/login', { body: ADMIN })
    assert.equal(login.status, 200, JSON.stringify(login.body))
    const token = login.body.access_token as string
    const person = { name: 'Managed Person', email: 'managed-person@example.com', password: 'a managed password' }
    const made = await callAs(first.url, token)('POST', '/users', { body: person })
    assert.equal(made.status, 201, JSON.stringify(made.body))
    const read = await callAs(first.url, token)('GET', `/users/${made.body.id}`)
    assert.equal(read.status, 200, JSON.stringify(read.body))
    assert.deepEqual(read.body, made.body)

    /** What the runtime role is and may do to the migrations' ledger, on `url`. */
    const runtimeRights = (url: string) =>
      on(url, async (sql) => {
        const [role] = await sql`
          SELECT rolsuper AS superuser, rolcreaterole AS createrole, rolcreatedb AS createdb,
            rolreplication AS replication, rolbypassrls AS bypassrls
          FROM pg_roles WHERE rolname = current_user`
        const ledger: Record<string, string> = {}
        for (const statement of [
          "INSERT INTO schema_migrations (version, name, checksum) VALUES (999, '999_future.sql', 'x')",
          "UPDATE schema_migrations SET checksum = 'x'",
          'DELETE FROM schema_migrations',
          'TRUNCATE schema_migrations',
          'SELECT count(*) FROM schema_migrations',
        ])
          ledger[statement.split(' ')[0]!] = await outcome(sql, statement)
        const owners = await sql<Array<{ owner: string }>>`
          SELECT DISTINCT pg_get_userbyid(relowner) AS owner FROM pg_class WHERE relnamespace = 'public'::regnamespace`
        return { role: { ...role }, ledger, owners: owners.map((r) => r.owner) }
      })
    const expected = {
      role: { superuser: false, createrole: false, createdb: false, replication: false, bypassrls: false },
      ledger: { INSERT: '42501', UPDATE: '42501', DELETE: '42501', TRUNCATE: '42501', SELECT: 'allowed' },
      owners: [roles.owner],
    }
    assert.deepEqual(await runtimeRights(source.runtimeUrl), expected)

    // The backup, as the administrator: the roles without their passwords (pg_authid, which holds them, is a
    // superuser's to read), and the database.
    const withPasswords = await run(postgresProgram('pg_dumpall'), ['--roles-only', '-d', source.ownerUrl]).then(
      () => 'dumped',
      (err: { stderr?: string }) => err.stderr ?? String(err),
    )
    assert.match(withPasswords, /permission denied for table pg_authid/)
    const { stdout: roleList } = await run(postgresProgram('pg_dumpall'), [
      '--roles-only',
      '--no-role-passwords',
      '-d',
      source.ownerUrl,
    ])
    assert.match(roleList, new RegExp(`^CREATE ROLE ${roles.runtime};$`, 'm'))
    assert.match(roleList, new RegExp(`^ALTER ROLE ${roles.owner} WITH NOSUPERUSER INHERIT CREATEROLE CREATEDB`, 'm'))
    assert.doesNotMatch(roleList, /PASSWORD/)
    const dump = join(folder, 'api.dump')
    await dumpDatabase(source.ownerUrl, dump)
    first.kill('SIGTERM')
    await first.exited

    // The instance is lost: its database, and with it the runtime role. A new one has its administrator only.
    await on(maintenanceUrl, async (sql) => {
      await sql`DROP DATABASE ${sql(source.name)}`
      await sql`DROP ROLE ${sql(roles.runtime)}`
    })

    // The restore, as the administrator: the database, the runtime role made again (pg_restore grants it its
    // rights, and stops at a role that does not exist), the dump, the script again.
    const target = await roles.database({ grant: false })
    await roles.grantRuntime(target.name)
    await restoreDatabase(target.ownerUrl, dump)
    assert.doesNotMatch(await roles.grantRuntime(target.name), /WARNING|ERROR/)
    assert.deepEqual(await runtimeRights(target.runtimeUrl), expected)

    const second = await startMain({ DATABASE_URL: target.runtimeUrl })
    assert.equal(
      second.logs.some((l) => l.msg === 'migrations applied'),
      false,
    )
    // The JWT issued before the backup still holds (same JWT_SECRETS, its session restored), and the password.
    const restored = await callAs(second.url, token)('GET', `/users/${made.body.id}`)
    assert.equal(restored.status, 200, JSON.stringify(restored.body))
    assert.deepEqual(restored.body, made.body)
    const relogin = await callAs(second.url)('POST', '/auth/login', {
      body: { email: person.email, password: person.password },
    })
    assert.equal(relogin.status, 200, JSON.stringify(relogin.body))
    second.kill('SIGTERM')
    await second.exited
  },
)

test(
  'as the administrator, the script stops before changing anything at what only a superuser may put right, and ' +
    'at a password the server would log; at the end, at a public schema it could not close',
  async () => {
    const db = await roles.database({ grant: false })
    const attributes = () =>
      on(db.superUrl, async (sql) => {
        const [row] = await sql`
          SELECT rolcreatedb AS createdb, rolbypassrls AS bypassrls FROM pg_roles WHERE rolname = ${roles.runtime}`
        return { ...row }
      })

    // BYPASSRLS, given by a superuser: only one may take it away. The role is left as it was (CREATEDB too).
    await on(db.superUrl, (sql) => sql`ALTER ROLE ${sql(roles.runtime)} BYPASSRLS CREATEDB`)
    assert.match(
      await refusal(roles.grantRuntime(db.name)),
      new RegExp(`ERROR:  runtime_role ${roles.runtime} has BYPASSRLS, which only a superuser may take away`),
    )
    assert.deepEqual(await attributes(), { createdb: true, bypassrls: true })
    await on(db.superUrl, (sql) => sql`ALTER ROLE ${sql(roles.runtime)} NOBYPASSRLS`)
    await roles.grantRuntime(db.name)
    assert.deepEqual(await attributes(), { createdb: false, bypassrls: false })

    // A server that logs the session's DDL, which the administrator may not turn off: no password is sent.
    await on(
      db.superUrl,
      (sql) => sql`ALTER ROLE ${sql(roles.owner)} IN DATABASE ${sql(db.name)} SET log_statement = 'ddl'`,
    )
    const verifier = () =>
      on(db.superUrl, async (sql) => {
        const [row] = await sql<[{ verifier: string }]>`
          SELECT rolpassword AS verifier FROM pg_authid WHERE rolname = ${roles.runtime}`
        return row.verifier
      })
    const before = await verifier()
    assert.match(
      await refusal(roles.grantRuntime(db.name, { password: 'would be logged' })),
      /ERROR: {2}RUNTIME_DB_PASSWORD not used: the server logs this session's statements/,
    )
    assert.equal(await verifier(), before, 'the password is as it was')
    assert.match(await roles.grantRuntime(db.name, { password: null }), /may read and write the tables of/)

    // A public schema that the provider's superuser owns, open to PUBLIC (a database made before PostgreSQL 15): the
    // administrator's REVOKE does nothing (a warning), and the script stops saying who must run it.
    await on(db.superUrl, async (sql) => {
      await sql`ALTER SCHEMA public OWNER TO ${sql(decodeURIComponent(new URL(db.superUrl).username))}`
      await sql`GRANT CREATE ON SCHEMA public TO PUBLIC`
    })
    assert.match(
      await refusal(roles.grantRuntime(db.name, { password: null })),
      new RegExp(
        `ERROR:  role ${roles.runtime} may still create objects in schema public: its owner ` +
          `${decodeURIComponent(new URL(db.superUrl).username)} \\(or a superuser\\) must run REVOKE CREATE ON ` +
          `SCHEMA public FROM PUBLIC, ${roles.runtime}`,
      ),
    )
  },
)
