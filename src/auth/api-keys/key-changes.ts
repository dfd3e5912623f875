import type { ApiKeyCache } from './key-cache.js'

// The API key changes the triggers announce (sql/004) on the credential
// changes channel (src/auth/revocation/credential-changes.ts): `keys 3,4` (those keys),
// `users 7` (every key of those users), `all`.

const KEY_CHANGE = /^(keys|users) ([0-9]{1,19}(?:,[0-9]{1,19})*)$/

/**
 * Applies one API key change to the cache. A payload this build does not know
 * (`all`, or a newer migration's) empties the cache, which is always safe,
 * and returns false: the caller reloads what else it remembers.
 */
export function applyKeyChange(cache: ApiKeyCache, payload: string): boolean {
  const m = KEY_CHANGE.exec(payload)
  if (!m) {
    cache.clear()
    return false
  }
  const ids = m[2]!.split(',').map(Number)
  if (m[1] === 'keys') cache.evictKeys(ids)
  else cache.evictUsers(ids)
  return true
}
