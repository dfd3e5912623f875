import { HttpError } from '../http/problem.js'

// Database failures that mean "unavailable" are turned into 503s here.
// postgres.js puts the SQLSTATE in `code`; connection trouble has codes of its
// own (CONNECT_TIMEOUT, CONNECTION_CLOSED, ...) or Node's (ECONNREFUSED, ...).
// A duplicate of a unique member is the resource's to answer
// (src/core/resources/store.ts, conflictOf), from its declaration.

// ENOENT: the Unix socket file is gone (the server stopped). CONNECTION_CLOSED
// is also what the patched postgres.js gives a statement of a transaction
// whose connection died (src/core/db/postgres-patch.mjs).
const connectionCodes = new Set([
  'CONNECT_TIMEOUT', 'CONNECTION_CLOSED', 'CONNECTION_DESTROYED', 'CONNECTION_ENDED',
  'ECONNREFUSED', 'ECONNRESET', 'ECONNABORTED', 'ENOTFOUND', 'EAI_AGAIN', 'ETIMEDOUT', 'EPIPE',
  'EHOSTUNREACH', 'ENETUNREACH', 'ENOENT',
])

export function mapDatabaseError(err: unknown): HttpError | undefined {
  if (!(err instanceof Error)) return undefined
  const { code } = err as Error & { code?: string }
  if (code === undefined) return undefined
  // Class 08: connection exception; 57P01-03: admin shutdown (also
  // pg_terminate_backend), crash shutdown, cannot connect now (starting up,
  // shutting down, in recovery); 57014: statement_timeout fired (the pool is
  // saturated or the database is stalled); class 53: insufficient resources
  // (too many connections, disk full, out of memory); 25P03: the server ended
  // a transaction left idle too long (idle_in_transaction_session_timeout).
  if (connectionCodes.has(code) || code.startsWith('08') || code.startsWith('53') || /^57P0[1-3]$/.test(code) || code === '57014' || code === '25P03') {
    return new HttpError('database_unavailable', 'The database is unavailable; retry shortly.', { headers: { 'retry-after': '5' } })
  }
  // 40P01, 40001: PostgreSQL broke a deadlock or a serialization conflict by aborting this
  // transaction, which changed nothing; the same request a moment later succeeds.
  if (code === '40P01' || code === '40001') {
    return new HttpError('database_unavailable', 'The request collided with a concurrent change and was rolled back; retry it.', { headers: { 'retry-after': '1' } })
  }
  return undefined
}
