import type { IncomingHttpHeaders } from 'node:http'
import type { Sql } from 'postgres'
import { apiKeyPrincipal } from '../api-keys/credential.js'
import type { ApiKeyCache } from '../api-keys/key-cache.js'
import type { LastUsedWrites } from '../api-keys/last-used.js'
import { HttpError } from '../http/problem.js'
import { InvalidTokenError, looksLikeJwt, verifyJwt, type SigningKey } from './jwt.js'
import type { CredentialChanges } from './credential-changes.js'
import type { JwtCache } from './jwt-cache.js'
import type { Principal, Role, UserPrincipal } from './principal.js'
import type { RevocationList } from './revocations.js'
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
  revocations: RevocationList
  /** Whether `revocations` (and the API key cache) may be trusted now. */
  credentialChanges: Pick<CredentialChanges, 'trusted'>
}

const REALM = 'Bearer realm="api"'
export const challenge = {
  missing: REALM,
  invalid: `${REALM}, error="invalid_token"`,
  scope: (scope: string) => `${REALM}, error="insufficient_scope", scope="${scope}"`,
}

export const unauthorized = () =>
  new HttpError('unauthorized', 'This endpoint needs a credential: Authorization: Bearer <token> or X-API-Key.', { headers: { 'www-authenticate': challenge.missing } })
const invalidToken = () =>
  new HttpError('invalid_token', 'The credential is invalid, expired or revoked.', { headers: { 'www-authenticate': challenge.invalid } })

/** The presented secret, or undefined when there is none. Two credentials are a 400. */
export function presentedCredential(headers: IncomingHttpHeaders): string | undefined {
  const authorization = headers.authorization
  const apiKey = headers['x-api-key']
  if (authorization !== undefined && apiKey !== undefined) {
    throw new HttpError('invalid_request', 'Send one credential, not both Authorization and X-API-Key.')
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
  expires_at: string | null
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

/**
 * A JWT verified once per instance (src/auth/jwt-cache.ts); exp and
 * revocation are checked on every request. Revocation comes from memory
 * while this instance provably hears every change, else from the database.
 */
async function jwtPrincipal(token: string, deps: CredentialDeps): Promise<Principal> {
  const principal = verifiedJwt(token, deps)
  const { credential } = principal
  if (credential.type !== 'jwt') throw new Error('unreachable: a JWT principal')
  const userId = Number(principal.userId)
  const revoked = deps.credentialChanges.trusted
    ? deps.revocations.revokes(userId, credential.sessionId, credential.epoch)
    : await revokedInDatabase(deps, userId, credential.sessionId, credential.epoch)
  if (revoked) throw invalidToken()
  return principal
}

function verifiedJwt(token: string, { settings, jwtCache }: CredentialDeps): UserPrincipal {
  const now = Date.now() / 1000
  const cached = jwtCache.get(token, now)
  if (cached) return cached
  try {
    const claims = verifyJwt(token, { ...settings, now, leewaySeconds: jwtCache.leewaySeconds })
    // The role and scopes of the token hold until it expires or is revoked: a role change raises the epoch (sql/005).
    const role: Role = claims.role === 'admin' ? 'admin' : 'user'
    const principal: UserPrincipal = {
      kind: 'user', userId: claims.sub, role,
      scopes: effectiveScopes(role, claims.scope.split(' ')),
      credential: { type: 'jwt', expiresAt: new Date(claims.exp * 1000).toISOString(), sessionId: Number(claims.sid), epoch: claims.gen },
    }
    jwtCache.set(token, principal, claims.exp)
    return principal
  } catch (err) {
    if (err instanceof InvalidTokenError) throw invalidToken()
    throw err
  }
}

/**
 * The same rule as RevocationList.revokes, from the tables themselves: the
 * user exists at that epoch and the session was not ended. A session that
 * does not exist is not a revoked one: sessions go only with their user.
 */
async function revokedInDatabase({ sql, bounded }: CredentialDeps, userId: number, sessionId: number, epoch: number): Promise<boolean> {
  const [live] = await bounded(() => sql`
    SELECT 1 FROM users u WHERE u.id = ${userId} AND u.credential_epoch = ${epoch}
      AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = ${sessionId} AND s.revoked_at IS NOT NULL)`)
  return !live
}
