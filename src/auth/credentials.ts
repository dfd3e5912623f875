import type { IncomingHttpHeaders } from 'node:http'
import type { Sql } from 'postgres'
import { apiKeyPrincipal } from '../api-keys/credential.js'
import type { ApiKeyCache } from '../api-keys/key-cache.js'
import type { LastUsedWrites } from '../api-keys/last-used.js'
import { HttpError } from '../http/problem.js'
import { InvalidTokenError, looksLikeJwt, verifyJwt, type SigningKey } from './jwt.js'
import type { JwtCache } from './jwt-cache.js'
import type { Principal, Role } from './principal.js'
import { effectiveScopes } from './scopes.js'
import { hashSecret, kindOf } from './tokens.js'

// Turns the credential of a request into a Principal. A request carries at
// most one: `Authorization: Bearer <JWT | opaque token | API key>` or
// `X-API-Key`. Credentials are never read from the query string.

export interface CredentialSettings {
  keys: readonly SigningKey[]
  issuer: string
  audience: string
}

/** What authentication uses: the database, the JWT settings, and the caches of one application instance. */
export interface CredentialDeps {
  sql: Sql
  /** Runs database work under the pipeline's bound on waiting for the database (src/db/admission.ts). */
  bounded: <T>(work: () => Promise<T>) => Promise<T>
  settings: CredentialSettings
  jwtCache: JwtCache
  apiKeyCache: ApiKeyCache
  apiKeyUse: LastUsedWrites
}

const REALM = 'Bearer realm="api"'
export const challenge = {
  missing: REALM,
  invalid: `${REALM}, error="invalid_token"`,
  scope: (scope: string) => `${REALM}, error="insufficient_scope", scope="${scope}"`,
}

export const unauthorized = () =>
  new HttpError(401, 'unauthorized', 'This endpoint needs a credential: Authorization: Bearer <token> or X-API-Key.', { headers: { 'www-authenticate': challenge.missing } })
const invalidToken = () =>
  new HttpError(401, 'invalid_token', 'The credential is invalid, expired or revoked.', { headers: { 'www-authenticate': challenge.invalid } })

/** The presented secret, or undefined when there is none. Two credentials are a 400. */
export function presentedCredential(headers: IncomingHttpHeaders): string | undefined {
  const authorization = headers.authorization
  const apiKey = headers['x-api-key']
  if (authorization !== undefined && apiKey !== undefined) {
    throw new HttpError(400, 'invalid_request', 'Send one credential, not both Authorization and X-API-Key.')
  }
  if (typeof apiKey === 'string') {
    // X-API-Key carries API keys only: a token sent there is a client bug worth surfacing.
    if (kindOf(apiKey.trim()) !== 'apiKey') throw invalidToken()
    return apiKey.trim()
  }
  if (authorization === undefined) return undefined
  const m = /^Bearer +([\x21-\x7e]+) *$/i.exec(authorization)
  if (!m) throw invalidToken()
  return m[1]
}

interface CredentialRow {
  user_id: number
  role: Role
  scopes: string[]
  expires_at: Date | null
  session_id: number
}

export async function authenticate(headers: IncomingHttpHeaders, deps: CredentialDeps): Promise<Principal | undefined> {
  const secret = presentedCredential(headers)
  if (secret === undefined) return undefined

  if (looksLikeJwt(secret)) return jwtPrincipal(secret, deps)

  const kind = kindOf(secret)
  if (kind === 'apiKey') {
    // A key this instance remembers costs no statement, so no wait under the database bound either.
    const principal = await apiKeyPrincipal(secret, deps)
    if (!principal) throw invalidToken()
    return principal
  }
  if (kind !== 'access') throw invalidToken()
  // Opaque tokens see the user's current role, revocation and deletion at once.
  const [row] = await deps.bounded(() => deps.sql<CredentialRow[]>`
    SELECT u.id AS user_id, u.role, s.scopes, t.expires_at, s.id AS session_id
    FROM access_tokens t JOIN sessions s ON s.id = t.session_id JOIN users u ON u.id = s.user_id
    WHERE t.token_hash = ${hashSecret(secret)} AND t.expires_at > now() AND s.revoked_at IS NULL`)
  if (!row) throw invalidToken()
  return {
    kind: 'user', userId: String(row.user_id), role: row.role,
    scopes: effectiveScopes(row.role, row.scopes),
    credential: { type: 'token', expiresAt: row.expires_at, sessionId: row.session_id },
  }
}

/** A JWT verified once per instance (src/auth/jwt-cache.ts); exp is checked on every request. */
function jwtPrincipal(token: string, { settings, jwtCache }: CredentialDeps): Principal {
  const now = Date.now() / 1000
  const cached = jwtCache.get(token, now)
  if (cached) return cached
  try {
    const claims = verifyJwt(token, { ...settings, now, leewaySeconds: jwtCache.leewaySeconds })
    // A JWT's role and scopes hold until it expires: that is the price of not reading the database.
    const role: Role = claims.role === 'admin' ? 'admin' : 'user'
    const principal: Principal = {
      kind: 'user', userId: claims.sub, role,
      scopes: effectiveScopes(role, claims.scope.split(' ')),
      credential: { type: 'jwt', expiresAt: new Date(claims.exp * 1000) },
    }
    jwtCache.set(token, principal, claims.exp)
    return principal
  } catch (err) {
    if (err instanceof InvalidTokenError) throw invalidToken()
    throw err
  }
}
