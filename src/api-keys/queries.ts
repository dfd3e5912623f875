import type { Sql } from 'postgres'

export interface ApiKeyRow {
  id: number
  user_id: number
  name: string
  prefix: string
  scopes: string[]
  created_at: Date
  expires_at: Date | null
  last_used_at: Date | null
}

export function presentApiKey(row: ApiKeyRow) {
  const { id, name, prefix, scopes, created_at, expires_at, last_used_at, user_id } = row
  return { id, name, prefix, scopes, created_at, expires_at, last_used_at, user_id }
}

/**
 * The new key; 'gone' when its user no longer exists (a JWT may outlive its
 * user by a moment), 'limit' when the user already holds `max` live keys.
 * The user's row is locked (FOR NO KEY UPDATE: it does not block the foreign
 * key checks of other writes) so that concurrent creations count one after
 * another and cannot together pass the limit; a deletion of the user waits
 * for this insert and then takes the key with it.
 */
export async function insertApiKey(
  sql: Sql, key: { user_id: number; name: string; prefix: string; key_hash: Buffer; scopes: string[]; expires_at: Date | null }, max: number,
): Promise<ApiKeyRow | 'gone' | 'limit'> {
  return sql.begin(async (tx) => {
    const [user] = await tx`SELECT 1 FROM users WHERE id = ${key.user_id} FOR NO KEY UPDATE`
    if (!user) return 'gone'
    const [{ live }] = await tx<[{ live: number }]>`
      SELECT count(*)::int AS live FROM api_keys WHERE user_id = ${key.user_id} AND (expires_at IS NULL OR expires_at > now())`
    if (live >= max) return 'limit'
    const [row] = await tx<ApiKeyRow[]>`
      INSERT INTO api_keys (user_id, name, prefix, key_hash, scopes, expires_at)
      VALUES (${key.user_id}, ${key.name}, ${key.prefix}, ${key.key_hash}, ${key.scopes}, ${key.expires_at})
      RETURNING id, user_id, name, prefix, scopes, created_at, expires_at, last_used_at`
    return row!
  })
}

/** The key, if it exists and `ownerId` (undefined for an admin) owns it. */
export async function findApiKey(sql: Sql, id: string, ownerId: string | undefined): Promise<ApiKeyRow | undefined> {
  const [row] = await sql<ApiKeyRow[]>`
    SELECT id, user_id, name, prefix, scopes, created_at, expires_at, last_used_at FROM api_keys
    WHERE id = ${id} ${ownerId === undefined ? sql`` : sql`AND user_id = ${ownerId}`}`
  return row
}

export async function deleteApiKey(sql: Sql, id: number): Promise<void> {
  await sql`DELETE FROM api_keys WHERE id = ${id}`
}
