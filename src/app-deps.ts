import type { Sql } from 'postgres'
import { ApiKeyCache } from './api-keys/key-cache.js'
import { LastUsedWrites } from './api-keys/last-used.js'
import { listenForCredentialChanges, type CredentialChanges } from './auth/credential-changes.js'
import { JwtCache } from './auth/jwt-cache.js'
import { LoginGuard } from './auth/login-throttle.js'
import { PasswordHasher } from './auth/password.js'
import { RevocationList } from './auth/revocations.js'
import { cursorKeysFrom } from './auth/secrets.js'
import type { Config } from './config.js'
import type { Logger } from './log.js'
import { Metrics } from './metrics/metrics.js'
import { ListShapes } from './collections/list-sql.js'

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
  /** Password hashing with this instance's bound on hashes at a time (src/auth/password.ts). */
  passwords: PasswordHasher
  /** The list statements compiled for this instance, by collection and shape (src/collections/list-sql.ts). */
  listShapes: ListShapes
  /** JWTs this instance has verified (src/auth/jwt-cache.ts). */
  jwtCache: JwtCache
  /** API keys this instance has read, kept right by notifications from PostgreSQL (src/api-keys/key-cache.ts). */
  apiKeyCache: ApiKeyCache
  /** When this process last wrote each key's last_used_at (src/api-keys/last-used.ts). */
  apiKeyUse: LastUsedWrites
  /** Login attempts per address on this instance, and the purge of old failure counts (src/auth/login-throttle.ts). */
  logins: LoginGuard
  /** What this instance knows was revoked: sessions, and users' credential epochs (src/auth/revocations.ts). */
  revocations: RevocationList
  /** The listener that keeps apiKeyCache and revocations right, and says whether they may be trusted; a request that revokes waits on `caughtUp` (src/auth/credential-changes.ts). */
  credentialChanges: CredentialChanges
}

/** Entries each credential cache holds at most; the oldest leaves first. */
export const CREDENTIAL_CACHE_SIZE = 10_000

/**
 * The dependencies of one application instance; `config.jwtSecrets` must be
 * resolved already. Starts listening for credential changes on a connection
 * of its own (src/auth/credential-changes.ts), which `sql.end()` closes, and
 * its heartbeat, which `credentialChanges.stop()` ends.
 */
export function createDeps(sql: Sql, config: Config, log: Logger, metrics = new Metrics({ max: config.poolMax }), cacheSize = CREDENTIAL_CACHE_SIZE): AppDeps {
  const lifecycle = { shuttingDown: false }
  const apiKeyCache = new ApiKeyCache(cacheSize)
  const revocations = new RevocationList()
  return {
    sql, config, log, lifecycle, cursorKeys: cursorKeysFrom(config.jwtSecrets), metrics, listShapes: new ListShapes(), passwords: new PasswordHasher(),
    jwtCache: new JwtCache(cacheSize),
    apiKeyCache,
    apiKeyUse: new LastUsedWrites(cacheSize),
    logins: new LoginGuard(config.rateLimit > 0, log),
    revocations,
    credentialChanges: listenForCredentialChanges(sql, apiKeyCache, revocations, log, { lifecycle }),
  }
}
