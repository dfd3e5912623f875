import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import { postgresProgram } from './roles.js'

// The backup and the restore as docs/operations.md ("Backup and restore")
// tells an operator to run them, with the server's own programs: a dump in
// the custom format, restored with --no-owner by a connection as the new
// database's owner, which then owns every object whoever owned it before.

const run = promisify(execFile)

/** `pg_dump -Fc` of the database `url` names, as its role, into `file`. */
export async function dumpDatabase(url: string, file: string): Promise<void> {
  await run(postgresProgram('pg_dump'), ['-Fc', '-d', url, '-f', file], { timeout: 60_000 })
}

/** `pg_restore --no-owner --exit-on-error` of `file` into the (empty) database `url` names, as its role. */
export async function restoreDatabase(url: string, file: string): Promise<void> {
  await run(postgresProgram('pg_restore'), ['--no-owner', '--exit-on-error', '-d', url, file], { timeout: 60_000 })
}
