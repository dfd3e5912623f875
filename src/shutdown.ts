import type { AppServer } from './app.js'
import { setTimeout as sleep } from 'node:timers/promises'
import type { AppDeps } from './app-deps.js'
import { describeError } from './core/log.js'

/**
 * Graceful stop, bounded by SHUTDOWN_TIMEOUT from the signal to the end:
 * - /readyz turns 503 and new requests on open connections get 503
 *   shutting_down; every answer from now on carries `Connection: close`;
 * - the listening socket closes (new connections are refused) and idle
 *   keep-alive connections close at once;
 * - requests in flight finish; whatever still runs at SHUTDOWN_TIMEOUT is cut;
 * - the pool ends within what is left of SHUTDOWN_TIMEOUT: postgres.js waits
 *   for running statements, and without a time-out could wait forever for a
 *   database that stopped answering (porsager/postgres#1097). It also
 *   closes the connection listening for credential changes
 *   (src/auth/credential-changes.ts), the pool's or that of `listenSql` (on
 *   DATABASE_LISTEN_URL): postgres.js ends that one with no time-out, and
 *   does not open it again; the heartbeat's own connection ends alongside.
 * Never rejects: the caller exits 0 when it returns, database down or not.
 */
export async function shutdown(server: AppServer, deps: AppDeps): Promise<void> {
  const { config, log } = deps
  const started = performance.now()
  const deadline = started + config.shutdownTimeoutMs
  deps.lifecycle.shuttingDown = true
  // Streams never finish by themselves: they end now, cleanly, and their clients resume on another instance.
  deps.eventHub.closeAll()
  const closed = new Promise<void>((resolve) => server.close(() => resolve()))
  server.closeIdleConnections()
  let cut = false
  const timer = setTimeout(() => {
    cut = true
    server.closeAllConnections()
  }, config.shutdownTimeoutMs)
  await closed
  clearTimeout(timer)
  if (cut) log.warn('requests still running at SHUTDOWN_TIMEOUT were cut', { shutdown_timeout_s: config.shutdownTimeoutMs / 1000 })

  const left = Math.max(0, deadline - performance.now())
  try {
    // end() destroys the connections once `timeout` passes; the race is for an end() that would not even do that.
    await Promise.race([
      closeDatabaseWork(deps, left / 1000),
      sleep(left + 500),
    ])
  } catch (err) {
    log.warn('closing the database pool failed', describeError(err))
  }
  log.info('stopped', { duration_ms: Math.round(performance.now() - started) })
}

/**
 * The background work first (the publisher, streams, webhook worker,
 * retention: they use the connections), then the pool, the listening
 * connection and the credential listener, each given `timeoutSeconds`.
 * The pool's end ends its own listener; `listenSql` is ended only when it is
 * a connection of its own (DATABASE_LISTEN_URL).
 */
export async function closeDatabaseWork(deps: AppDeps, timeoutSeconds: number): Promise<void> {
  await Promise.all([deps.eventPublisher.stop(), deps.eventHub.stop(), deps.webhooks.stop(), deps.retention.stop()])
  await Promise.all([
    deps.sql.end({ timeout: timeoutSeconds }),
    deps.listenSql === deps.sql ? undefined : deps.listenSql.end({ timeout: timeoutSeconds }),
    deps.credentialChanges.stop(timeoutSeconds),
  ])
}
