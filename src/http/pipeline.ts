import { randomUUID } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { AppDeps } from '../app-deps.js'
import { authorize } from '../auth/access.js'
import { authenticate } from '../auth/credentials.js'
import { anonymous, type Principal } from '../auth/principal.js'
import { mapDatabaseError } from '../db/errors.js'
import { describeError } from '../log.js'
import { checkContentType, readJsonBody } from './body.js'
import { etagMatches } from './conditional.js'
import { HttpError, notFound, problemBody } from './problem.js'
import { checkQuery, parseQueryString } from './query.js'
import { writeReply } from './reply.js'
import type { Reply } from './route.js'
import type { Router } from './router.js'

// The whole life of a request, top to bottom: identify it, match a route,
// authenticate, authorize, read and check the query and the body, run the
// handler, answer, log. One `catch` turns any failure into a problem answer.

const CLIENT_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/

export function createRequestHandler(router: Router, deps: AppDeps) {
  const { config, log, lifecycle } = deps
  const prefix = config.apiPrefix
  const credentialSettings = { keys: config.jwtSecrets, issuer: config.jwtIssuer, audience: config.jwtAudience }

  return async function handleRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const started = process.hrtime.bigint()
    const clientId = req.headers['x-request-id']
    const requestId = typeof clientId === 'string' && CLIENT_REQUEST_ID.test(clientId) ? clientId : randomUUID()
    const rawUrl = req.url ?? '/'
    const queryAt = rawUrl.indexOf('?')
    const fullPath = queryAt === -1 ? rawUrl : rawUrl.slice(0, queryAt)
    const method = req.method ?? 'GET'
    let template: string | undefined
    let principal: Principal = anonymous
    let reply: Reply

    let problem = false
    try {
      if (prefix && !(fullPath === prefix || fullPath.startsWith(prefix + '/'))) throw notFound()
      const path = fullPath.slice(prefix.length)
      const match = router.match(method, path)
      if (match.kind === 'not_found') throw notFound()
      template = match.template
      if (match.kind === 'options') {
        reply = { status: 204, headers: { allow: match.allow } }
      } else if (match.kind === 'method_not_allowed') {
        throw new HttpError(405, 'method_not_allowed', `${method} is not supported here; use ${match.allow}.`, { headers: { allow: match.allow } })
      } else {
        if (lifecycle.shuttingDown && match.route.access.kind !== 'public') {
          throw new HttpError(503, 'shutting_down', 'The service is shutting down; retry on another instance.', { headers: { 'retry-after': '1', connection: 'close' } })
        }
        const { route, params } = match
        // Public routes never look at a credential (no database read for /healthz).
        if (route.access.kind !== 'public') principal = (await authenticate(deps.sql, req.headers, credentialSettings)) ?? anonymous
        authorize(route.access, principal, params, config.allowSignup)
        const query = checkQuery(route.query, parseQueryString(queryAt === -1 ? '' : rawUrl.slice(queryAt + 1)))
        let body: unknown
        if (route.body && !(route.body.optional && hasNoBody(req))) {
          checkContentType(req, route.body.kind)
          body = route.body.validator.parseBody(await readJsonBody(req, config.bodyLimit))
        }
        reply = await route.handle({ params, query, body, principal, headers: req.headers, requestId, deps })
        if (reply.status === 200 && (method === 'GET' || method === 'HEAD') && etagMatches(req.headers['if-none-match'], reply.headers?.etag)) {
          // RFC 9110 §15.4.5: a 304 repeats the validator, and nothing else of the body.
          reply = { status: 304, headers: { etag: reply.headers!.etag! } }
        }
      }
    } catch (err) {
      problem = true
      reply = problemReply(err, fullPath, requestId, deps, template)
    }

    const logRequest = () =>
      log.info('request', {
        request_id: requestId,
        method,
        route: template ?? null,
        status: reply.status,
        duration_ms: Number(process.hrtime.bigint() - started) / 1e6,
        user_id: principal.kind === 'user' ? principal.userId : null,
        client: req.socket.remoteAddress ?? null,
      })
    // The client went away (an aborted upload, a disconnect while the handler
    // ran): nothing can be written, but the request is still logged. Returning
    // without a log line left such requests invisible.
    if (res.headersSent || res.destroyed) return logRequest()
    // While draining, every answer asks the client to take its next request elsewhere.
    if (lifecycle.shuttingDown) reply.headers = { ...reply.headers, connection: 'close' }
    // Answers about credentials must not be stored by any cache (RFC 6749 §5.1), errors included.
    if (fullPath.startsWith(`${prefix}/auth/`)) reply.headers = { ...reply.headers, 'cache-control': 'no-store' }
    writeReply(res, reply, { requestId, head: method === 'HEAD', problem })
    if (reply.headers?.connection === 'close') res.once('finish', () => req.socket.destroySoon())

    res.once('finish', logRequest)
  }
}

function problemReply(err: unknown, instance: string, requestId: string, deps: AppDeps, template: string | undefined): Reply {
  let http = err instanceof HttpError ? err : mapDatabaseError(err)
  if (!http) {
    deps.log.error('unhandled error', { request_id: requestId, route: template ?? null, ...describeError(err) })
    http = new HttpError(500, 'internal_error', `An unexpected error occurred; quote request id ${requestId} when reporting it.`)
  } else if (http.status === 503) {
    deps.log.warn('database unavailable', { request_id: requestId, ...describeError(err) })
  }
  return { status: http.status, headers: http.options.headers, body: problemBody(http, instance, requestId) }
}

/** No body at all: neither a length nor chunked transfer (RFC 9112 §6.3). */
const hasNoBody = (req: IncomingMessage) =>
  req.headers['transfer-encoding'] === undefined && (req.headers['content-length'] === undefined || req.headers['content-length'] === '0')
