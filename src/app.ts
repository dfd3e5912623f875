import { createServer, type Server } from 'node:http'
import type { AppDeps } from './app-deps.js'
import { describeError } from './log.js'
import { healthRoutes } from './health/routes.js'
import { createRequestHandler } from './http/pipeline.js'
import { createRouter } from './http/router.js'
import { productRoutes } from './products/routes.js'
import { userRoutes } from './users/routes.js'

export const routes = [...healthRoutes, ...userRoutes, ...productRoutes]

/**
 * The HTTP server as a function of its dependencies; it does not listen.
 * Time-outs are set deliberately (see README, "Time-outs"):
 * - headersTimeout: a client has this long to send its headers (slowloris);
 * - requestTimeout: and this long for the whole request, body included;
 * - keepAliveTimeout: an idle connection stays open longer than a typical
 *   proxy's 60 s idle time, so the proxy, not us, closes it and never sends a
 *   request on a socket we are closing.
 */
export function createApp(deps: AppDeps): Server {
  const handle = createRequestHandler(createRouter(routes), deps)
  const { config } = deps
  const server = createServer(
    {
      headersTimeout: config.headersTimeoutMs,
      requestTimeout: config.requestTimeoutMs,
      keepAliveTimeout: config.keepAliveTimeoutMs,
      // Headers over 16 KiB get a 431 from Node before any of our code runs.
      maxHeaderSize: 16 * 1024,
      // Node checks the two request time-outs on this interval (default 30 s).
      connectionsCheckingInterval: 1000,
    },
    (req, res) => {
      handle(req, res).catch((err: unknown) => {
        // Only a failure while writing the answer gets here; the pipeline catches the rest.
        deps.log.error('failed to write a response', describeError(err))
        res.destroy()
      })
    },
  )
  return server
}
