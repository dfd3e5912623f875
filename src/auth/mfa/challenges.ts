import type { Sql } from 'postgres'
import type { Role } from '../principal.js'
import type { TokenFormat } from '../sessions/sessions.js'
import { hashSecret, newSecret } from '../tokens.js'

// The second step of a login (POST /auth/login/mfa): a password proved
// gives an mfa_token, good for 300 seconds and one successful code, for that
// login only (its scopes and token format), and void once the user's
// credential epoch moves (a password or role change in between). A wrong
// code leaves it open: guesses are counted against the account like wrong
// passwords (src/auth/login/login-throttle.ts), so the lock bounds them.

export const MFA_TOKEN_TTL_SECONDS = 300

export interface Challenge {
  user_id: number
  email: string
  role: Role
  credential_epoch: number
  scopes: string[]
  token_format: TokenFormat
}

/** A new mfa_token for a login whose password was right. */
export async function openChallenge(
  sql: Sql,
  user: { id: number; credential_epoch: number },
  scopes: string[],
  format: TokenFormat,
): Promise<string> {
  const token = newSecret('mfa')
  await sql`
    INSERT INTO mfa_challenges (token_hash, user_id, credential_epoch, scopes, token_format, expires_at)
    VALUES (${hashSecret(token)}, ${user.id}, ${user.credential_epoch}, ${scopes}, ${format},
      now() + ${MFA_TOKEN_TTL_SECONDS} * interval '1 second')`
  return token
}

/** The login an mfa_token stands for, while it is unused, unexpired and its user's epoch unchanged. */
export async function findChallenge(sql: Sql, token: string): Promise<Challenge | undefined> {
  const [challenge] = await sql<Challenge[]>`
    SELECT c.user_id, u.email, u.role, u.credential_epoch, c.scopes, c.token_format
    FROM mfa_challenges c JOIN users u ON u.id = c.user_id AND u.credential_epoch = c.credential_epoch
      AND u.deleted_at IS NULL
    WHERE c.token_hash = ${hashSecret(token)} AND c.used_at IS NULL AND c.expires_at > now()`
  return challenge
}

/** Spends the mfa_token; false when another request spent it first, or it expired meanwhile. */
export async function spendChallenge(sql: Sql, token: string): Promise<boolean> {
  const spent = await sql`
    UPDATE mfa_challenges SET used_at = now()
    WHERE token_hash = ${hashSecret(token)} AND used_at IS NULL AND expires_at > now()`
  return spent.count === 1
}

/** Rows a purge may delete: expired challenges. */
export const expiredChallenges = (sql: Sql) => sql`expires_at < now()`
