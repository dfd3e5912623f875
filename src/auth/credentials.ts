import type { IncomingHttpHeaders } from 'node:http'
import type { AuthServices } from './services.js'
import type { Sql } from 'postgres'
import { apiKeyPrincipals, recordKeyUse } from './api-keys/credential.js'
import type { ApiKeyCache } from './api-keys/key-cache.js'
import type { LastUsedWrites } from './api-keys/last-used.js'
import { HttpError } from '../core/http/problem.js'
import { InvalidTokenError, looksLikeJwt, verifyJwt, type SigningKey } from './jwt.js'
import type { CredentialChanges } from './revocation/credential-changes.js'
import type { JwtCache } from './jwt-cache.js'
import type { Principal, Role, UserPrincipal } from './principal.js'
import type { RevocationList } from './revocation/revocations.js'
import type { ScopePolicy } from './scopes.js'
import { hashList, hashSecret, kindOf } from './tokens.js'
import type { EventOrigin } from './origin.js'
import { AdminNotLinked } from './oidc/identities.js'
import { ProviderUnavailable } from './oidc/key-set.js'
import type { IdentityProvider } from './oidc/provider-principals.js'
import type { Clock } from '../core/lib/clock.js'

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
  /** Runs database work under database admission (src/core/db/admission.ts). */
  bounded: <T>(work: () => Promise<T>) => Promise<T>
  settings: CredentialSettings
  jwtCache: JwtCache
  apiKeyCache: ApiKeyCache
  apiKeyUse: LastUsedWrites
  /** Which scopes exist, and which each role may hold (src/registry.ts). */
  scopes: ScopePolicy
  revocations: RevocationList
  /** Whether `revocations` (and the API key cache) may be trusted now. */
  credentialChanges: Pick<CredentialChanges, 'trusted'>
  clock: Clock
  /** The identity provider whose tokens are accepted too (OIDC_ISSUER); undefined when none is configured. */
  identityProvider: IdentityProvider | undefined
}

/** What authentication uses of an instance's deps; `bounded` as the caller waits for the database. */
export function credentialDeps(
  deps: Pick<
    AuthServices,
    | 'sql'
    | 'config'
    | 'jwtCache'
    | 'apiKeyCache'
    | 'apiKeyUse'
    | 'revocations'
    | 'credentialChanges'
    | 'registry'
    | 'identityProvider'
    | 'clock'
  >,
  bounded: CredentialDeps['bounded'],
): CredentialDeps {
  const { config } = deps
  return {
    sql: deps.sql,
    bounded,
    settings: { keys: config.jwtSecrets, issuer: config.jwtIssuer, audience: config.jwtAudience },
    jwtCache: deps.jwtCache,
    apiKeyCache: deps.apiKeyCache,
    apiKeyUse: deps.apiKeyUse,
    revocations: deps.revocations,
    credentialChanges: deps.credentialChanges,
    scopes: deps.registry.scopes,
    identityProvider: deps.identityProvider,
    clock: deps.clock,
  }
}

const REALM = 'Bearer realm="api"'
export const challenge = {
  missing: REALM,
  invalid: `${REALM}, error="invalid_token"`,
  scope: (scope: string) => `${REALM}, error="insufficient_scope", scope="${scope}"`,
}

export const unauthorized = () =>
  new HttpError('unauthorized', 'This endpoint needs a credential: Authorization: Bearer <token> or X-API-Key.', {
    headers: { 'www-authenticate': challenge.missing },
  })
export const invalidToken = () =>
  new HttpError('invalid_token', 'The credential is invalid, expired or revoked.', {
    headers: { 'www-authenticate': challenge.invalid },
  })
/** A credential accepted a moment ago whose user was deleted since (a JWT may outlive its user by that moment). */
export const userGone = () =>
  new HttpError('invalid_token', 'The user of this credential no longer exists.', {
    headers: { 'www-authenticate': challenge.invalid },
  })

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

/** A credential as presented, its form checked and nothing looked up yet: what `checkCredentials` takes. */
export type Presented =
  { kind: 'jwt'; token: string } | { kind: 'provider'; token: string } | { kind: 'apiKey' | 'access'; hash: Buffer }

/**
 * What a presented secret is; a secret of no kind we issue is invalid. Whose a JWT is, ours or the identity provider's,
 * checkCredentials tells.
 */
export function classifySecret(secret: string): Presented {
  if (looksLikeJwt(secret)) return { kind: 'jwt', token: secret }
  const kind = kindOf(secret)
  if (kind !== 'apiKey' && kind !== 'access') throw invalidToken()
  return { kind, hash: hashSecret(secret) }
}

export async function authenticate(headers: IncomingHttpHeaders, deps: CredentialDeps): Promise<Principal | undefined> {
  const secret = presentedCredential(headers)
  if (secret === undefined) return undefined
  const [principal] = await checkCredentials([classifySecret(secret)], deps)
  if (!principal) throw invalidToken()
  if (principal.credential.type === 'api_key') await recordKeyUse(principal.credential.apiKeyId, deps)
  return principal
}

/**
 * The Principal each credential gets now, as a request presenting it would,
 * or undefined where it is invalid, expired or revoked. However many there
 * are, the database is read at most once per kind: an answer that outlives
 * its request (src/auth/grants.ts) checks its credential again this way,
 * all of an instance's at once.
 */
export async function checkCredentials(
  presented: readonly Presented[],
  deps: CredentialDeps,
): Promise<Array<UserPrincipal | undefined>> {
  const principals: Array<UserPrincipal | undefined> = presented.map(() => undefined)
  const jwts: Array<{ at: number; principal: UserPrincipal }> = []
  const keys: Array<{ at: number; hash: Buffer }> = []
  const tokens: Array<{ at: number; hash: Buffer }> = []
  const providerTokens: Array<{ at: number; token: string }> = []
  presented.forEach((p, at) => {
    switch (p.kind) {
      case 'provider':
        return void providerTokens.push({ at, token: p.token })
      case 'apiKey':
        return void keys.push({ at, hash: p.hash })
      case 'access':
        return void tokens.push({ at, hash: p.hash })
      case 'jwt': {
        // One this instance verified before is ours, and costs no decoding; a new one is the provider's when its iss
        // says so.
        if (!deps.jwtCache.has(p.token) && deps.identityProvider?.issued(p.token))
          return void providerTokens.push({ at, token: p.token })
        const principal = verifiedJwt(p.token, deps)
        if (principal) jwts.push({ at, principal })
      }
    }
  })
  const found = await Promise.all([
    unrevokedJwts(jwts, deps),
    providerPrincipals(providerTokens, deps),
    keys.length === 0
      ? []
      : apiKeyPrincipals(
          keys.map((k) => k.hash),
          deps,
        ).then((found) => keys.map((k, i) => ({ at: k.at, principal: found[i] }))),
    opaqueTokens(tokens, deps),
  ])
  for (const { at, principal } of found.flat()) principals[at] = principal
  return principals
}

/** The 503 of a provider token (as bearer, or in a body) while its keys cannot be fetched and none are cached. */
export const providerUnavailable = (err: ProviderUnavailable) =>
  new HttpError(
    'identity_provider_unavailable',
    'The identity provider that issued this token cannot be reached, and its keys are not known yet; try again ' +
      'shortly.',
    {
      headers: { 'retry-after': String(err.retryAfterSeconds) },
    },
  )

/**
 * Principals of the identity provider's tokens; a provider that cannot be reached with no keys cached is a 503, the
 * address of a local admin on a token not linked yet a 403. (Neither reaches the checks of an answer that outlives its
 * request, src/auth/grants.ts: its token was verified, and linked, when the request was let in.)
 */
async function providerPrincipals(
  tokens: ReadonlyArray<{ at: number; token: string }>,
  deps: CredentialDeps,
): Promise<Array<{ at: number; principal: UserPrincipal | undefined }>> {
  const provider = deps.identityProvider
  if (tokens.length === 0 || !provider) return []
  const providerDeps = { ...deps, trusted: () => deps.credentialChanges.trusted, origin: PROVISIONED }
  try {
    return await Promise.all(
      tokens.map(async ({ at, token }) => ({ at, principal: await provider.principalOf(token, providerDeps) })),
    )
  } catch (err) {
    if (err instanceof ProviderUnavailable) throw providerUnavailable(err)
    if (err instanceof AdminNotLinked) {
      throw new HttpError(
        'identity_link_required',
        "The address of this token is a local admin's: an account of the identity provider is never linked to an " +
          'admin by its address. The admin links it from a session of its own: POST /auth/identities.',
      )
    }
    throw err
  }
}

/** A user made from a provider token is made by that token, before it has a user. */
const PROVISIONED: EventOrigin = Object.freeze({ actorId: null, credential: 'oidc', requestId: null })

interface CredentialRow {
  token_hash: Buffer
  user_id: number
  role: Role
  scopes: string[]
  expires_at: string | null
  session_id: number
  amr: string[]
  auth_time: number
}

/** Opaque tokens see the user's current role, revocation and deletion at once: they are read every time. */
async function opaqueTokens(
  tokens: ReadonlyArray<{ at: number; hash: Buffer }>,
  deps: CredentialDeps,
): Promise<Array<{ at: number; principal: UserPrincipal }>> {
  if (tokens.length === 0) return []
  const rows = await deps.bounded(
    () => deps.sql<CredentialRow[]>`
    SELECT t.token_hash, u.id AS user_id, u.role, s.scopes, t.expires_at, s.id AS session_id, s.amr,
      floor(extract(epoch FROM s.created_at))::float8 AS auth_time
    FROM access_tokens t JOIN sessions s ON s.id = t.session_id JOIN users u ON u.id = s.user_id
    WHERE t.token_hash = ANY(${hashList(
      deps.sql,
      tokens.map((t) => t.hash),
    )}) AND t.expires_at > now() AND s.revoked_at IS NULL AND u.deleted_at IS NULL`,
  )
  const byHash = new Map(rows.map((row) => [row.token_hash.toString('base64'), row]))
  return tokens.flatMap(({ at, hash }) => {
    const row = byHash.get(hash.toString('base64'))
    if (!row) return []
    const principal: UserPrincipal = {
      kind: 'user',
      userId: String(row.user_id),
      role: row.role,
      scopes: deps.scopes.effective(row.role, row.scopes),
      credential: {
        type: 'token',
        expiresAt: row.expires_at,
        sessionId: row.session_id,
        proof: { amr: row.amr, authTime: row.auth_time },
      },
    }
    return [{ at, principal }]
  })
}

/**
 * JWTs verified once per instance (src/auth/jwt-cache.ts); exp and
 * revocation are checked every time. Revocation comes from memory while
 * this instance provably hears every change, else from the database.
 */
async function unrevokedJwts<T extends { principal: UserPrincipal }>(
  jwts: readonly T[],
  deps: CredentialDeps,
): Promise<T[]> {
  if (jwts.length === 0) return []
  const claims = jwts.map(({ principal }) => {
    const { credential } = principal
    if (credential.type !== 'jwt') throw new Error('unreachable: a JWT principal')
    return { userId: Number(principal.userId), sessionId: credential.sessionId, epoch: credential.epoch }
  })
  if (deps.credentialChanges.trusted)
    return jwts.filter((_, i) => !deps.revocations.revokes(claims[i]!.userId, claims[i]!.sessionId, claims[i]!.epoch))
  const live = await liveInDatabase(deps, claims)
  return jwts.filter((_, i) => live.has(i))
}

function verifiedJwt(token: string, { settings, jwtCache, scopes, clock }: CredentialDeps): UserPrincipal | undefined {
  const now = clock.now() / 1000
  const cached = jwtCache.get(token, now)
  if (cached) return cached
  try {
    const claims = verifyJwt(token, { ...settings, now, leewaySeconds: jwtCache.leewaySeconds })
    // The role and scopes of the token hold until it expires or is revoked: a role change raises the epoch (sql/005).
    const role: Role = claims.role === 'admin' ? 'admin' : 'user'
    const principal: UserPrincipal = {
      kind: 'user',
      userId: claims.sub,
      role,
      scopes: scopes.effective(role, claims.scope.split(' ')),
      credential: {
        type: 'jwt',
        expiresAt: new Date(claims.exp * 1000).toISOString(),
        sessionId: Number(claims.sid),
        epoch: claims.gen,
        proof: { amr: claims.amr ?? ['pwd'], authTime: claims.auth_time ?? claims.iat },
      },
    }
    jwtCache.set(token, principal, claims.exp)
    return principal
  } catch (err) {
    if (err instanceof InvalidTokenError) return undefined
    throw err
  }
}

/**
 * The same rule as RevocationList.revokes, from the tables themselves: the
 * user exists at that epoch and the session was not ended. A session that
 * does not exist is not a revoked one: sessions go only with their user.
 * The positions in `claims` of those that live.
 */
async function liveInDatabase(
  { sql, bounded }: CredentialDeps,
  claims: ReadonlyArray<{ userId: number; sessionId: number; epoch: number }>,
): Promise<Set<number>> {
  const rows = await bounded(
    () => sql<Array<{ at: number }>>`
    SELECT c.at - 1 AS at
    FROM unnest(${claims.map((c) => c.userId)}::bigint[], ${claims.map((c) => c.sessionId)}::bigint[],
    ${claims.map((c) => c.epoch)}::integer[])
      WITH ORDINALITY AS c(user_id, session_id, epoch, at)
    WHERE EXISTS (
      SELECT 1 FROM users u WHERE u.id = c.user_id AND u.credential_epoch = c.epoch AND u.deleted_at IS NULL)
      AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = c.session_id AND s.revoked_at IS NOT NULL)`,
  )
  return new Set(rows.map((r) => Number(r.at)))
}
