import { execFile } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { join } from 'node:path'
import { after } from 'node:test'
import { promisify } from 'node:util'
import { connect } from '../../src/core/db/connect.js'
import { findBinaries, projectRoot } from '../../src/dev/local-cluster.js'
import { testDatabaseName, testDatabaseServer } from './server.js'

// The production arrangement of roles on the run's database server
// (TEST_SERVER_URL): an owner that owns the database and runs the migrations,
// and a runtime role made by the shipped script
// (deploy/postgres/runtime-role.psql, run by the real psql) that the service
// connects as. Two arrangements: a superuser creates the databases and runs
// the script (a server of one's own), or, `managed`, the owner is the
// administrator a managed PostgreSQL gives (LOGIN CREATEROLE CREATEDB, not a
// superuser: RDS's rds_superuser, Cloud SQL's cloudsqlsuperuser), which
// creates its databases and runs the script itself. Roles are the cluster's,
// shared by every test file running at once: each file gets its own pair under
// random names, dropped with its databases when the file's tests are done.

const run = promisify(execFile)

/** A program of the PostgreSQL server's version (psql, pg_dump, pg_restore), as operators run it. */
export const postgresProgram = (name: string) => join(findBinaries(), name)

export interface RoleDatabase {
  name: string
  /** As the server's superuser (TEST_SERVER_URL's user). */
  superUrl: string
  /** As the owner: what DATABASE_MIGRATION_URL names. */
  ownerUrl: string
  /** As the runtime role: what DATABASE_URL names. */
  runtimeUrl: string
}

export interface GrantOptions {
  /** The role the script makes (its runtime_role); default the pair's runtime role. */
  role?: string
  /** RUNTIME_DB_PASSWORD; null: none given. Default a password of the pair's. */
  password?: string | null
}

export interface RolePair {
  owner: string
  runtime: string
  /** The superuser (server's own) or the owner (managed) that creates databases and runs the script. */
  administrator: string
  /**
   * A new database owned by the owner, made by the administrator, the runtime role granted on it by the script
   * unless `grant` is false.
   */
  database(options?: { grant?: boolean }): Promise<RoleDatabase>
  /**
   * Runs deploy/postgres/runtime-role.psql on `database` as the administrator, as docs/operations.md says; its
   * output. Rejects with psql's exit (its `stderr`) when the script stops.
   */
  grantRuntime(database: string, options?: GrantOptions): Promise<string>
  /** `url` (a URL of the run's server) as `role`, on `database`. */
  urlAs(role: string, database: string): string
}

export async function createRolePair({ managed = false } = {}): Promise<RolePair> {
  const { serverUrl } = testDatabaseServer()
  const tag = randomBytes(4).toString('hex')
  const owner = `upa_${managed ? 'admin' : 'owner'}_${tag}`
  const runtime = `upa_runtime_${tag}`
  const superuser = decodeURIComponent(new URL(serverUrl).username)
  const administrator = managed ? owner : superuser
  const databases: string[] = []
  const server = connect(serverUrl, { max: 1, statementTimeoutMs: 60_000 })
  const urlAs = (role: string, database: string) => {
    const url = new URL(serverUrl)
    url.username = role
    url.pathname = `/${database}`
    return url.toString()
  }
  if (managed) await server`CREATE ROLE ${server(owner)} LOGIN CREATEROLE CREATEDB NOSUPERUSER`
  else await server`CREATE ROLE ${server(owner)} LOGIN`
  // A managed administrator creates its databases itself, connected to the server's maintenance database.
  const creator = managed
    ? connect(urlAs(owner, new URL(serverUrl).pathname.slice(1)), { max: 1, statementTimeoutMs: 60_000 })
    : server
  after(async () => {
    if (creator !== server) await creator.end({ timeout: 5 })
    // Dropping its databases drops every grant and default privilege the roles hold; then the roles can go.
    for (const name of databases) await server`DROP DATABASE IF EXISTS ${server(name)} WITH (FORCE)`
    await server`DROP ROLE IF EXISTS ${server(runtime)}`
    await server`DROP ROLE IF EXISTS ${server(owner)}`
    await server.end({ timeout: 5 })
  })

  const grantRuntime = async (database: string, { role = runtime, password = `pw-${tag}` }: GrantOptions = {}) => {
    const { stdout, stderr } = await run(
      postgresProgram('psql'),
      [
        '--no-psqlrc',
        '-d',
        urlAs(administrator, database),
        '-v',
        `runtime_role=${role}`,
        '-f',
        join(projectRoot, 'deploy/postgres/runtime-role.psql'),
      ],
      {
        // The local cluster trusts its socket, so the password is
        // not checked; it is set all the same, as in production.
        env: { PATH: process.env.PATH, ...(password === null ? {} : { RUNTIME_DB_PASSWORD: password }) },
        timeout: 30_000,
      },
    )
    return stdout + stderr
  }
  return {
    owner,
    runtime,
    administrator,
    urlAs,
    grantRuntime,
    async database({ grant = true } = {}) {
      const name = testDatabaseName('roles')
      databases.push(name)
      if (managed) await creator`CREATE DATABASE ${creator(name)}`
      else await server`CREATE DATABASE ${server(name)} OWNER ${server(owner)}`
      if (grant) await grantRuntime(name)
      return { name, superUrl: urlAs(superuser, name), ownerUrl: urlAs(owner, name), runtimeUrl: urlAs(runtime, name) }
    },
  }
}
