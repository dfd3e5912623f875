import type { Sql } from 'postgres'
import type { DatabaseAdmission } from '../db/admission.js'
import type { Logger } from '../log.js'
import type { Metrics } from '../metrics.js'
import type { TrustProxy } from './client-address.js'
import type { ProblemTable } from './problem.js'

/** The settings core's HTTP stages read; the application's configuration has them among its own. */
export interface HttpSettings {
  /** Every route's path is below it (API_PREFIX); '' for none. */
  apiPrefix: string
  bodyLimit: number
  /** 428 for a write of a versioned resource without If-Match. */
  requireIfMatch: boolean
  trustProxy: TrustProxy
  corsOrigins: ReadonlySet<string>
  /** Set when the service itself serves TLS: every answer then carries Strict-Transport-Security. */
  tls: object | undefined
}

/**
 * What core's own code needs of a service instance at run time, filled by
 * the application (one object, which may hold the application's own too) and
 * handed to handlers as `ctx.services`. A part of core that needs more
 * declares it beside itself by merging into this interface
 * (src/core/http/idempotency.ts, src/core/collections/list-query.ts,
 * src/core/resources/change-events.ts), so that this file names nothing
 * that uses it.
 */
export interface CoreServices {
  /** The pool; functions that take it also run inside a transaction. */
  sql: Sql
  config: HttpSettings
  log: Logger
  metrics: Metrics
  /**
   * How far the service is in stopping (src/service.ts). `drainsAt`: set at
   * the signal when the drain is put off (SHUTDOWN_DELAY), the
   * performance.now() instant it begins; until then every route is served,
   * but readiness fails and every answer says `Connection: close`, so that
   * load balancers and kept-alive clients move elsewhere first.
   * `draining`: the drain has begun; only public routes are served.
   */
  stopping: { draining: boolean; drainsAt?: number }
  databaseAdmission: DatabaseAdmission
  /** Every problem code the service answers with (its registry's): the status and title of each HttpError. */
  problems: ProblemTable
}
