import type { Sql } from 'postgres'
import type { Role } from '../principal.js'
import type { ScopePolicy } from '../scopes.js'
import { hashList } from '../tokens.js'
import type { ApiKeyCache, CachedApiKey } from './key-cache.js'
import type { LastUsedWrites } from './last-used.js'
import type { Clock } from '../../core/lib/clock.js'

// API keys presented with requests: their Principals, undefined where a key
// is unknown, expired or revoked. A key this instance knows costs no
// statement (src/auth/api-keys/key-cache.ts), so no wait under database admission
// either; the keys it does not know cost one statement between them.
// last_used_at costs one at most once a minute (src/auth/api-keys/last-used.ts).
// The user's current role is part of what is cached, and a role change
// evicts it.

interface KeyRow {
  key_hash: Buffer
  user_id: number
  role: Role
  scopes: string[]
  expires_at: string | null
  api_key_id: number
}

/** What it needs; `bounded` runs database work under database admission (src/core/db/admission.ts). */
export interface ApiKeyDeps {
  sql: Sql
  bounded: <T>(work: () => Promise<T>) => Promise<T>
  apiKeyCache: ApiKeyCache
  apiKeyUse: LastUsedWrites
  scopes: ScopePolicy
  clock: Clock
}

/** The Principal of each key, by the SHA-256 of the key. */
export async function apiKeyPrincipals(
  hashes: readonly Buffer[],
  { sql, bounded, apiKeyCache: cache, scopes, clock }: ApiKeyDeps,
): Promise<Array<CachedApiKey['principal'] | undefined>> {
  const now = clock.now()
  const entries = hashes.map((hash) => cache.lookup(hash.toString('base64'), now))
  const missing = hashes.filter((_, i) => entries[i] === undefined)
  if (missing.length > 0) {
    const generation = cache.generation
    const rows = await bounded(
      () => sql<KeyRow[]>`
      SELECT k.key_hash, u.id AS user_id, u.role, k.scopes, k.expires_at, k.id AS api_key_id
      FROM api_keys k JOIN users u ON u.id = k.user_id
      WHERE k.key_hash = ANY(${hashList(sql, missing)}) AND (k.expires_at IS NULL OR k.expires_at > now())
        AND u.deleted_at IS NULL
        -- A key bound to a session is revoked with it (sql/016); this holds should that ever lag.
        AND (k.session_id IS NULL OR NOT EXISTS (
          SELECT 1 FROM sessions s WHERE s.id = k.session_id AND s.revoked_at IS NOT NULL))`,
    )
    const read = new Map<string, CachedApiKey>()
    for (const row of rows) {
      const entry: CachedApiKey = {
        principal: {
          kind: 'user',
          userId: String(row.user_id),
          role: row.role,
          scopes: scopes.effective(row.role, row.scopes),
          credential: { type: 'api_key', expiresAt: row.expires_at, apiKeyId: row.api_key_id },
        },
        userId: row.user_id,
        apiKeyId: row.api_key_id,
        expiresAt: row.expires_at === null ? null : Date.parse(row.expires_at),
      }
      const cacheKey = row.key_hash.toString('base64')
      read.set(cacheKey, entry)
      cache.remember(cacheKey, entry, generation)
    }
    hashes.forEach((hash, i) => {
      if (entries[i] === undefined) entries[i] = read.get(hash.toString('base64'))
    })
  }
  return entries.map((entry) => (entry === undefined || entry === 'expired' ? undefined : entry.principal))
}

/** A request used the key: last_used_at, written at most once a minute per key and process. */
export async function recordKeyUse(
  apiKeyId: number,
  { sql, bounded, apiKeyUse: lastUsed, clock }: ApiKeyDeps,
): Promise<void> {
  if (!lastUsed.claim(apiKeyId, clock.now())) return
  try {
    // The SQL guard stays: other instances write it too.
    await bounded(
      () =>
        sql`UPDATE api_keys SET last_used_at = now() WHERE id = ${apiKeyId} AND (last_used_at IS NULL
          OR last_used_at < now() - interval '1 minute')`,
    )
  } catch (err) {
    lastUsed.failed(apiKeyId)
    throw err
  }
}
