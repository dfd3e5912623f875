import type { Server } from 'node:http'
import type { AppDeps } from './app-deps.js'

/**
 * Graceful stop: /readyz turns 503 so the proxy stops sending traffic, the
 * listening socket closes, idle keep-alive connections close at once, requests
 * in flight finish (their answers carry `Connection: close`) until
 * SHUTDOWN_TIMEOUT, then whatever is left is cut and the pool ends with a
 * time-out of its own (postgres.js can wait forever on a dead connection).
 */
export async function shutdown(server: Server, deps: AppDeps): Promise<void> {
  deps.lifecycle.shuttingDown = true
  const closed = new Promise<void>((resolve) => server.close(() => resolve()))
  server.closeIdleConnections()
  const deadline = setTimeout(() => server.closeAllConnections(), deps.config.shutdownTimeoutMs)
  await closed
  clearTimeout(deadline)
  await Promise.race([deps.sql.end({ timeout: 2 }), new Promise((resolve) => setTimeout(resolve, 3000))])
  deps.log.info('stopped')
}
