import type { Sql } from 'postgres'
import type { Config } from './config.js'
import type { Logger } from './log.js'

/** Everything a handler may use, built by the entry point (or a test) and passed down. */
export interface AppDeps {
  sql: Sql
  config: Config
  log: Logger
  /** Flipped by the entry point on SIGTERM; /readyz and new requests see it. */
  lifecycle: { shuttingDown: boolean }
  /** HMAC key for collection cursors, derived from the JWT signing secrets. */
  cursorKeys: Buffer[]
}
