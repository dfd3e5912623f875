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
 * The new key, or undefined when its user no longer exists. A JWT outlives
 * its user; inserting for it anyway hit the foreign key and answered 500.
 * FOR KEY SHARE: a deletion of the user running at the same time waits for
 * this insert (and then takes the key with it) instead of failing it.
 */
export async function insertApiKey(sql: Sql, key: { user_id: number; name: string; prefix: string; key_hash: Buffer; scopes: string[]; expires_at: Date | null }): Promise<ApiKeyRow | undefined> {
  const [row] = await sql<ApiKeyRow[]>`
    INSERT INTO api_keys (user_id, name, prefix, key_hash, scopes, expires_at)
    SELECT id, ${key.name}, ${key.prefix}, ${key.key_hash}, ${key.scopes}, ${key.expires_at} FROM users WHERE id = ${key.user_id} FOR KEY SHARE
    RETURNING id, user_id, name, prefix, scopes, created_at, expires_at, last_used_at`
  return row
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
