import type { Sql } from 'postgres'
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
}

/** Entries each credential cache holds at most; the oldest leaves first. */
export const CREDENTIAL_CACHE_SIZE = 10_000

/** The dependencies of one application instance; `config.jwtSecrets` must be resolved already. */
export function createDeps(sql: Sql, config: Config, log: Logger, metrics = new Metrics({ max: config.poolMax }), cacheSize = CREDENTIAL_CACHE_SIZE): AppDeps {
  return {
    sql, config, log, lifecycle: { shuttingDown: false }, cursorKeys: cursorKeysFrom(config.jwtSecrets), metrics,
    jwtCache: new JwtCache(cacheSize),
  }
}
