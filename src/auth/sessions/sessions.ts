import type { Sql, TransactionSql } from 'postgres'
import type { AuthServices } from '../services.js'
import { originValues } from '../../core/resources/change-events.js'
import type { EventOrigin } from '../origin.js'
import { signJwt } from '../jwt.js'
import type { Role } from '../principal.js'
import { hashSecret, newSecret } from '../tokens.js'
import { apiKeys } from '../api-keys/declaration.js'
import { deleteRowsWhere } from '../../core/resources/store.js'

// Sessions, refresh-token rotation and access tokens. A login opens a session;
// each refresh retires its refresh token and issues the next pair; a retired
// refresh token presented again revokes the whole session (RFC 9700 §4.14.2).
// Beside this file, the caller's own sessions and the way out of them
// (session-routes.ts). What ends sessions from elsewhere (recovery/, users)
// imports this folder; the routes that log in are src/auth/routes.ts.

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
  /** The user's credential epoch, carried by its JWTs (`gen`): raising it voids them (sql/005). */
  credential_epoch: number
  scopes: string[]
  token_format: TokenFormat
  /** How the session's login proved the user, and when (seconds): its JWTs carry both. */
  amr: string[]
  auth_time: number
}

/** Who opens a session, as GET /auth/sessions shows it. */
export interface SessionClient {
  userAgent: string | undefined
  address: string
}

/**
 * What sessions use of a service: its settings, and its scopes
 * (a refresh narrows a session's to what the role allows now).
 */
export type SessionDeps = Pick<AuthServices, 'config' | 'registry' | 'clock'>

async function issuePair(
  tx: TransactionSql,
  { config, registry, clock }: SessionDeps,
  s: SessionUser,
): Promise<TokenResponse> {
  const scopes = [...registry.scopes.effective(s.role, s.scopes)].sort()
  const refresh = newSecret('refresh')
  await tx`INSERT INTO refresh_tokens (token_hash, session_id) VALUES (${hashSecret(refresh)}, ${s.session_id})`
  const ttl = config.accessTokenTtl
  let access: string
  if (s.token_format === 'jwt') {
    const now = Math.floor(clock.now() / 1000)
    access = signJwt(
      {
        sub: String(s.user_id),
        iss: config.jwtIssuer,
        aud: config.jwtAudience,
        iat: now,
        exp: now + ttl,
        role: s.role,
        scope: scopes.join(' '),
        sid: String(s.session_id),
        gen: s.credential_epoch,
        amr: s.amr,
        auth_time: s.auth_time,
      },
      config.jwtSecrets[0]!,
    )
  } else {
    access = newSecret('access')
    await tx`INSERT INTO access_tokens (token_hash, session_id, expires_at) VALUES
      (${hashSecret(access)}, ${s.session_id}, now() + ${ttl} * interval '1 second')`
  }
  return {
    access_token: access,
    token_type: 'Bearer',
    expires_in: ttl,
    refresh_token: refresh,
    scope: scopes.join(' '),
  }
}

/**
 * A new session and its first pair, or undefined when the user's credentials
 * changed since `user` was read (a password or role change raced the login):
 * tokens of an older epoch would be void at once, so none are issued.
 */
export async function openSession(
  sql: Sql,
  deps: SessionDeps,
  user: { id: number; role: Role; credential_epoch: number },
  scopes: string[],
  format: TokenFormat,
  client: SessionClient,
  requestId: string,
  amr: readonly string[] = ['pwd'],
): Promise<TokenResponse | undefined> {
  const [actorId, credential, request] = originValues({ actorId: user.id, credential: 'password', requestId })
  return sql.begin(async (tx) => {
    const [session] = await tx<Array<{ id: number; auth_time: number }>>`
      WITH opened AS (
        INSERT INTO sessions (user_id, scopes, token_format, expires_at, last_used_at, user_agent, client_address, amr)
        SELECT id, ${scopes}, ${format}, now() + ${deps.config.refreshTokenTtl} * interval '1 second', now(),
          ${client.userAgent?.slice(0, 256) ?? null}, ${client.address.slice(0, 64)}, ${amr as string[]}
        FROM users WHERE id = ${user.id} AND credential_epoch = ${user.credential_epoch} AND deleted_at IS NULL
        FOR KEY SHARE
        RETURNING *),
      event AS (
        INSERT INTO event_outbox (type, subject_type, subject_id, actor_id, actor_credential, request_id, data)
        SELECT 'session.created', 'session',
        o.id, ${actorId}::bigint, ${credential}::text, ${request}::text, session_data(o) FROM opened o)
      SELECT id, floor(extract(epoch FROM created_at))::float8 AS auth_time FROM opened`
    if (!session) return undefined
    return issuePair(tx, deps, {
      session_id: session.id,
      user_id: user.id,
      role: user.role,
      credential_epoch: user.credential_epoch,
      scopes,
      token_format: format,
      amr: [...amr],
      auth_time: session.auth_time,
    })
  })
}

/**
 * Retires the refresh token and issues the next pair; undefined or 'reused'
 * otherwise (the caller answers 401; 'reused' ended the session first). The
 * conditional UPDATE makes rotation atomic: of two refreshes racing with one
 * token, exactly one finds it unused. A session of a user made from the
 * identity provider's tokens (a password login it may no longer make:
 * OIDC_LOCAL_PASSWORDS) is not refreshed.
 */
export async function rotate(
  sql: Sql,
  deps: SessionDeps,
  refreshToken: string,
  requestId: string,
): Promise<TokenResponse | 'reused' | undefined> {
  const hash = hashSecret(refreshToken)
  return sql.begin(async (tx) => {
    const [live] = await tx<SessionUser[]>`
      UPDATE refresh_tokens r SET used_at = now()
      FROM sessions s JOIN users u ON u.id = s.user_id
      WHERE r.token_hash = ${hash} AND r.used_at IS NULL AND s.id = r.session_id
        AND s.revoked_at IS NULL AND s.expires_at > now() AND u.deleted_at IS NULL
        AND (${deps.config.oidcLocalPasswords}::boolean OR NOT u.made_by_provider)
      RETURNING s.id AS session_id, u.id AS user_id, u.role, u.credential_epoch, s.scopes, s.token_format, s.amr,
        floor(extract(epoch FROM s.created_at))::float8 AS auth_time`
    if (live) {
      const tokens = await issuePair(tx, deps, live)
      await tx`UPDATE sessions SET last_used_at = now() WHERE id = ${live.session_id}`
      return tokens
    }
    // Known but already used: the token was copied. End the session for everyone holding it.
    const [reused] = await tx<
      Array<{ session_id: number }>
    >`SELECT session_id FROM refresh_tokens WHERE token_hash = ${hash} AND used_at IS NOT NULL`
    if (!reused) return undefined
    // Whoever presented it is unknown: the copy may be the thief's or the owner's.
    await revokeSession(tx, reused.session_id, { actorId: null, credential: 'refresh_token', requestId })
    return 'reused'
  })
}

/**
 * Ends a session: its refresh token and opaque access tokens stop at once
 * (they are read from the database), and its JWTs through the revocation the
 * trigger records and announces (sql/005). The caller waits for its instance
 * to hear it (credentialChanges.caughtUp) before answering. Its event
 * (session.revoked) is written in the same statement; a session ended already
 * is left as it is, with no second event.
 */
export async function revokeSession(db: TransactionSql, sessionId: number, origin: EventOrigin): Promise<void> {
  await endSessions(db, db`id = ${sessionId}`, origin)
}

/** Ends every live session of a user but `except` (the caller's own, on a password change). */
export async function revokeSessionsOf(
  db: TransactionSql,
  userId: number,
  origin: EventOrigin,
  except?: number,
): Promise<void> {
  await endSessions(db, db`user_id = ${userId} ${except === undefined ? db`` : db`AND id <> ${except}`}`, origin)
}

/**
 * Ends the sessions `which` selects, and with them the API keys made on the
 * strength of their logins (sql/016), each with its revocation event, in
 * the caller's transaction.
 */
async function endSessions(db: TransactionSql, which: ReturnType<Sql>, origin: EventOrigin): Promise<void> {
  const [actorId, credential, requestId] = originValues(origin)
  const withKeys = await db<Array<{ id: number }>>`
    WITH ended AS (
      UPDATE sessions SET revoked_at = now() WHERE ${which} AND revoked_at IS NULL
      RETURNING *),
    tokens AS (DELETE FROM access_tokens WHERE session_id IN (SELECT id FROM ended)),
    event AS (
      INSERT INTO event_outbox (type, subject_type, subject_id, actor_id, actor_credential, request_id, data)
      SELECT 'session.revoked', 'session',
      e.id, ${actorId}::bigint, ${credential}::text, ${requestId}::text, session_data(e) FROM ended e ORDER BY e.id)
    SELECT DISTINCT k.session_id AS id FROM api_keys k WHERE k.session_id IN (SELECT id FROM ended)`
  for (const { id } of withKeys) await deleteRowsWhere(db, apiKeys, { session_id: String(id) }, origin)
}

/** Voids every JWT of the user issued so far, whatever its session (the trigger announces it, sql/005). */
export async function raiseCredentialEpoch(db: Sql | TransactionSql, userId: number): Promise<void> {
  await db`UPDATE users SET credential_epoch = credential_epoch + 1 WHERE id = ${userId}`
}

/** The session of a refresh token (used or not) and its user, for logout. */
export async function sessionOfRefreshToken(
  db: Sql,
  refreshToken: string,
): Promise<{ sessionId: number; userId: number } | undefined> {
  const [row] = await db<Array<{ session_id: number; user_id: number }>>`
    SELECT r.session_id, s.user_id FROM refresh_tokens r JOIN sessions s ON s.id = r.session_id
      WHERE r.token_hash = ${hashSecret(refreshToken)}`
  return row && { sessionId: row.session_id, userId: row.user_id }
}
