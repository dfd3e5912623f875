import type { Sql } from 'postgres'
import { connect } from './connect.js'
import { parseConnectionString, type ConnectionString } from './connection-string.js'
import { tlsFailure } from './database-tls.js'
import { classifyDatabaseError } from './errors.js'

// Where a database URL leads (host, port, database, user: what start-up
// logs), and why start-up's first sessions (the pooler probe, the
// migrations) could not be opened there: the operator needs both in a line,
// never the password, and not the driver's error and stack.

/** Where a pool connects, as the driver reads its URL and the PG* defaults. */
export interface DatabaseTarget {
  /** A host name or address, or the folder of a Unix socket. */
  host: string
  port: number
  database: string
  user: string
}

export function databaseTarget(sql: Sql): DatabaseTarget {
  const options = sql.options as unknown as { host: string[]; port: number[]; database: string; user: string }
  return { host: options.host.join(','), port: options.port[0]!, database: options.database, user: options.user }
}

/** Where `url` leads; nothing is opened. */
export const urlTarget = (url: string): DatabaseTarget =>
  databaseTarget(connect(url, { max: 1, statementTimeoutMs: 0 }))

export function describeTarget({ host, port, database, user }: DatabaseTarget): string {
  const where = host.startsWith('/') ? `the Unix socket ${host}/.s.PGSQL.${port}` : `${host}:${port}`
  return `database "${database}" on ${where} as user "${user}"`
}

/** A session could not be opened on `url` (kept to tell which setting named it; never shown). */
export class DatabaseUnreachable extends Error {
  constructor(
    readonly url: string,
    readonly target: DatabaseTarget,
    readonly reason: string,
  ) {
    super(`cannot connect to ${describeTarget(target)}: ${reason}`)
  }
}

/** `url` as it was read to connect (it was, so it parses). */
function settingsOf(url: string): ConnectionString | undefined {
  try {
    return parseConnectionString(url)
  } catch {
    return undefined
  }
}

/** Node's codes for a connection that could not be made, in words. */
const networkReasons: Record<string, string> = {
  ECONNREFUSED: 'connection refused (is PostgreSQL running there, listening on that address and port?)',
  ENOTFOUND: 'unknown host',
  EAI_AGAIN: 'the host name could not be resolved now (EAI_AGAIN)',
  ETIMEDOUT: 'no answer (ETIMEDOUT)',
  CONNECT_TIMEOUT: 'no answer within the connect time-out (5 s)',
  EHOSTUNREACH: 'host unreachable',
  ENETUNREACH: 'network unreachable',
  ENOENT: 'no server socket there (is PostgreSQL running?)',
  EACCES: 'permission denied on the socket',
}

/**
 * `err`, met opening a session on `sql` (whose URL is `url`), as a
 * DatabaseUnreachable when it means the session could not be had: the
 * network, TLS (a certificate refused, src/core/db/database-tls.ts), the
 * server refusing (starting up, too many clients), or the
 * server's answer to the log-in (no such role or database, a wrong password,
 * no pg_hba.conf entry), whose messages name the role and database but
 * never a password. Anything else is returned as it is.
 */
export function unreachable(url: string, sql: Sql, err: unknown): unknown {
  if (!(err instanceof Error)) return err
  const { code } = err as Error & { code?: string }
  if (code === undefined) return err
  const reason =
    tlsFailure(err, settingsOf(url)) ??
    networkReasons[code] ??
    // 28: invalid authorization (a wrong password, no such role, pg_hba.conf); 3D000: no such database.
    (code.startsWith('28') ||
    code === '3D000' ||
    code.startsWith('08') ||
    code.startsWith('57P0') ||
    code.startsWith('53')
      ? err.message
      : undefined) ??
    (code === 'SASL_SIGNATURE_MISMATCH'
      ? 'the server did not prove it knows the password (SCRAM signature mismatch)'
      : undefined) ??
    (classifyDatabaseError(err) === 'unavailable' && code !== '57014' && code !== '25P03'
      ? `${err.message} (${code})`
      : undefined)
  return reason === undefined ? err : new DatabaseUnreachable(url, databaseTarget(sql), reason)
}
