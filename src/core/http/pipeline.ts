import { randomUUID } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { AppDeps } from '../../app-deps.js'
import { authorize } from '../../auth/access.js'
import { authenticate, credentialDeps, type CredentialDeps } from '../../auth/credentials.js'
import { looksLikeJwt } from '../../auth/jwt.js'
import { anonymous, type Principal } from '../../auth/principal.js'
import { mapDatabaseError } from '../db/errors.js'
import { describeError } from '../log.js'
import { checkContentType, readJsonBody, type BodyKind } from './body.js'
import { addressBucket, clientAddress, UntrustedForwardingNotice } from './client-address.js'
import { corsHeaders, type CorsPolicy } from './cors.js'
import { handleIdempotently } from './idempotency.js'
import type { RateDecision, RateLimiter } from './rate-limit.js'
import { etagMatches } from './conditional.js'
import { HttpError, notFound, problemBody } from './problem.js'
import { checkQuery, parseQueryString } from './query.js'
import { writeReply } from './reply.js'
import type { AnyRoute, HandlerContext, Reply } from './route.js'
import type { Match, Router } from './router.js'

// The whole life of a request, as named stages read top to bottom in
// `handleRequest`: identify, match, admit, authenticate, rate-limit,
// authorize, precondition, read the query and the body, handle, conditional
// GET, reply, log. One `catch` turns any failure into a problem answer. This
// is the hot path: the stages are plain functions sharing one object per
// request (`Exchange`), so a request allocates no closures but the two that
// outlive it (the log on 'close', the bounded handler).

const CLIENT_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/

const NO_HEADERS: Record<string, string> = Object.freeze({})
const UNANSWERED: Reply = Object.freeze({ status: 500 })

/** What every stage may use, made once per service. */
interface Pipeline {
  router: Router
  deps: AppDeps
  config: AppDeps['config']
  prefix: string
  cors: CorsPolicy
  credentials: CredentialDeps
  runBounded: <T>(work: () => Promise<T>) => Promise<T>
  runAsIs: <T>(work: () => Promise<T>) => Promise<T>
  forwarding: UntrustedForwardingNotice
}

/** One request as the stages learn about it. */
class Exchange {
  readonly started = process.hrtime.bigint()
  /** The path below the API prefix. */
  path = ''
  template: string | undefined = undefined
  principal: Principal = anonymous
  rate: RateDecision | undefined = undefined
  cors: Record<string, string> = NO_HEADERS
  /** The answer must not be stored by any cache (Route.noStore). */
  noStore = false
  problem = false
  /** Always replaced before it is read: by the handler's answer, or by a problem. */
  reply: Reply = UNANSWERED
  /** The client's address, read once (clientOf). */
  client: string | undefined = undefined

  constructor(
    readonly req: IncomingMessage,
    readonly requestId: string,
    readonly method: string,
    readonly url: string,
    readonly queryAt: number,
    readonly fullPath: string,
  ) {}
}

export function createRequestHandler(router: Router, deps: AppDeps) {
  const { config, databaseAdmission } = deps
  const runBounded = <T>(work: () => Promise<T>) => databaseAdmission.run(work)
  const pipeline: Pipeline = {
    router,
    deps,
    config,
    prefix: config.apiPrefix,
    cors: { origins: config.corsOrigins },
    // Only credentials read from the database wait under database admission; a JWT is checked in memory.
    credentials: credentialDeps(deps, runBounded),
    runBounded,
    runAsIs: <T>(work: () => Promise<T>) => work(),
    forwarding: new UntrustedForwardingNotice(config.trustProxy, (message, fields) => deps.log.warn(message, fields)),
  }
  return (req: IncomingMessage, res: ServerResponse): Promise<void> => handleRequest(pipeline, req, res)
}

async function handleRequest(p: Pipeline, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const x = identify(req)
  p.deps.metrics.inFlight++
  try {
    const match = matchRoute(p, x)
    if (match.kind === 'options') {
      x.reply = preflight(p, x, match.allow)
    } else {
      const { route, params } = match
      admit(p, route)
      // Public routes never look at a credential (no database read for /healthz).
      if (route.access.kind !== 'public') {
        refuseSpentAddress(p, x, route)
        try {
          x.principal = (await authenticate(req.headers, p.credentials)) ?? anonymous
        } catch (err) {
          countFailedCredential(p, x, route)
          throw err
        }
      }
      rateLimit(p, x, route)
      authorize(route.access, x.principal, params, p.config.allowSignup)
      requirePrecondition(p, x, route)
      const query = readQuery(x, route)
      const body = route.body && !(route.body.optional && hasNoBody(req)) ? route.body.validator.parseBody(await readBody(p, x, route.body.kind)) : undefined
      x.reply = conditionalGet(x, await handle(p, x, route, params, query, body))
    }
  } catch (err) {
    x.problem = true
    x.reply = problemReply(err, x.fullPath, x.requestId, p.deps, x.template)
  }
  reply(p, x, res)
}

/** The request id (the client's, when it is a sane one), the method and the path. */
function identify(req: IncomingMessage): Exchange {
  const clientId = req.headers['x-request-id']
  const requestId = typeof clientId === 'string' && CLIENT_REQUEST_ID.test(clientId) ? clientId : randomUUID()
  const url = req.url ?? '/'
  const queryAt = url.indexOf('?')
  return new Exchange(req, requestId, req.method ?? 'GET', url, queryAt, queryAt === -1 ? url : url.slice(0, queryAt))
}

/** The route and its params, or an OPTIONS answer to give; 404 and 405 are thrown. */
function matchRoute(p: Pipeline, x: Exchange): Extract<Match, { kind: 'found' | 'options' }> {
  // Computed before anything can fail, so that a 404 reaches a browser page as a 404, not as a CORS error.
  x.cors = corsHeaders(p.cors, x.req.headers.origin)
  const { prefix } = p
  const { fullPath } = x
  if (prefix && !(fullPath === prefix || fullPath.startsWith(prefix + '/'))) return unmatched(x)
  x.path = fullPath.slice(prefix.length)
  const match = p.router.match(x.method, x.path)
  if (match.kind === 'not_found') return unmatched(x)
  x.template = match.template
  x.noStore = match.noStore
  if (match.kind === 'method_not_allowed') {
    throw new HttpError('method_not_allowed', `${x.method} is not supported here; use ${match.allow}.`, { headers: { allow: match.allow } })
  }
  return match
}

/**
 * 404: no route answers, so none declares how its answer may be stored. A
 * 404 is cacheable by default (RFC 9111 §4.2.2), and a shared cache that kept
 * one would go on answering it for a path under a credential route's folder
 * (a client's typo of /auth/login) or for a route deployed later; so every
 * 404 of the router says no-store.
 */
function unmatched(x: Exchange): never {
  x.noStore = true
  throw notFound()
}

/** A CORS preflight gets the methods the path allows; any other OPTIONS only the Allow list. */
function preflight(p: Pipeline, x: Exchange, allow: string): Reply {
  if (x.req.headers['access-control-request-method'] !== undefined) x.cors = corsHeaders(p.cors, x.req.headers.origin, allow)
  return { status: 204, headers: { allow } }
}

/** While draining, only public routes (the probes) are still served. */
function admit(p: Pipeline, route: AnyRoute): void {
  if (p.deps.lifecycle.shuttingDown && route.access.kind !== 'public') {
    throw new HttpError('shutting_down', 'The service is shutting down; retry on another instance.', { headers: { 'retry-after': '1', connection: 'close' } })
  }
}

/** An address that has spent its window on anonymous requests and bad credentials is refused before a credential costs a database read. */
function refuseSpentAddress(p: Pipeline, x: Exchange, route: AnyRoute): void {
  const limiter = p.deps.rateLimiter
  if (!limiter || route.unlimited || !needsDatabaseRead(x.req)) return
  const bucket = addressBucket(clientOf(p, x))
  if (limiter.exhausted(bucket)) x.rate = enforce(limiter, bucket)
}

/** Failed credentials count against the address, so that guessing tokens is limited too. */
function countFailedCredential(p: Pipeline, x: Exchange, route: AnyRoute): void {
  const limiter = p.deps.rateLimiter
  if (limiter && !route.unlimited) x.rate = enforce(limiter, addressBucket(clientOf(p, x)))
}

function rateLimit(p: Pipeline, x: Exchange, route: AnyRoute): void {
  const limiter = p.deps.rateLimiter
  if (limiter && !route.unlimited) x.rate = enforceFor(limiter, p, x)
}

function requirePrecondition(p: Pipeline, x: Exchange, route: AnyRoute): void {
  if (p.config.requireIfMatch && route.requiresIfMatch && x.req.headers['if-match'] === undefined) {
    throw new HttpError('precondition_required', 'This server requires If-Match on writes: GET the resource and send its ETag.')
  }
}

function readQuery(x: Exchange, route: AnyRoute): unknown {
  return checkQuery(route.query, parseQueryString(x.queryAt === -1 ? '' : x.url.slice(x.queryAt + 1)))
}

/** The body as JSON, once its Content-Type is the route's; the route's validator checks it. */
function readBody(p: Pipeline, x: Exchange, kind: BodyKind): Promise<unknown> {
  checkContentType(x.req, kind)
  return readJsonBody(x.req, p.config.bodyLimit)
}

/**
 * Runs the handler, through the idempotency record for a creating POST,
 * under database admission as the route's `database`
 * says: the whole handler, only the statements it runs through
 * `ctx.bounded`, or nothing.
 */
function handle(p: Pipeline, x: Exchange, route: AnyRoute, params: Record<string, string>, query: unknown, body: unknown): Promise<Reply> {
  const database = route.database ?? 'handler'
  const bounded = database === 'statements' ? p.runBounded : p.runAsIs
  const ctx: HandlerContext<unknown, unknown> = { params, query, body, principal: x.principal, headers: x.req.headers, requestId: x.requestId, client: clientOf(p, x), bounded, deps: p.deps, services: p.deps }
  if (database === 'handler') return p.deps.databaseAdmission.run(() => invoke(route, ctx, x.path))
  return invoke(route, ctx, x.path)
}

const invoke = (route: AnyRoute, ctx: HandlerContext<unknown, unknown>, path: string): Promise<Reply> =>
  route.idempotent ? handleIdempotently(route, ctx, path, ctx.principal.kind === 'user' ? `user ${ctx.principal.userId}` : `address ${ctx.client}`, ctx.services) : route.handle(ctx)

/** RFC 9110 §15.4.5: a 304 repeats the validator, and nothing else of the body. */
function conditionalGet(x: Exchange, reply: Reply): Reply {
  if (reply.status === 200 && (x.method === 'GET' || x.method === 'HEAD') && etagMatches(x.req.headers['if-none-match'], reply.headers?.etag)) {
    return { status: 304, headers: { etag: reply.headers!.etag! } }
  }
  return reply
}

function reply(p: Pipeline, x: Exchange, res: ServerResponse): void {
  // The client went away (an aborted upload, a disconnect while the handler
  // ran): nothing can be written, but the request is still logged.
  if (res.headersSent || res.destroyed) {
    x.reply.stream?.cancel()
    return logRequest(p, x)
  }
  const headers = answerHeaders(p, x)
  x.reply.headers = headers
  writeReply(res, x.reply, { requestId: x.requestId, head: x.method === 'HEAD', problem: x.problem })
  // A stream is answered once its head is out: its line and figures say how
  // long that took, not how long the client stayed (which its owner logs),
  // and it stops counting as a request in flight.
  if (x.reply.stream) return logRequest(p, x)
  if (headers.connection === 'close') res.once('finish', () => x.req.socket.destroySoon())
  // 'close' rather than 'finish': it also fires when the client leaves before the answer is flushed.
  res.once('close', () => logRequest(p, x))
}

/** The answer's own headers, and what the pipeline adds to every answer. */
function answerHeaders(p: Pipeline, x: Exchange): Record<string, string> {
  const headers = { ...x.reply.headers }
  // While draining, every answer asks the client to take its next request elsewhere.
  if (p.deps.lifecycle.shuttingDown) headers.connection = 'close'
  // Served over TLS itself, the service tells browsers to keep to HTTPS (RFC 6797); behind a proxy, the proxy says it.
  if (p.config.tls) headers['strict-transport-security'] = 'max-age=31536000'
  // Answers about credentials must not be stored by any cache (RFC 6749 §5.1), errors included.
  if (x.noStore) headers['cache-control'] = 'no-store'
  Object.assign(headers, x.cors)
  if (x.rate) setRateHeaders(headers, x.rate)
  return headers
}

function logRequest(p: Pipeline, x: Exchange): void {
  const seconds = Number(process.hrtime.bigint() - x.started) / 1e9
  const { metrics, log } = p.deps
  metrics.inFlight--
  metrics.observe(x.method, x.template ?? null, x.reply.status, seconds)
  log.info('request', {
    request_id: x.requestId,
    method: x.method,
    route: x.template ?? null,
    status: x.reply.status,
    duration_ms: seconds * 1000,
    user_id: x.principal.kind === 'user' ? x.principal.userId : null,
    client: clientOf(p, x),
  })
}

/** The client's address as TRUST_PROXY allows it to be known, read once per request. */
const clientOf = (p: Pipeline, x: Exchange): string => (x.client ??= readClient(p, x.req))

function readClient(p: Pipeline, req: IncomingMessage): string {
  p.forwarding.check(req)
  return clientAddress(req, p.config.trustProxy)
}

/** A user may spend this many credentials' worth of RATE_LIMIT in all: N keys do not give N times the limit. */
const USER_LIMIT_FACTOR = 3

/**
 * Counts the request against its credential's bucket and its user's (or its
 * client address when anonymous); the answer shows the credential's figures
 * unless the user's bucket is the one that refuses.
 */
function enforceFor(limiter: RateLimiter, p: Pipeline, x: Exchange): RateDecision {
  const { principal } = x
  if (principal.kind === 'anonymous') return enforce(limiter, addressBucket(clientOf(p, x)))
  const c = principal.credential
  // A session is its user's: JWTs and opaque tokens of one login share a bucket.
  const credential = c.type === 'api_key' ? `key ${c.apiKeyId}` : `session ${principal.userId}:${c.sessionId}`
  enforce(limiter, `user ${principal.userId}`, p.config.rateLimit * USER_LIMIT_FACTOR)
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
    const headers: Record<string, string> = { 'retry-after': String(decision.resetSeconds) }
    setRateHeaders(headers, decision)
    throw new HttpError('rate_limited', `Rate limit of ${decision.limit} requests per minute reached.`, { headers })
  }
  return decision
}

// IETF draft-ietf-httpapi-ratelimit-headers field names.
function setRateHeaders(headers: Record<string, string>, d: RateDecision): void {
  headers['ratelimit-limit'] = String(d.limit)
  headers['ratelimit-remaining'] = String(d.remaining)
  headers['ratelimit-reset'] = String(d.resetSeconds)
}

function problemReply(err: unknown, instance: string, requestId: string, deps: AppDeps, template: string | undefined): Reply {
  let http = err instanceof HttpError ? err : mapDatabaseError(err)
  if (!http) {
    deps.log.error('unhandled error', { request_id: requestId, route: template ?? null, ...describeError(err) })
    http = new HttpError('internal_error', `An unexpected error occurred; quote request id ${requestId} when reporting it.`)
  } else if (http.status === 503 && http.code === 'database_unavailable' && !(err instanceof HttpError)) {
    // A database error. (Database admission, src/core/db/admission.ts, answers 503 itself: no error of the database's.)
    deps.metrics.queryErrors++
    deps.log.warn('database unavailable', { request_id: requestId, ...describeError(err) })
  }
  return { status: http.status, headers: http.options.headers, body: problemBody(http, instance, requestId) }
}

/** No body at all: neither a length nor chunked transfer (RFC 9112 §6.3). */
const hasNoBody = (req: IncomingMessage) =>
  req.headers['transfer-encoding'] === undefined && (req.headers['content-length'] === undefined || req.headers['content-length'] === '0')
