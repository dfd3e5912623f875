import postgres, { type Sql } from 'postgres'

export interface PoolOptions {
  max: number
  statementTimeoutMs: number
  /** Called for every statement sent (metrics). */
  onQuery?: () => void
}

/**
 * The connection pool. Settings chosen for an API, not a batch job:
 * - connect_timeout 5 s: a database that does not answer becomes a 503 within
 *   seconds instead of the library's 30 s default;
 * - statement_timeout: no query can hold a connection (and a client) forever;
 * - int8 columns come back as JS numbers: ids and prices fit in 2^53, and
 *   JSON clients want numbers, not strings.
 * A `host` query parameter that is a directory (libpq's way to name a Unix
 * socket) is honoured; postgres.js would otherwise send it as a setting.
 */
export function connect(databaseUrl: string, options: PoolOptions): Sql {
  const url = new URL(databaseUrl)
  const socketDir = url.searchParams.get('host')
  if (socketDir) url.searchParams.delete('host')
  return postgres(url.toString(), {
    ...(socketDir ? { host: socketDir } : {}),
    max: options.max,
    connect_timeout: 5,
    idle_timeout: 60,
    max_lifetime: 60 * 30,
    onnotice: () => {},
    // postgres.js calls `debug` once per statement sent: the cheapest hook for a query counter.
    ...(options.onQuery ? { debug: options.onQuery } : {}),
    connection: { application_name: 'users-products-api', statement_timeout: options.statementTimeoutMs },
    types: {
      int8: { to: 20, from: [20], serialize: (x: number) => String(x), parse: (x: string) => Number(x) },
    },
  })
}
