import { randomUUID } from 'node:crypto'
import { readFileSync } from 'node:fs'
import {
  createServer,
  STATUS_CODES,
  type IncomingMessage,
  type Server as HttpServer,
  type ServerResponse,
} from 'node:http'
import { createServer as createHttpsServer, type Server as HttpsServer } from 'node:https'
import { Socket } from 'node:net'
import type { Duplex } from 'node:stream'
import type { AppDeps } from './app-deps.js'
import { describeError } from './core/log.js'
import { buildOpenApiDocument } from './openapi/document.js'
import { openApiRoute } from './openapi/routes.js'
import type { AnyRoute } from './core/http/route.js'
import { requestGuard } from './auth/request-guard.js'
import type { TlsOptions } from './core/http/tls.js'
import { createRequestHandler } from './core/http/pipeline.js'
import { HttpError, problemAnswer } from './core/http/problem.js'
import { createRouter } from './core/http/router.js'
import type { Registry } from './registry.js'

// The version in the OpenAPI document is the package's (same path from src/ and dist/).
const packageVersion = (
  JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }
).version

/** Every route of the service, `extra` ones appended, and /openapi.json, which describes them all. */
export function allRoutes(registry: Registry, apiPrefix: string, extra: readonly AnyRoute[] = []): AnyRoute[] {
  let document: unknown
  const routes = [...registry.routes, ...extra, openApiRoute(() => document)]
  document = buildOpenApiDocument(routes, { version: packageVersion, apiPrefix, problems: registry.problems })
  return routes
}

/**
 * The HTTP server as a function of its dependencies and its routes; it does
 * not listen (src/service.ts owns it).
 * Time-outs are set deliberately (docs/operations.md, "Time-outs"):
 * - headersTimeout: a client has this long to send its headers (slowloris);
 * - requestTimeout: and this long for the whole request, body included;
 * - keepAliveTimeout: an idle connection stays open longer than a typical
 *   proxy's 60 s idle time, so the proxy, not us, closes it and never sends a
 *   request on a socket we are closing;
 * - handshakeTimeout (HTTPS): the TLS handshake,
 *   like the headers, within   headersTimeout;
 * - maxConnections: open connections at most; those over it are closed at once.
 */
/** The HTTP server, or the HTTPS one with TLS_CERT_FILE and TLS_KEY_FILE (src/core/http/tls.ts). */
export type AppServer = HttpServer | HttpsServer

export function createApp(deps: AppDeps, routes: readonly AnyRoute[], tls?: TlsOptions): AppServer {
  const handle = createRequestHandler(createRouter(routes), deps, requestGuard(deps))
  const { config } = deps
  // handshakeTimeout: a connection that never starts (or never finishes) its TLS handshake has
  // as long as one that never sends its headers; Node's default is 120 s.
  const create = (
    tls
      ? (options: object, listener: never) =>
          createHttpsServer({ ...options, ...tls, handshakeTimeout: config.headersTimeoutMs }, listener)
      : createServer
  ) as typeof createServer
  const server = create(
    {
      headersTimeout: config.headersTimeoutMs,
      requestTimeout: config.requestTimeoutMs,
      keepAliveTimeout: config.keepAliveTimeoutMs,
      // Headers over 16 KiB get a 431 from Node before any of our code runs.
      maxHeaderSize: 16 * 1024,
      // Node checks the two request time-outs on this interval (default 30 s).
      connectionsCheckingInterval: 1000,
      // Node would answer a missing Host itself, with an empty 400; the pipeline answers a problem.
      requireHostHeader: false,
    },
    (req, res) => {
      handle(req, res).catch((err: unknown) => {
        // Only a failure while writing the answer gets here; the pipeline catches the rest.
        deps.log.error('failed to write a response', describeError(err))
        res.destroy()
      })
    },
  )
  // Past MAX_CONNECTIONS, Node closes each new connection as it arrives: memory and file descriptors stay bounded.
  server.maxConnections = config.maxConnections
  server.on('drop', () => void deps.metrics.connectionsDropped++)
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => answerClientError(err, socket, deps))
  // An expectation other than 100-continue: Node would answer an empty 417; RFC 9110 (10.1.1) lets a
  // server ignore it instead, and the request is served as if it had none.
  server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) => server.emit('request', req, res))
  // CONNECT asks for a tunnel, which this server does not make:
  // without a listener Node closes the connection unanswered.
  server.on('connect', (req: IncomingMessage, socket: Duplex) => refuseTunnel(req, socket, deps))
  return server
}

/**
 * Requests Node's parser refuses before our handler runs (Content-Length with
 * Transfer-Encoding, duplicate Content-Length, headers over the limit, header
 * or request time-outs) still get a problem body, a request id and nosniff,
 * and the connection is closed: after a framing error nothing on it can be trusted.
 */
function answerClientError(err: NodeJS.ErrnoException, socket: Duplex, deps: AppDeps): void {
  if (err.code === 'ERR_SSL_HTTP_REQUEST') return answerPlainHttp(socket, deps)
  // A TLS handshake that failed or timed out (node:https passes its tlsClientError here) has no channel to answer on:
  // written to, the socket would wait for the handshake forever.
  const tlsFailure = /^ERR_(TLS|SSL)_/.test(err.code ?? '') || 'library' in err
  if (!socket.writable || err.code === 'ECONNRESET' || tlsFailure) return void socket.destroy()
  const problem = new HttpError(
    err.code === 'HPE_HEADER_OVERFLOW'
      ? 'headers_too_large'
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? 'request_timeout'
        : 'invalid_request',
    'The request could not be read.',
  )
  answerOnSocket(socket, problem, deps, { method: null, error: err.code ?? 'client_error' })
}

/**
 * Plain HTTP sent to the HTTPS port (OpenSSL sees a request line where a handshake should be): answered, as nginx
 * does, with a 400 in plain HTTP saying to use https://, then closed, rather than left with no answer at all. The
 * answer is written on the TCP socket under the TLS one (Node's `_parent`, not part of its documented API: without it
 * the connection is closed at once). Nothing the client sent is read: the connection ends after the answer, or at the
 * header time-out when the client does not read it.
 */
function answerPlainHttp(tlsSocket: Duplex, deps: AppDeps): void {
  const raw = (tlsSocket as Duplex & { _parent?: unknown })._parent
  if (!(raw instanceof Socket) || !raw.writable) return void tlsSocket.destroy()
  raw.on('error', () => raw.destroy())
  const timer = setTimeout(() => raw.destroy(), deps.config.headersTimeoutMs)
  raw.once('close', () => {
    clearTimeout(timer)
    tlsSocket.destroy()
  })
  const problem = new HttpError('invalid_request', 'This port speaks HTTPS only: send the request to https://.')
  answerOnSocket(raw, problem, deps, { method: null, error: 'plain_http_to_https_port' })
}

/**
 * The answer to CONNECT. Node hands the socket over as it is: outside the
 * server's time-outs and connection tracking, with no error listener, and
 * half-open after `end` (allowHalfOpen). So it gets a listener (a reset
 * would otherwise be an uncaught error), whatever the client sends is read
 * and dropped, and it is destroyed once the answer is written, or at the
 * header time-out if the client does not read it.
 */
function refuseTunnel(req: IncomingMessage, socket: Duplex, deps: AppDeps): void {
  socket.on('error', () => socket.destroy())
  socket.resume()
  const timer = setTimeout(() => socket.destroy(), deps.config.headersTimeoutMs)
  socket.once('close', () => clearTimeout(timer))
  socket.once('finish', () => socket.destroy())
  const problem = new HttpError('invalid_request', 'CONNECT is not supported: this server is not a proxy.')
  answerOnSocket(socket, problem, deps, { method: req.method ?? 'CONNECT', error: 'connect' })
}

/**
 * A problem written on the socket itself, outside the pipeline (no response object exists), and the connection closed.
 */
function answerOnSocket(
  socket: Duplex,
  problem: HttpError,
  deps: AppDeps,
  logged: { method: string | null; error: string },
): void {
  const requestId = randomUUID()
  const answer = problemAnswer(problem, deps.problems, '', requestId)
  const { status } = answer
  const reason = STATUS_CODES[status] ?? 'Error'
  const body = JSON.stringify(answer.body)
  deps.log.info('request', { request_id: requestId, method: logged.method, route: null, status, error: logged.error })
  socket.end(
    `HTTP/1.1 ${status} ${reason}\r\nContent-Type: application/problem+json; ` +
      `charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
      `X-Request-Id: ${requestId}\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n${body}`,
  )
}
