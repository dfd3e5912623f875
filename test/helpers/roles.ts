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
// connects as. Roles are the cluster's, shared by every test file running at
// once: each file gets its own pair under random names, dropped with its
// databases when the file's tests are done.

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

export interface RolePair {
  owner: string
  runtime: string
  /** A new database owned by the owner, the runtime role granted on it by the script unless `grant` is false. */
  database(options?: { grant?: boolean }): Promise<RoleDatabase>
  /** Runs deploy/postgres/runtime-role.psql on `database` as the superuser, as docs/operations.md says; its output. */
  grantRuntime(database: string): Promise<string>
  /** `url` (a URL of the run's server) as `role`, on `database`. */
  urlAs(role: string, database: string): string
}

export async function createRolePair(): Promise<RolePair> {
  const { serverUrl } = testDatabaseServer()
  const tag = randomBytes(4).toString('hex')
  const owner = `upa_owner_${tag}`
  const runtime = `upa_runtime_${tag}`
  const databases: string[] = []
  const server = connect(serverUrl, { max: 1, statementTimeoutMs: 60_000 })
  await server`CREATE ROLE ${server(owner)} LOGIN`
  after(async () => {
    // Dropping its databases drops every grant and default privilege the roles hold; then the roles can go.
    for (const name of databases) await server`DROP DATABASE IF EXISTS ${server(name)} WITH (FORCE)`
    await server`DROP ROLE IF EXISTS ${server(runtime)}`
    await server`DROP ROLE IF EXISTS ${server(owner)}`
    await server.end({ timeout: 5 })
  })

  const urlAs = (role: string, database: string) => {
    const url = new URL(serverUrl)
    url.username = role
    url.pathname = `/${database}`
    return url.toString()
  }
  const grantRuntime = async (database: string) => {
    const { stdout, stderr } = await run(
      postgresProgram('psql'),
      [
        '--no-psqlrc',
        '-d',
        urlAs(decodeURIComponent(new URL(serverUrl).username), database),
        '-v',
        `runtime_role=${runtime}`,
        '-f',
        join(projectRoot, 'deploy/postgres/runtime-role.psql'),
      ],
      {
        // The local cluster trusts its socket, so the password is
        // not checked; it is set all the same, as in production.
        env: { PATH: process.env.PATH, RUNTIME_DB_PASSWORD: `pw-${tag}` },
        timeout: 30_000,
      },
    )
    return stdout + stderr
  }
  return {
    owner,
    runtime,
    urlAs,
    grantRuntime,
    async database({ grant = true } = {}) {
      const name = testDatabaseName('roles')
      await server`CREATE DATABASE ${server(name)} OWNER ${server(owner)}`
      databases.push(name)
      if (grant) await grantRuntime(name)
      return {
        name,
        superUrl: urlAs(decodeURIComponent(new URL(serverUrl).username), name),
        ownerUrl: urlAs(owner, name),
        runtimeUrl: urlAs(runtime, name),
      }
    },
  }
}
