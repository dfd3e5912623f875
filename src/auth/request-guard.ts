import type { IncomingMessage } from 'node:http'
import type { AuthServices } from './services.js'
import { addressBucket } from '../core/http/client-address.js'
import { HttpError } from '../core/http/problem.js'
import type { RateDecision, RateLimiter } from '../core/http/rate-limit.js'
import type { AnyRoute } from '../core/http/route.js'
import type { RequestGuard, StageRequest } from '../core/http/stages.js'
import { authorize } from './access.js'
import { authenticate, credentialDeps, type CredentialDeps } from './credentials.js'
import { looksLikeJwt } from './jwt.js'
import { anonymous, type Principal } from './principal.js'

// The application's stages of the request pipeline (src/core/http/stages.ts),
// in the order they run: a spent address is refused before its credential
// costs a database read; the credential becomes a principal (a failed one
// counts against the address, so that guessing tokens is limited too); the
// request counts against its credential's, its user's or its address's
// window; the route's access is checked.

/** What the guard learned of one request. */
class Guarded {
  principal: Principal = anonymous
  rate: RateDecision | undefined = undefined
}

/** A user may spend this many credentials' worth of RATE_LIMIT in all: N keys do not give N times the limit. */
const USER_LIMIT_FACTOR = 3

export function requestGuard(deps: AuthServices): RequestGuard<Guarded> {
  const { config, rateLimiter: limiter } = deps
  // Only credentials read from the database wait under database admission; a JWT is checked in memory.
  const credentials: CredentialDeps = credentialDeps(deps, (work) => deps.databaseAdmission.run(work))
  const isPublic = (route: AnyRoute) => route.access.kind === 'public'
  /** The rate limiter, unless RATE_LIMIT=0 or the route is exempt. */
  const limiterFor = (route: AnyRoute) => (route.unlimited ? undefined : limiter)

  /** The request counts against its window (unless already `counted`), then the route's access is checked. */
  function admit(
    state: Guarded,
    request: StageRequest,
    route: AnyRoute,
    params: Record<string, string>,
    counted = false,
  ): void {
    const limits = counted ? undefined : limiterFor(route)
    if (limits) state.rate = rateLimit(state, limits, request, config.rateLimit)
    authorize(route.access, state.principal, params, config)
  }

  async function authenticateThenAdmit(
    state: Guarded,
    request: StageRequest,
    route: AnyRoute,
    params: Record<string, string>,
  ): Promise<void> {
    const limits = limiterFor(route)
    if (limits) refuseSpentAddress(state, limits, request)
    try {
      state.principal = (await authenticate(request.req.headers, credentials)) ?? anonymous
    } catch (err) {
      // Failed credentials count against the address, so that guessing tokens is limited too.
      if (limits) state.rate = enforce(limits, addressBucket(request.client()))
      throw err
    }
    admit(state, request, route, params)
  }

  return {
    open: () => new Guarded(),
    isPublic,
    check(state, request, route, params) {
      // Public routes never look at a credential (no database read for /healthz).
      if (isPublic(route)) return void admit(state, request, route, params)
      return authenticateThenAdmit(state, request, route, params)
    },
    admitOperation: admit,
    extend(ctx, state) {
      ctx.principal = state.principal
    },
    caller: ({ principal }) => (principal.kind === 'user' ? `user ${principal.userId}` : undefined),
    answerHeaders(state, headers) {
      if (state.rate) setRateHeaders(headers, state.rate)
    },
    logFields({ principal }, fields) {
      fields.user_id = principal.kind === 'user' ? principal.userId : null
    },
  }
}

/**
 * An address that has spent its window on anonymous requests and bad credentials is refused before a credential costs a
 * database read.
 */
function refuseSpentAddress(state: Guarded, limiter: RateLimiter, request: StageRequest): void {
  if (!needsDatabaseRead(request.req)) return
  const bucket = addressBucket(request.client())
  if (limiter.exhausted(bucket)) state.rate = enforce(limiter, bucket)
}

/**
 * Counts the request against its credential's bucket and its user's (or its
 * client address when anonymous); the answer shows the credential's figures
 * unless the user's bucket is the one that refuses.
 */
function rateLimit({ principal }: Guarded, limiter: RateLimiter, request: StageRequest, limit: number): RateDecision {
  if (principal.kind === 'anonymous') return enforce(limiter, addressBucket(request.client()))
  const c = principal.credential
  // A session is its user's: JWTs and opaque tokens of one login share a bucket; a user's provider tokens share one.
  const credential =
    c.type === 'api_key'
      ? `key ${c.apiKeyId}`
      : c.type === 'oidc'
        ? `oidc ${principal.userId}`
        : `session ${principal.userId}:${c.sessionId}`
  enforce(limiter, `user ${principal.userId}`, limit * USER_LIMIT_FACTOR)
  return enforce(limiter, credential)
}

/** Opaque tokens and API keys may cost a database read; a JWT is checked in memory. */
function needsDatabaseRead(req: IncomingMessage): boolean {
  const authorization = req.headers.authorization
  return (
    req.headers['x-api-key'] !== undefined ||
    (authorization !== undefined && !looksLikeJwt(authorization.replace(/^Bearer +/i, '').trim()))
  )
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
