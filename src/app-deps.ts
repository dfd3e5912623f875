import type { Sql } from 'postgres'
import type { AuthServices } from './auth/services.js'
import type { Registry } from './registry.js'
import type { ReadinessCheck } from './health/readiness.js'
import type { EventHub } from './events/hub.js'
import type { EventPublisher } from './events/publisher.js'
import type { EventRetention } from './events/retention.js'
import type { TrashPurge } from './core/resources/trash-purge.js'
import type { WebhookWorker } from './webhooks/worker.js'

/**
 * Everything one service instance holds, built by `createService`
 * (src/service.ts) and passed down; handlers get it as `ctx.services`. What
 * core needs of it (the pool, the log, database admission, ...) core declares
 * (CoreServices), what auth needs auth declares (AuthServices); these are the rest.
 */
export interface AppDeps extends AuthServices {
  /** Its resources, and the routes, scopes, event types and problem codes derived from them (src/registry.ts). */
  registry: Registry
  /**
   * Where `listen` is called (the credential listener, the event stream
   * reader, the webhook workers): a session on DATABASE_LISTEN_URL, or the
   * pool itself when that is unset. Nothing else runs on it.
   */
  listenSql: Sql
  /**
   * The purges' connection (every addPurgeJob of the service, events.retention):
   * one of its own, so that a purge neither holds a connection requests wait
   * for nor counts in db_queries_total, which counts what requests cost.
   */
  maintenanceSql: Sql
  /** The database check of /readyz, one query a second at most (src/health/readiness.ts). */
  readiness: ReadinessCheck
  /**
   * The figures GET /metrics answers with: this instance's, or, in
   * a cluster worker, every worker's (src/cluster/worker.ts).
   */
  metricsReport(): Promise<string>
  /** Moves committed events from the outbox to the event log, numbered in commit order (src/events/publisher.ts). */
  eventPublisher: EventPublisher
  /** This instance's GET /events/stream clients, and the reader of new events that feeds them (src/events/hub.ts). */
  eventHub: EventHub
  /** This instance's share of webhook deliveries (src/webhooks/worker.ts). */
  webhooks: WebhookWorker
  /** Deletes events and deliveries older than EVENTS_RETENTION_DAYS, a batch at a time (src/events/retention.ts). */
  retention: EventRetention
  /** Purges what has been in a trash for TRASH_RETENTION, a batch at a time (src/core/resources/trash-purge.ts). */
  trash: TrashPurge
}

/** Entries each credential cache holds at most; the oldest leaves first. */
export const CREDENTIAL_CACHE_SIZE = 10_000
