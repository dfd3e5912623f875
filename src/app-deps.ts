import type { Sql } from 'postgres'
import { ApiKeyCache } from './api-keys/key-cache.js'
import { listenForKeyChanges, type KeyChanges } from './api-keys/key-changes.js'
import { LastUsedWrites } from './api-keys/last-used.js'
import { JwtCache } from './auth/jwt-cache.js'
import { cursorKeysFrom } from './auth/secrets.js'
import type { Config } from './config.js'
import type { Logger } from './log.js'
import { Metrics } from './metrics/metrics.js'

/** Everything a handler may use, built by the entry point (or a test) and passed down. */
export interface AppDeps {
  sql: Sql
  config: Config
  log: Logger
  /** Flipped by the entry point on SIGTERM; /readyz and new requests see it. */
  lifecycle: { shuttingDown: boolean }
  /** HMAC key for collection cursors, derived from the JWT signing secrets. */
  cursorKeys: Buffer[]
  metrics: Metrics
  /** JWTs this instance has verified (src/auth/jwt-cache.ts). */
  jwtCache: JwtCache
  /** API keys this instance has read, kept right by notifications from PostgreSQL (src/api-keys/key-cache.ts). */
  apiKeyCache: ApiKeyCache
  /** When this process last wrote each key's last_used_at (src/api-keys/last-used.ts). */
  apiKeyUse: LastUsedWrites
  /** The listener that keeps apiKeyCache right; a request that revokes waits on `caughtUp` (src/api-keys/key-changes.ts). */
  keyChanges: KeyChanges
}

/** Entries each credential cache holds at most; the oldest leaves first. */
export const CREDENTIAL_CACHE_SIZE = 10_000

/**
 * The dependencies of one application instance; `config.jwtSecrets` must be
 * resolved already. Starts listening for API key changes on a connection of
 * its own (src/api-keys/key-changes.ts), which `sql.end()` closes.
 */
export function createDeps(sql: Sql, config: Config, log: Logger, metrics = new Metrics({ max: config.poolMax }), cacheSize = CREDENTIAL_CACHE_SIZE): AppDeps {
  const lifecycle = { shuttingDown: false }
  const apiKeyCache = new ApiKeyCache(cacheSize)
  return {
    sql, config, log, lifecycle, cursorKeys: cursorKeysFrom(config.jwtSecrets), metrics,
    jwtCache: new JwtCache(cacheSize),
    apiKeyCache,
    apiKeyUse: new LastUsedWrites(cacheSize),
    keyChanges: listenForKeyChanges(sql, apiKeyCache, log, { lifecycle }),
  }
}
