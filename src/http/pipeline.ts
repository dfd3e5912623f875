import { randomUUID } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { AppDeps } from '../app-deps.js'
import { authorize } from '../auth/access.js'
import { authenticate } from '../auth/credentials.js'
import { looksLikeJwt } from '../auth/jwt.js'
import { anonymous, type Principal } from '../auth/principal.js'
import { mapDatabaseError } from '../db/errors.js'
import { describeError } from '../log.js'
import { checkContentType, readJsonBody } from './body.js'
import { addressBucket, clientAddress } from './client-address.js'
import { corsHeaders } from './cors.js'
import { handleIdempotently } from './idempotency.js'
import type { RateDecision, RateLimiter } from './rate-limit.js'
import { etagMatches } from './conditional.js'
import { HttpError, notFound, problemBody } from './problem.js'
import { checkQuery, parseQueryString } from './query.js'
import { writeReply } from './reply.js'
import type { Reply } from './route.js'
import type { Router } from './router.js'

// The whole life of a request, top to bottom: identify it, match a route,
// authenticate, count it against the rate limit, authorize, read and check
// the query and the body, run the handler (through the idempotency record for
// creating POSTs), answer, log. One `catch` turns any failure into a problem.

const CLIENT_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/

export function createRequestHandler(router: Router, deps: AppDeps) {
  const { config, log, lifecycle } = deps
  const prefix = config.apiPrefix
  // Bounds the requests waiting for the database and how long they wait (src/db/admission.ts).
  const dbWork = deps.databaseWork
  const credentialDeps = {
    sql: deps.sql,
    // Only credentials read from the database wait under the bound; a JWT is checked in memory.
    bounded: <T>(work: () => Promise<T>) => dbWork.run(work),
    settings: { keys: config.jwtSecrets, issuer: config.jwtIssuer, audience: config.jwtAudience },
    jwtCache: deps.jwtCache,
    apiKeyCache: deps.apiKeyCache,
    apiKeyUse: deps.apiKeyUse,
    revocations: deps.revocations,
    credentialChanges: deps.credentialChanges,
  }
  const runBounded = <T>(work: () => Promise<T>) => dbWork.run(work)
  const runAsIs = <T>(work: () => Promise<T>) => work()
  const limiter = deps.rateLimiter
  const cors = { origins: config.corsOrigins }

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
    let rate: RateDecision | undefined
    let corsExtra: Record<string, string> = {}
    deps.metrics.inFlight++

    let problem = false
    try {
      // Computed before anything can fail, so that a 404 reaches a browser page as a 404, not as a CORS error.
      corsExtra = corsHeaders(cors, req.headers.origin)
      if (prefix && !(fullPath === prefix || fullPath.startsWith(prefix + '/'))) throw notFound()
      const path = fullPath.slice(prefix.length)
      const match = router.match(method, path)
      if (match.kind === 'not_found') throw notFound()
      template = match.template
      if (match.kind === 'options' && req.headers['access-control-request-method'] !== undefined) {
        corsExtra = corsHeaders(cors, req.headers.origin, match.allow)
      }
      if (match.kind === 'options') {
        reply = { status: 204, headers: { allow: match.allow } }
      } else if (match.kind === 'method_not_allowed') {
        throw new HttpError('method_not_allowed', `${method} is not supported here; use ${match.allow}.`, { headers: { allow: match.allow } })
      } else {
        if (lifecycle.shuttingDown && match.route.access.kind !== 'public') {
          throw new HttpError('shutting_down', 'The service is shutting down; retry on another instance.', { headers: { 'retry-after': '1', connection: 'close' } })
        }
        const { route, params } = match
        // Public routes never look at a credential (no database read for /healthz).
        if (route.access.kind !== 'public') {
          const address = () => addressBucket(clientAddress(req, config.trustProxy))
          // An address that has spent its window on anonymous requests and bad credentials is refused before a credential costs a database read.
          if (limiter && !route.unlimited && needsDatabaseRead(req) && limiter.exhausted(address())) rate = enforce(limiter, address())
          try {
            principal = (await authenticate(req.headers, credentialDeps)) ?? anonymous
          } catch (err) {
            // Failed credentials count against the address, so that guessing tokens is limited too.
            if (limiter && !route.unlimited) rate = enforce(limiter, address())
            throw err
          }
        }
        if (limiter && !route.unlimited) rate = enforceFor(limiter, principal, req, config)
        authorize(route.access, principal, params, config.allowSignup)
        if (config.requireIfMatch && route.requiresIfMatch && req.headers['if-match'] === undefined) {
          throw new HttpError('precondition_required', 'This server requires If-Match on writes: GET the resource and send its ETag.')
        }
        const query = checkQuery(route.query, parseQueryString(queryAt === -1 ? '' : rawUrl.slice(queryAt + 1)))
        let body: unknown
        if (route.body && !(route.body.optional && hasNoBody(req))) {
          checkContentType(req, route.body.kind)
          body = route.body.validator.parseBody(await readJsonBody(req, config.bodyLimit))
        }
        const client = clientAddress(req, config.trustProxy)
        const database = route.database ?? 'handler'
        const bounded = database === 'statements' ? runBounded : runAsIs
        const ctx = { params, query, body, principal, headers: req.headers, requestId, client, bounded, deps }
        const handle = () => (route.idempotent ? handleIdempotently(route, ctx, path, client) : route.handle(ctx))
        reply = database === 'handler' ? await dbWork.run(handle) : await handle()
        if (reply.status === 200 && (method === 'GET' || method === 'HEAD') && etagMatches(req.headers['if-none-match'], reply.headers?.etag)) {
          // RFC 9110 §15.4.5: a 304 repeats the validator, and nothing else of the body.
          reply = { status: 304, headers: { etag: reply.headers!.etag! } }
        }
      }
    } catch (err) {
      problem = true
      reply = problemReply(err, fullPath, requestId, deps, template)
    }

    const logRequest = () => {
      const seconds = Number(process.hrtime.bigint() - started) / 1e9
      deps.metrics.inFlight--
      deps.metrics.observe(method, template ?? null, reply.status, seconds)
      log.info('request', {
        request_id: requestId,
        method,
        route: template ?? null,
        status: reply.status,
        duration_ms: seconds * 1000,
        user_id: principal.kind === 'user' ? principal.userId : null,
        client: clientAddress(req, config.trustProxy),
      })
    }
    // The client went away (an aborted upload, a disconnect while the handler
    // ran): nothing can be written, but the request is still logged. Returning
    // without a log line left such requests invisible.
    if (res.headersSent || res.destroyed) return logRequest()
    // While draining, every answer asks the client to take its next request elsewhere.
    if (lifecycle.shuttingDown) reply.headers = { ...reply.headers, connection: 'close' }
    // Answers about credentials must not be stored by any cache (RFC 6749 §5.1), errors included.
    if (fullPath.startsWith(`${prefix}/auth/`)) reply.headers = { ...reply.headers, 'cache-control': 'no-store' }
    reply.headers = { ...reply.headers, ...corsExtra, ...(rate ? rateHeaders(rate) : {}) }
    writeReply(res, reply, { requestId, head: method === 'HEAD', problem })
    if (reply.headers?.connection === 'close') res.once('finish', () => req.socket.destroySoon())

    // 'close' rather than 'finish': it also fires when the client leaves before the answer is flushed.
    res.once('close', logRequest)
  }
}

/** A user may spend this many credentials' worth of RATE_LIMIT in all: N keys do not give N times the limit. */
const USER_LIMIT_FACTOR = 3

/**
 * Counts the request against its credential's bucket and its user's (or its
 * client address when anonymous); the answer shows the credential's figures
 * unless the user's bucket is the one that refuses.
 */
function enforceFor(limiter: RateLimiter, principal: Principal, req: IncomingMessage, config: AppDeps['config']): RateDecision {
  if (principal.kind === 'anonymous') return enforce(limiter, addressBucket(clientAddress(req, config.trustProxy)))
  const c = principal.credential
  // A session is its user's: JWTs and opaque tokens of one login share a bucket.
  const credential = c.type === 'api_key' ? `key ${c.apiKeyId}` : `session ${principal.userId}:${c.sessionId}`
  enforce(limiter, `user ${principal.userId}`, config.rateLimit * USER_LIMIT_FACTOR)
  return enforce(limiter, credential)
}

/** Opaque tokens and API keys may cost a database read; a JWT is checked in memory. */
function needsDatabaseRead(req: IncomingMessage): boolean {
  const authorization = req.headers.authorization
  return req.headers['x-api-key'] !== undefined || (authorization !== undefined && !looksLikeJwt(authorization.replace(/^Bearer +/i, '').trim()))
}

function enforce(limiter: RateLimiter, key: string, limit?: number): RateDecision {
  const decision = limiter.hit(key, limit)
  if (!decision.allowed) {
    throw new HttpError('rate_limited', `Rate limit of ${decision.limit} requests per minute reached.`, {
      headers: { 'retry-after': String(decision.resetSeconds), ...rateHeaders(decision) },
    })
  }
  return decision
}

// IETF draft-ietf-httpapi-ratelimit-headers field names.
const rateHeaders = (d: RateDecision) => ({
  'ratelimit-limit': String(d.limit),
  'ratelimit-remaining': String(d.remaining),
  'ratelimit-reset': String(d.resetSeconds),
})

function problemReply(err: unknown, instance: string, requestId: string, deps: AppDeps, template: string | undefined): Reply {
  let http = err instanceof HttpError ? err : mapDatabaseError(err)
  if (!http) {
    deps.log.error('unhandled error', { request_id: requestId, route: template ?? null, ...describeError(err) })
    http = new HttpError('internal_error', `An unexpected error occurred; quote request id ${requestId} when reporting it.`)
  } else if (http.status === 503 && http.code === 'database_unavailable' && !(err instanceof HttpError)) {
    // A database error. (The bound on waiting, src/db/admission.ts, answers 503 itself: no error of the database's.)
    deps.metrics.queryErrors++
    deps.log.warn('database unavailable', { request_id: requestId, ...describeError(err) })
  }
  return { status: http.status, headers: http.options.headers, body: problemBody(http, instance, requestId) }
}

/** No body at all: neither a length nor chunked transfer (RFC 9112 §6.3). */
const hasNoBody = (req: IncomingMessage) =>
  req.headers['transfer-encoding'] === undefined && (req.headers['content-length'] === undefined || req.headers['content-length'] === '0')
