import { ConfigError } from '../config-error.js'
import { connect } from './connect.js'
import { quoteIdentifier as quote } from './identifier.js'
import { databaseTarget, DatabaseUnreachable, unreachable } from './target.js'
import { withDeadline } from '../lib/settled-by.js'

// Whether DATABASE_URL goes through a transaction pooler (PgBouncer with
// pool_mode = transaction), found out once at start-up, before any pool is
// opened, because it decides how the pool talks (src/core/db/connect.ts,
// `pooled`) and what must go elsewhere: LISTEN/NOTIFY, which the credential
// caches, the event stream and the webhook workers rely on, and migrations
// need a session of their own, which a transaction pooler does not give.
//
// The sign: a server tells each client its process id in BackendKeyData, the
// key a cancel request names. A pooler cannot hand on a server's key (the
// client has no server of its own, and a cancel must reach the pooler), so it
// makes up one; PgBouncer's is random. On a direct connection that id is
// pg_backend_pid() of the session; behind a pooler it is not. Deterministic
// for PgBouncer in any pool_mode (a pooler in session mode is taken for a
// transaction one: safe, and it costs only the prepared statements), and for
// any pooler that makes up its keys; DATABASE_POOLER names the case where
// that sign misleads (`transaction` or `none`).
//
// Behind a transaction pooler the service refuses to start (ConfigError)
// unless it has what it needs there: DATABASE_LISTEN_URL reaching the same
// database without a pooler, and statement_timeout and
// idle_in_transaction_session_timeout in force on the pooler's server
// connections, which cannot be sent per connection through it (connect.ts).

export type ResolvedPooler = 'transaction' | 'none'

/** The settings the resolution reads (DATABASE_URL, DATABASE_LISTEN_URL, DATABASE_POOLER, STATEMENT_TIMEOUT). */
export interface PoolerSettings {
  databaseUrl: string
  databaseListenUrl: string | undefined
  databasePooler: 'auto' | ResolvedPooler
  statementTimeoutMs: number
}

/** The probe's statement gets no server time-out (none is sent), so it has this one. */
const PROBE_TIMEOUT_MS = 10_000

interface Probe {
  /** The process id the protocol announced (BackendKeyData) differs from the session's own. */
  pooled: boolean
  user: string
  database: string
  /** Milliseconds; 0 is off. */
  statementTimeoutMs: number
  idleInTransactionTimeoutMs: number
}

/**
 * One connection to `url` and one statement. It connects as a pooled client
 * does (startup parameters any pooler accepts, no prepared statement), so
 * that it can tell a pooler without being refused by one; the time-outs it
 * reads are then the server's defaults for the role and database.
 */
export async function probe(url: string): Promise<Probe> {
  const sql = connect(url, { max: 1, statementTimeoutMs: 0, pooled: true })
  try {
    const query = sql<
      [{ pid: number; user: string; database: string; statement_timeout: number; idle_timeout: number }]
    >`
      SELECT pg_backend_pid() AS pid, current_user AS user, current_database() AS database,
        (SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout') AS statement_timeout,
        (SELECT setting::int FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout') AS idle_timeout`
    const silent = () => {
      throw new DatabaseUnreachable(url, databaseTarget(sql), `no answer within ${PROBE_TIMEOUT_MS / 1000} s`)
    }
    // The first session start-up opens: a failure here is told as where it tried to go and why (target.ts).
    const rows = await withDeadline(query, PROBE_TIMEOUT_MS, silent).catch((err: unknown) => {
      throw unreachable(url, sql, err)
    })
    const [row] = rows
    return {
      pooled: rows.state.pid !== row.pid,
      user: row.user,
      database: row.database,
      statementTimeoutMs: row.statement_timeout,
      idleInTransactionTimeoutMs: row.idle_timeout,
    }
  } finally {
    await sql.end({ timeout: 5 })
  }
}

/**
 * DATABASE_POOLER resolved for `config` (its `auto` found out), or a
 * ConfigError that says what to set. A database that cannot be reached is a
 * DatabaseUnreachable (src/core/db/target.ts).
 */
export async function resolvePooler(config: PoolerSettings): Promise<ResolvedPooler> {
  const { databaseUrl, databaseListenUrl, databasePooler: setting, statementTimeoutMs } = config
  // Nothing to find out, nothing to compare.
  if (setting === 'none' && !databaseListenUrl) return setting
  const [main, listen] = await Promise.all([
    probe(databaseUrl),
    databaseListenUrl ? probe(databaseListenUrl) : undefined,
  ])
  const pooler: ResolvedPooler = setting === 'auto' ? (main.pooled ? 'transaction' : 'none') : setting
  if (listen) {
    if (setting === 'auto' && listen.pooled) {
      throw new ConfigError(
        'DATABASE_LISTEN_URL: must reach PostgreSQL directly, not through a connection pooler (the process id it ' +
          "announces is not its session's); LISTEN/NOTIFY and migrations need a session of their own",
      )
    }
    if (listen.database !== main.database) {
      throw new ConfigError(
        `DATABASE_LISTEN_URL: reaches database ` +
          `"${listen.database}", where DATABASE_URL reaches "${main.database}"; both must name the same database`,
      )
    }
  }
  if (pooler === 'none') return pooler
  if (!databaseListenUrl) {
    throw new ConfigError(
      "DATABASE_URL goes through a connection pooler (the process id it announces is not its session's, as with " +
        'PgBouncer), where LISTEN/NOTIFY and ' +
        'migrations do not work: set DATABASE_LISTEN_URL to a direct connection to the same database; or ' +
        'DATABASE_POOLER=none if DATABASE_URL reaches PostgreSQL without a pooler',
    )
  }
  const limit = `${statementTimeoutMs} ms (STATEMENT_TIMEOUT)`
  const wrong = (
    [
      ['statement_timeout', main.statementTimeoutMs],
      ['idle_in_transaction_session_timeout', main.idleInTransactionTimeoutMs],
    ] as const
  ).filter(([, ms]) => ms === 0 || ms > statementTimeoutMs)
  if (wrong.length) {
    const found = wrong.map(([name, ms]) => `${name} is ${ms === 0 ? 'off' : `${ms} ms`}`).join(' and ')
    const fix = wrong
      .map(
        ([name]) =>
          `ALTER ROLE ${quote(main.user)} IN DATABASE ${quote(main.database)} SET ${name} = '${statementTimeoutMs}ms';`,
      )
      .join(' ')
    throw new ConfigError(
      `DATABASE_URL goes through a transaction pooler, which cannot pass the time-outs on per connection, and on its ` +
        `server connections ${found}, where at most ${limit} is wanted. ` +
        `Set them for the role ` +
        `(${fix}) or in the pooler (PgBouncer: connect_query), then have it open new server connections (PgBouncer: ` +
        `RECONNECT, or a restart)`,
    )
  }
  return pooler
}
