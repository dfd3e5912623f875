import { randomUUID } from 'node:crypto'
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http'
import { DatabaseBusy } from '../db/admission.js'
import { describeError, type LogFields } from '../log.js'
import { checkContentType, readJsonBody } from './body.js'
import { clientAddress, UntrustedForwardingNotice } from './client-address.js'
import { corsHeaders, type CorsPolicy } from './cors.js'
import { busyProblem, failureProblem } from './database-problems.js'
import { requireHost } from './host.js'
import { handleIdempotently } from './idempotency.js'
import { etagMatches } from './conditional.js'
import { HttpError, notFound, problemAnswer, validationFailed } from './problem.js'
import { checkQuery, parseQueryString } from './query.js'
import { writeReply } from './reply.js'
import type { AnyRoute, BatchOperation, HandlerContext, OperationScope, Reply } from './route.js'
import type { Match, Router } from './router.js'
import type { CoreServices, HttpSettings } from './services.js'
import type { RequestGuard, StageRequest } from './stages.js'

// The whole life of a request, as named stages read top to bottom in
// `handleRequest`: identify, match, admit, the application's guard
// (authentication, rate limits, authorization: src/core/http/stages.ts),
// precondition, read the query and the body, handle, conditional GET, reply,
// log. One `catch` turns any failure into a problem answer. This is the hot
// path: the stages are plain functions sharing one object per request
// (`Exchange`, and the guard's record of it), so a request allocates no
// closures but the two that outlive it (the
// log on 'close', the bounded handler).

const CLIENT_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/

const NO_HEADERS: Record<string, string> = Object.freeze({})
/** A request alone commits before its handler returns: its after-commit work runs where it stands. */
const runNow = (work: () => Promise<void>) => work()
const UNANSWERED: Reply = Object.freeze({ status: 500 })

/** What every stage may use, made once per service. */
interface Pipeline<State> {
  router: Router
  services: CoreServices
  guard: RequestGuard<State>
  config: HttpSettings
  prefix: string
  cors: CorsPolicy
  runBounded: <T>(work: () => Promise<T>) => Promise<T>
  runAsIs: <T>(work: () => Promise<T>) => Promise<T>
  forwarding: UntrustedForwardingNotice
}

/** One request as the stages learn about it. */
class Exchange<State> implements StageRequest {
  readonly started = process.hrtime.bigint()
  /** The path below the API prefix. */
  path = ''
  template: string | undefined = undefined
  cors: Record<string, string> = NO_HEADERS
  /** The answer must not be stored by any cache (Route.noStore). */
  noStore = false
  problem = false
  /** Always replaced before it is read: by the handler's answer, or by a problem. */
  reply: Reply = UNANSWERED
  /** How many operations of a batch ran (POST /batch): its log line says so. */
  operations = 0
  /** The client's address, read once (`client`). */
  private address: string | undefined = undefined

  constructor(
    readonly p: Pipeline<State>,
    readonly req: IncomingMessage,
    readonly requestId: string,
    readonly method: string,
    readonly url: string,
    readonly queryAt: number,
    readonly fullPath: string,
    /** The guard's record of the request. */
    readonly state: State,
  ) {}

  /** The client's address as TRUST_PROXY allows it to be known, read once per request. */
  client(): string {
    if (this.address === undefined) {
      this.p.forwarding.check(this.req)
      this.address = clientAddress(this.req, this.p.config.trustProxy)
    }
    return this.address
  }
}

/** The request handler of a service: core's stages, and the application's `guard` among them. */
export function createRequestHandler<State>(router: Router, services: CoreServices, guard: RequestGuard<State>) {
  const { config, databaseAdmission, log } = services
  const pipeline: Pipeline<State> = {
    router,
    services,
    guard,
    config,
    prefix: config.apiPrefix,
    cors: { origins: config.corsOrigins },
    runBounded: <T>(work: () => Promise<T>) => databaseAdmission.run(work),
    runAsIs: <T>(work: () => Promise<T>) => work(),
    forwarding: new UntrustedForwardingNotice(config.trustProxy, (message, fields) => log.warn(message, fields)),
  }
  return (req: IncomingMessage, res: ServerResponse): Promise<void> => handleRequest(pipeline, req, res)
}

async function handleRequest<State>(p: Pipeline<State>, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const x = identify(p, req)
  p.services.metrics.inFlight++
  try {
    // One valid Host (RFC 9112 §3.2); the server leaves the check to us (src/app.ts) so that the answer is a problem.
    requireHost(req)
    const match = matchRoute(p, x)
    if (match.kind === 'options') {
      x.reply = preflight(p, x, match.allow)
    } else {
      const { route, params } = match
      admit(p, route)
      const checking = p.guard.check(x.state, x, route, params)
      if (checking) await checking
      requirePrecondition(p, req.headers['if-match'], route)
      const query = readQuery(route, x.queryAt === -1 ? '' : x.url.slice(x.queryAt + 1))
      const body =
        route.body && !(route.body.optional && hasNoBody(req))
          ? route.body.validator.parseBody(await readBody(p, x, route.body))
          : undefined
      x.reply = conditionalGet(x, await handle(p, x, route, params, query, body))
    }
  } catch (err) {
    x.problem = true
    x.reply = problemReply(err, x.fullPath, x.requestId, p.services, x.template)
  }
  reply(p, x, res)
}

/** The request id (the client's, when it is a sane one), the method and the path. */
function identify<State>(p: Pipeline<State>, req: IncomingMessage): Exchange<State> {
  const clientId = req.headers['x-request-id']
  const requestId = typeof clientId === 'string' && CLIENT_REQUEST_ID.test(clientId) ? clientId : randomUUID()
  const url = req.url ?? '/'
  const queryAt = url.indexOf('?')
  return new Exchange(
    p,
    req,
    requestId,
    req.method ?? 'GET',
    url,
    queryAt,
    queryAt === -1 ? url : url.slice(0, queryAt),
    p.guard.open(),
  )
}

/** The route and its params, or an OPTIONS answer to give; 404 and 405 are thrown. */
function matchRoute<State>(p: Pipeline<State>, x: Exchange<State>): Extract<Match, { kind: 'found' | 'options' }> {
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
    throw new HttpError('method_not_allowed', `${x.method} is not supported here; use ${match.allow}.`, {
      headers: { allow: match.allow },
    })
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
function unmatched<State>(x: Exchange<State>): never {
  x.noStore = true
  throw notFound()
}

/** A CORS preflight gets the methods the path allows; any other OPTIONS only the Allow list. */
function preflight<State>(p: Pipeline<State>, x: Exchange<State>, allow: string): Reply {
  if (x.req.headers['access-control-request-method'] !== undefined)
    x.cors = corsHeaders(p.cors, x.req.headers.origin, allow)
  return { status: 204, headers: { allow } }
}

/** While draining, only public routes (the probes) are still served. */
function admit<State>(p: Pipeline<State>, route: AnyRoute): void {
  if (p.services.stopping.draining && !p.guard.isPublic(route)) {
    throw new HttpError('shutting_down', 'The service is shutting down; retry on another instance.', {
      headers: { 'retry-after': '1', connection: 'close' },
    })
  }
}

function requirePrecondition<State>(p: Pipeline<State>, ifMatch: string | undefined, route: AnyRoute): void {
  if (p.config.requireIfMatch && route.requiresIfMatch && ifMatch === undefined) {
    throw new HttpError(
      'precondition_required',
      'This server requires If-Match on writes: GET the resource and send its ETag.',
    )
  }
}

function readQuery(route: AnyRoute, queryString: string): unknown {
  return checkQuery(route.query, parseQueryString(queryString))
}

/** The body as JSON, once its Content-Type is the route's; the route's validator checks it. */
function readBody<State>(
  p: Pipeline<State>,
  x: Exchange<State>,
  body: NonNullable<AnyRoute['body']>,
): Promise<unknown> {
  checkContentType(x.req, body.kind)
  return readJsonBody(x.req, p.config.bodyLimit * (body.limitFactor ?? 1))
}

/**
 * Runs the handler, through the idempotency record for a creating POST,
 * under database admission as the route's `database` says: the whole
 * handler, only the statements it runs through `ctx.bounded`, or nothing.
 */
function handle<State>(
  p: Pipeline<State>,
  x: Exchange<State>,
  route: AnyRoute,
  params: Record<string, string>,
  query: unknown,
  body: unknown,
): Promise<Reply> {
  const database = route.database ?? 'handler'
  const bounded = database === 'statements' ? p.runBounded : p.runAsIs
  // The guard sets the application's members (ContextExtensions) on it before anything reads it.
  const ctx = contextOf(p, x, {
    params,
    query,
    body,
    headers: x.req.headers,
    bounded,
    db: p.services.sql,
    onCommit: runNow,
  })
  if (route.runsOperations) {
    ctx.runOperation = (operation, scope) => runOperation(p, x, operation, scope)
    ctx.checkOperation = (operation) => void matchOperation(p, x, operation, true)
  }
  p.guard.extend(ctx, x.state)
  if (database === 'handler') return p.runBounded(() => invoke(p, x, route, ctx))
  return invoke(p, x, route, ctx)
}

function invoke<State>(
  p: Pipeline<State>,
  x: Exchange<State>,
  route: AnyRoute,
  ctx: HandlerContext<unknown, unknown>,
): Promise<Reply> {
  if (!route.idempotent) return route.handle(ctx)
  return handleIdempotently(route, ctx, x.path, p.guard.caller(x.state) ?? `address ${ctx.client}`, p.services)
}

/**
 * One operation of a batch, through the stages a request of the same caller
 * goes through once it is authenticated: match, the guard's count and access
 * check, precondition, query, body, handler; on the batch's transaction, not
 * under database admission (the batch is) and not through the idempotency
 * record (the batch has one). Only `batchable` routes run: a resource's.
 */
function runOperation<State>(
  p: Pipeline<State>,
  x: Exchange<State>,
  operation: BatchOperation,
  scope: OperationScope,
): Promise<Reply> {
  const { route, params, queryAt } = matchOperation(p, x, operation, scope.counted)
  x.operations++
  requirePrecondition(p, operation.if_match, route)
  const query = readQuery(route, queryAt === -1 ? '' : operation.path.slice(queryAt + 1))
  const body = operationBody(p, route, operation.body)
  const headers: IncomingHttpHeaders = { ...x.req.headers, 'if-match': operation.if_match }
  delete headers['idempotency-key']
  delete headers['if-none-match']
  const ctx = contextOf(p, x, {
    params,
    query,
    body,
    headers,
    bounded: p.runAsIs,
    db: scope.db,
    onCommit: scope.onCommit,
  })
  p.guard.extend(ctx, x.state)
  return route.handle(ctx)
}

/** What differs between the context of a request and that of an operation of a batch. */
type ContextParts = Pick<
  HandlerContext<unknown, unknown>,
  'params' | 'query' | 'body' | 'headers' | 'bounded' | 'db' | 'onCommit'
>

/** A handler's context: its parts, completed (in place: one object per request) with what the exchange gives. */
function contextOf<State>(
  p: Pipeline<State>,
  x: Exchange<State>,
  parts: ContextParts,
): HandlerContext<unknown, unknown> {
  const ctx = parts as HandlerContext<unknown, unknown>
  ctx.requestId = x.requestId
  ctx.client = x.client()
  ctx.services = p.services as HandlerContext<unknown, unknown>['services']
  return ctx
}

/** The operation's route, which a batch may run and this caller may call (counted in its rate unless `counted`). */
function matchOperation<State>(p: Pipeline<State>, x: Exchange<State>, operation: BatchOperation, counted: boolean) {
  const queryAt = operation.path.indexOf('?')
  const fullPath = queryAt === -1 ? operation.path : operation.path.slice(0, queryAt)
  const { prefix } = p
  if (prefix && !fullPath.startsWith(prefix + '/')) throw notFound()
  const match = p.router.match(operation.method, fullPath.slice(prefix.length))
  if (match.kind === 'not_found') throw notFound()
  if (match.kind !== 'found')
    throw new HttpError('method_not_allowed', `${operation.method} is not supported here; use ${match.allow}.`)
  const { route, params } = match
  if (!route.batchable)
    throw new HttpError('not_batchable', `${operation.method} ${match.template} cannot be an operation of a batch.`)
  p.guard.admitOperation(x.state, x, route, params, counted)
  return { route, params, queryAt }
}

/** An operation's body, checked as its request's would be: within BODY_LIMIT, by the route's validator. */
function operationBody<State>(p: Pipeline<State>, route: AnyRoute, body: unknown): unknown {
  if (!route.body) {
    if (body === undefined) return undefined
    throw validationFailed([{ path: '/body', message: 'this operation takes no body' }])
  }
  if (body === undefined && route.body.optional) return undefined
  if (body === undefined) throw validationFailed([{ path: '/body', message: 'this operation needs a body' }])
  if (Buffer.byteLength(JSON.stringify(body)) > p.config.bodyLimit)
    throw new HttpError('payload_too_large', `An operation's body must not exceed ${p.config.bodyLimit} bytes.`)
  return route.body.validator.parseBody(body)
}

/** RFC 9110 §15.4.5: a 304 repeats the validator, and nothing else of the body. */
function conditionalGet<State>(x: Exchange<State>, reply: Reply): Reply {
  if (
    reply.status === 200 &&
    (x.method === 'GET' || x.method === 'HEAD') &&
    etagMatches(x.req.headers['if-none-match'], reply.headers?.etag)
  ) {
    return { status: 304, headers: { etag: reply.headers!.etag! } }
  }
  return reply
}

function reply<State>(p: Pipeline<State>, x: Exchange<State>, res: ServerResponse): void {
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
function answerHeaders<State>(p: Pipeline<State>, x: Exchange<State>): Record<string, string> {
  const headers = { ...x.reply.headers }
  // While stopping (draining, or waiting to), every answer asks the client to take its next request elsewhere.
  if (p.services.stopping.draining || p.services.stopping.drainsAt !== undefined) headers.connection = 'close'
  // Served over TLS itself, the service tells browsers to keep to HTTPS (RFC 6797); behind a proxy, the proxy says it.
  if (p.config.tls) headers['strict-transport-security'] = 'max-age=31536000'
  // Answers about credentials must not be stored by any cache (RFC 6749 §5.1), errors included.
  if (x.noStore) headers['cache-control'] = 'no-store'
  Object.assign(headers, x.cors)
  p.guard.answerHeaders(x.state, headers)
  return headers
}

function logRequest<State>(p: Pipeline<State>, x: Exchange<State>): void {
  const seconds = Number(process.hrtime.bigint() - x.started) / 1e9
  const { metrics, log } = p.services
  metrics.inFlight--
  metrics.observe(x.method, x.template ?? null, x.reply.status, seconds)
  const fields: LogFields = {
    request_id: x.requestId,
    method: x.method,
    route: x.template ?? null,
    status: x.reply.status,
    // To the microsecond: a float's last digits (1.1179729999999999) are noise in a log line.
    duration_ms: Math.round(seconds * 1e6) / 1000,
  }
  if (x.operations) fields.operations = x.operations
  p.guard.logFields(x.state, fields)
  fields.client = x.client()
  log.info('request', fields)
}

function problemReply(
  err: unknown,
  instance: string,
  requestId: string,
  services: CoreServices,
  template: string | undefined,
): Reply {
  let http = err instanceof HttpError ? err : err instanceof DatabaseBusy ? busyProblem(err) : failureProblem(err)
  if (!http) {
    services.log.error('unhandled error', { request_id: requestId, route: template ?? null, ...describeError(err) })
    http = new HttpError(
      'internal_error',
      `An unexpected error occurred; quote request id ${requestId} when reporting it.`,
    )
  } else if (!(err instanceof HttpError || err instanceof DatabaseBusy)) {
    // An error of the database itself; what database admission refused never reached it.
    services.metrics.queryErrors++
    services.log.warn('database unavailable', { request_id: requestId, ...describeError(err) })
  }
  const { unknown, ...answer } = problemAnswer(http, services.problems, instance, requestId)
  if (unknown)
    services.log.error('a problem code the service does not have', { request_id: requestId, code: http.code })
  return answer
}

/** No body at all: neither a length nor chunked transfer (RFC 9112 §6.3). */
const hasNoBody = (req: IncomingMessage) =>
  req.headers['transfer-encoding'] === undefined &&
  (req.headers['content-length'] === undefined || req.headers['content-length'] === '0')
