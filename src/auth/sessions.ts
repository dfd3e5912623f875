import type { Sql, TransactionSql } from 'postgres'
import type { Config } from '../config.js'
import { signJwt } from './jwt.js'
import type { Role } from './principal.js'
import { effectiveScopes } from './scopes.js'
import { hashSecret, newSecret } from './tokens.js'

// Sessions, refresh-token rotation and access tokens. A login opens a session;
// each refresh retires its refresh token and issues the next pair; a retired
// refresh token presented again revokes the whole session (RFC 9700 §4.14.2).

export type TokenFormat = 'jwt' | 'opaque'

export interface TokenResponse {
  access_token: string
  token_type: 'Bearer'
  expires_in: number
  refresh_token: string
  scope: string
}

interface SessionUser {
  session_id: number
  user_id: number
  role: Role
  scopes: string[]
  token_format: TokenFormat
}

async function issuePair(tx: TransactionSql, config: Config, s: SessionUser): Promise<TokenResponse> {
  const scopes = [...effectiveScopes(s.role, s.scopes)].sort()
  const refresh = newSecret('refresh')
  await tx`INSERT INTO refresh_tokens (token_hash, session_id) VALUES (${hashSecret(refresh)}, ${s.session_id})`
  const ttl = config.accessTokenTtl
  let access: string
  if (s.token_format === 'jwt') {
    const now = Math.floor(Date.now() / 1000)
    access = signJwt(
      { sub: String(s.user_id), iss: config.jwtIssuer, aud: config.jwtAudience, iat: now, exp: now + ttl, role: s.role, scope: scopes.join(' ') },
      config.jwtSecrets[0]!,
    )
  } else {
    access = newSecret('access')
    await tx`INSERT INTO access_tokens (token_hash, session_id, expires_at) VALUES (${hashSecret(access)}, ${s.session_id}, now() + ${ttl} * interval '1 second')`
  }
  return { access_token: access, token_type: 'Bearer', expires_in: ttl, refresh_token: refresh, scope: scopes.join(' ') }
}

export async function openSession(sql: Sql, config: Config, user: { id: number; role: Role }, scopes: string[], format: TokenFormat): Promise<TokenResponse> {
  return sql.begin(async (tx) => {
    const [session] = await tx<Array<{ id: number }>>`
      INSERT INTO sessions (user_id, scopes, token_format, expires_at)
      VALUES (${user.id}, ${scopes}, ${format}, now() + ${config.refreshTokenTtl} * interval '1 second')
      RETURNING id`
    return issuePair(tx, config, { session_id: session!.id, user_id: user.id, role: user.role, scopes, token_format: format })
  })
}

/**
 * Retires the refresh token and issues the next pair, or returns undefined
 * (the caller answers 401). The conditional UPDATE makes rotation atomic: of
 * two refreshes racing with one token, exactly one finds it unused.
 */
export async function rotate(sql: Sql, config: Config, refreshToken: string): Promise<TokenResponse | undefined> {
  const hash = hashSecret(refreshToken)
  return sql.begin(async (tx) => {
    const [live] = await tx<SessionUser[]>`
      UPDATE refresh_tokens r SET used_at = now()
      FROM sessions s JOIN users u ON u.id = s.user_id
      WHERE r.token_hash = ${hash} AND r.used_at IS NULL AND s.id = r.session_id
        AND s.revoked_at IS NULL AND s.expires_at > now()
      RETURNING s.id AS session_id, u.id AS user_id, u.role, s.scopes, s.token_format`
    if (live) return issuePair(tx, config, live)
    // Known but already used: the token was copied. End the session for everyone holding it.
    const [reused] = await tx<Array<{ session_id: number }>>`SELECT session_id FROM refresh_tokens WHERE token_hash = ${hash} AND used_at IS NOT NULL`
    if (reused) await revokeSession(tx, reused.session_id)
    return undefined
  })
}

export async function revokeSession(db: Sql | TransactionSql, sessionId: number): Promise<void> {
  await db`UPDATE sessions SET revoked_at = coalesce(revoked_at, now()) WHERE id = ${sessionId}`
  await db`DELETE FROM access_tokens WHERE session_id = ${sessionId}`
}

/** The session of a refresh token (used or not), for logout. */
export async function sessionOfRefreshToken(db: Sql, refreshToken: string): Promise<number | undefined> {
  const [row] = await db<Array<{ session_id: number }>>`SELECT session_id FROM refresh_tokens WHERE token_hash = ${hashSecret(refreshToken)}`
  return row?.session_id
}
