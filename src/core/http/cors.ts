// CORS (Fetch standard), off unless CORS_ORIGINS lists origins. Only listed
// origins get Access-Control-Allow-Origin (echoed, never `*` unless `*` is
// configured); credentials travel in the Authorization header, not cookies, so
// Access-Control-Allow-Credentials is never sent. `Vary: Origin` goes on every
// answer while CORS is on, so a shared cache never hands one origin's answer
// to another.

const ALLOWED_REQUEST_HEADERS =
  'authorization, content-type, idempotency-key, if-match, if-none-match, x-api-key, x-request-id'
const EXPOSED_HEADERS =
  'etag, link, location, retry-after, x-request-id, x-total-count, idempotent-replayed, ratelimit-limit, ' +
  'ratelimit-remaining, ratelimit-reset'
const PREFLIGHT_MAX_AGE = '600'

export interface CorsPolicy {
  origins: ReadonlySet<string>
}

export function corsHeaders(
  policy: CorsPolicy,
  origin: string | undefined,
  preflightAllow?: string,
): Record<string, string> {
  if (policy.origins.size === 0) return {}
  const headers: Record<string, string> = { vary: 'Origin' }
  if (origin === undefined) return headers
  const any = policy.origins.has('*')
  if (!any && !policy.origins.has(origin)) return headers
  headers['access-control-allow-origin'] = any ? '*' : origin
  if (preflightAllow) {
    headers['access-control-allow-methods'] = preflightAllow
    headers['access-control-allow-headers'] = ALLOWED_REQUEST_HEADERS
    headers['access-control-max-age'] = PREFLIGHT_MAX_AGE
  } else {
    headers['access-control-expose-headers'] = EXPOSED_HEADERS
  }
  return headers
}
