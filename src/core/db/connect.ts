import postgres, { type Sql } from 'postgres'
import { parseConnectionString, type ConnectionString } from './connection-string.js'
import { tlsOptions } from './database-tls.js'
import { isoTimestamp, timestampParameter } from './timestamps.js'

export interface PoolOptions {
  max: number
  statementTimeoutMs: number
  /** The URL goes through a transaction pooler such as PgBouncer (src/core/db/pooler.ts): see `connect`. */
  pooled?: boolean
  /** Called for every statement sent (metrics). */
  onQuery?: () => void
}

/**
 * The connection pool. Settings chosen for an API, not a batch job:
 * - connect_timeout 5 s: a database that does not answer becomes a 503 within
 *   seconds instead of the library's 30 s default;
 * - backoff: a lost connection is opened again after 0.05 s, doubling up to
 *   0.25 s. postgres.js's default grows with every failure in the pool, to
 *   20 s soon after a restart, and the request waiting for that connection
 *   waits as long. Attempts are made only for a waiting request, at most one
 *   per connection of the pool, so a short delay cannot flood the server;
 * - statement_timeout: no query can hold a connection (and a client) forever;
 *   idle_in_transaction_session_timeout, the same: a transaction whose client
 *   stopped talking mid-way cannot hold its row locks forever;
 * - int8 columns come back as JS numbers: ids and prices fit in 2^53, and
 *   JSON clients want numbers, not strings.
 * The URL is read as libpq reads it (src/core/db/connection-string.ts: the
 * socket forms, sslmode, sslrootcert, sslcert, sslkey), not by postgres.js,
 * which would send what it does not know to the server as settings; TLS as
 * src/core/db/database-tls.ts makes it. A URL that cannot work throws a
 * ConnectionStringError (start-up has checked it already: src/config.ts).
 * What the pool cannot do itself (refuse work when saturated, stop waiting
 * for a server that went silent) is done per request in src/core/db/admission.ts.
 *
 * `pooled`: the URL is a transaction pooler's (PgBouncer with pool_mode =
 * transaction), which hands each transaction, or each statement outside
 * one, to whichever server connection is free. So:
 * - no named prepared statement (`prepare: false`, which overrides the
 *   `prepare: true` of src/core/resources/store.ts and of the compiled list
 *   queries): one prepared on one server connection does not exist on the
 *   next. Statements go as unnamed Parse/Bind/Execute, up to one Sync, which
 *   the pooler keeps on one server connection;
 * - no pipelining (`max_pipeline: 0`): PgBouncer 1.18 gives the server
 *   connection back at the first ReadyForQuery, and the answers to
 *   statements sent behind it arrive with no client to take them ("got
 *   packet from server when not linked"); their queries never settle;
 * - no statement_timeout or idle_in_transaction_session_timeout as startup
 *   parameters: PgBouncer 1.18 refuses the connection for any but
 *   application_name, client_encoding, DateStyle, TimeZone and
 *   standard_conforming_strings (those it tracks per client and sets on the
 *   server connection it lends). Nor can a `SET` carry them: it would stay on
 *   a server connection the pooler lends to other clients next, and be
 *   missing from the ones this client gets. They are the server's defaults
 *   for the role and database (ALTER ROLE … IN DATABASE … SET), an
 *   operator's setting that start-up checks (src/core/db/pooler.ts).
 *
 * The driver must be the patched copy: the command that starts the service
 * checks it before anything connects (src/core/db/driver-check.ts).
 */
export function connect(databaseUrl: string, options: PoolOptions): Sql {
  const target = parseConnectionString(databaseUrl)
  const timeouts = {
    statement_timeout: options.statementTimeoutMs,
    idle_in_transaction_session_timeout: options.statementTimeoutMs,
  }
  return postgres({
    ...where(target),
    ssl: tlsOptions(target),
    ...(target.targetSessionAttrs && target.targetSessionAttrs !== 'any'
      ? { target_session_attrs: target.targetSessionAttrs }
      : {}),
    ...(options.pooled ? { prepare: false, max_pipeline: 0 } : {}),
    max: options.max,
    connect_timeout: 5,
    backoff: (retries: number) => Math.min(0.05 * 2 ** retries, 0.25),
    idle_timeout: 60,
    max_lifetime: 60 * 30,
    onnotice: () => {},
    // Called once per statement sent. An option of our patch (src/driver-patch/postgres.mjs):
    // postgres.js's own hook, `debug`, captures a stack trace for every query and fragment.
    ...(options.onQuery ? ({ onquery: options.onQuery } as object) : {}),
    connection: {
      application_name: target.applicationName ?? 'users-products-api',
      ...(target.options ? { options: target.options } : {}),
      // Timestamps as text in one form (timestamps.ts); the instant is the same in any zone.
      TimeZone: 'UTC',
      DateStyle: 'ISO, MDY',
      ...(options.pooled ? {} : timeouts),
    },
    types: {
      int8: { to: 20, from: [20], serialize: (x: number) => String(x), parse: (x: string) => Number(x) },
      timestamptz: { to: 1184, from: [1184], serialize: timestampParameter, parse: isoTimestamp },
    },
  })
}

/** postgres.js's options for where to connect and as whom; what the URL leaves out, postgres.js's defaults fill. */
function where(target: ConnectionString) {
  const { socket, hosts, ports, user, password, database } = target
  // Arrays, one entry per host: postgres.js takes them (parseOptions), though its types say one string and number;
  // a string would be split at every colon, an IPv6 address's too. With a Unix socket it connects to `path`, and
  // host and port say where that is (src/core/db/target.ts).
  const place = (socket
    ? { host: [socket], port: ports, path: `${socket}/.s.PGSQL.${ports[0]}` }
    : { host: hosts, port: ports }) as unknown as {
    host: string
    port: number
    path?: string
  }
  return {
    ...place,
    ...(user !== undefined ? { user } : {}),
    ...(password !== undefined ? { pass: password } : {}),
    ...(database !== undefined ? { database } : {}),
  }
}

/**
 * Connections of their own with the pool's settings (time zone, statement
 * time-out, types), for work in the background (the event publisher, the
 * webhook worker, the credential heartbeat): it neither waits behind
 * requests for a connection nor counts in db_queries_total, which counts
 * what requests cost.
 */
export function backgroundConnection(pool: Sql, max = 1): Sql {
  return postgres({ ...(pool.options as object), max, onquery: undefined } as never)
}
