import { isTlsFailure } from './database-tls.js'

// Database failures a request may meet, told apart for the HTTP layer to
// answer (src/core/http/database-problems.ts).
// postgres.js puts the SQLSTATE in `code`; connection trouble has codes of its
// own (CONNECT_TIMEOUT, CONNECTION_CLOSED, ...) or Node's (ECONNREFUSED, ...).
// A duplicate of a unique member is the resource's to answer
// (src/core/resources/store.ts, conflictOf), from its declaration.

// ENOENT: the Unix socket file is gone (the server stopped). CONNECTION_CLOSED
// is also what the patched postgres.js gives a statement of a transaction
// whose connection died (src/driver-patch/postgres.mjs).
const connectionCodes: ReadonlySet<string> = new Set([
  'CONNECT_TIMEOUT',
  'CONNECTION_CLOSED',
  'CONNECTION_DESTROYED',
  'CONNECTION_ENDED',
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'ETIMEDOUT',
  'EPIPE',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOENT',
])

/**
 * What a database error means to the work that met it: 'unavailable' (the
 * connection or the server failed; retry in a while), 'deadlock' or
 * 'serialization' (PostgreSQL aborted the transaction, which changed
 * nothing; retry at once). Undefined for any other error: not the
 * database's to explain (a bug, or a constraint a resource answers).
 */
export type DatabaseFailure = 'unavailable' | 'deadlock' | 'serialization'

export function classifyDatabaseError(err: unknown): DatabaseFailure | undefined {
  if (!(err instanceof Error)) return undefined
  const { code, routine } = err as Error & { code?: string; routine?: string }
  if (code === undefined) return undefined
  // Class 08: connection exception; 57P01-03: admin shutdown (also
  // pg_terminate_backend), crash shutdown, cannot connect now (starting up,
  // shutting down, in recovery); 57014: statement_timeout fired (the pool is
  // saturated or the database is stalled); class 53: insufficient resources
  // (too many connections, disk full, out of memory); 25P03: the server ended
  // a transaction left idle too long (idle_in_transaction_session_timeout).
  // 55000 from the server's start-up of a session (CheckMyDatabase): the
  // database refuses new connections (ALLOW_CONNECTIONS false, as during a
  // maintenance or a restore); elsewhere 55000 is an object's state, no outage.
  // A certificate refused or a handshake failed (the server's certificate expired, say): the database cannot be had.
  if (
    connectionCodes.has(code) ||
    isTlsFailure(code) ||
    code.startsWith('08') ||
    code.startsWith('53') ||
    /^57P0[1-3]$/.test(code) ||
    code === '57014' ||
    code === '25P03' ||
    (code === '55000' && routine === 'CheckMyDatabase')
  ) {
    return 'unavailable'
  }
  // PostgreSQL broke a deadlock, or a serialization conflict, by aborting this transaction.
  if (code === '40P01') return 'deadlock'
  if (code === '40001') return 'serialization'
  return undefined
}
