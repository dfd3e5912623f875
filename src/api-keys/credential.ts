import type { Sql } from 'postgres'
import type { Role } from '../auth/principal.js'
import { effectiveScopes } from '../auth/scopes.js'
import { hashSecret } from '../auth/tokens.js'
import type { ApiKeyCache, CachedApiKey } from './key-cache.js'
import type { LastUsedWrites } from './last-used.js'

// An API key presented with a request: its Principal, or undefined when it is
// unknown, expired or revoked. A key this instance knows costs no statement
// (src/api-keys/key-cache.ts); last_used_at costs one at most once a minute
// (src/api-keys/last-used.ts). The user's current role is part of what is
// cached, and a role change evicts it.

interface KeyRow {
  user_id: number
  role: Role
  scopes: string[]
  expires_at: string | null
  api_key_id: number
}

/** What it needs; `bounded` runs database work under the pipeline's bound (src/db/admission.ts). */
export interface ApiKeyDeps {
  sql: Sql
  bounded: <T>(work: () => Promise<T>) => Promise<T>
  apiKeyCache: ApiKeyCache
  apiKeyUse: LastUsedWrites
}

export async function apiKeyPrincipal(key: string, { sql, bounded, apiKeyCache: cache, apiKeyUse: lastUsed }: ApiKeyDeps): Promise<CachedApiKey['principal'] | undefined> {
  const hash = hashSecret(key)
  const cacheKey = hash.toString('base64')
  let entry = cache.lookup(cacheKey, Date.now())
  if (entry === 'expired') return undefined
  if (!entry) {
    const generation = cache.generation
    const [row] = await bounded(() => sql<KeyRow[]>`
      SELECT u.id AS user_id, u.role, k.scopes, k.expires_at, k.id AS api_key_id
      FROM api_keys k JOIN users u ON u.id = k.user_id
      WHERE k.key_hash = ${hash} AND (k.expires_at IS NULL OR k.expires_at > now())`)
    if (!row) return undefined
    entry = {
      principal: {
        kind: 'user', userId: String(row.user_id), role: row.role,
        scopes: effectiveScopes(row.role, row.scopes),
        credential: { type: 'api_key', expiresAt: row.expires_at, apiKeyId: row.api_key_id },
      },
      userId: row.user_id,
      apiKeyId: row.api_key_id,
      expiresAt: row.expires_at === null ? null : Date.parse(row.expires_at),
    }
    cache.remember(cacheKey, entry, generation)
  }
  if (lastUsed.claim(entry.apiKeyId, Date.now())) {
    try {
      // The SQL guard stays: other instances write it too.
      await bounded(() => sql`UPDATE api_keys SET last_used_at = now() WHERE id = ${entry.apiKeyId} AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')`)
    } catch (err) {
      lastUsed.failed(entry.apiKeyId)
      throw err
    }
  }
  return entry.principal
}
