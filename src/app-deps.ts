import type { Sql } from 'postgres'
import type { ApiKeyCache } from './auth/api-keys/key-cache.js'
import type { LastUsedWrites } from './auth/api-keys/last-used.js'
import type { CredentialChanges } from './auth/credential-changes.js'
import type { JwtCache } from './auth/jwt-cache.js'
import type { LoginGuard } from './auth/login-throttle.js'
import type { PasswordHasher } from './auth/password.js'
import type { RevocationList } from './auth/revocations.js'
import type { Config } from './config.js'
import type { Registry } from './registry.js'
import type { ReadinessCheck } from './health/readiness.js'
import type { CoreServices } from './core/http/services.js'
import type { RateLimiter } from './core/http/rate-limit.js'
import type { EventHub } from './events/hub.js'
import type { EventPublisher } from './events/publisher.js'
import type { EventRetention } from './events/retention.js'
import type { MailWorker } from './mail/worker.js'
import type { BackgroundWork } from './core/background-work.js'
import type { WebhookWorker } from './webhooks/worker.js'
import type { IdentityProvider } from './auth/oidc/provider-principals.js'
import type { Clock } from './core/lib/clock.js'

/**
 * Everything one service instance holds, built by `createService`
 * (src/service.ts) and passed down; handlers get it as `ctx.deps`. What core
 * needs of it (the pool, the log, database admission, ...) core declares
 * (CoreServices); these are the application's own.
 */
export interface AppDeps extends CoreServices {
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
  /** Every setting (src/config.ts), core's HttpSettings among them. */
  config: Config
  /** The time this instance's own expiry checks read (src/core/lib/clock.ts); the database keeps its own now(). */
  clock: Clock
  /** The database check of /readyz, one query a second at most (src/health/readiness.ts). */
  readiness: ReadinessCheck
  /** The figures GET /metrics answers with: this instance's, or, in a cluster worker, every worker's (src/cluster/worker.ts). */
  metricsReport(): Promise<string>
  /** JWTs this instance has verified (src/auth/jwt-cache.ts). */
  jwtCache: JwtCache
  /** API keys this instance has read, kept right by notifications from PostgreSQL (src/auth/api-keys/key-cache.ts). */
  apiKeyCache: ApiKeyCache
  /** When this process last wrote each key's last_used_at (src/auth/api-keys/last-used.ts). */
  apiKeyUse: LastUsedWrites
  /** Login attempts per address on this instance (src/auth/login-throttle.ts). */
  logins: LoginGuard
  /** What this instance knows was revoked: sessions, and users' credential epochs (src/auth/revocations.ts). */
  revocations: RevocationList
  /** The listener that keeps apiKeyCache and revocations right, and says whether they may be trusted; a request that revokes waits on `caughtUp` (src/auth/credential-changes.ts). */
  credentialChanges: CredentialChanges
  /** Requests per window per credential, user or address; undefined when RATE_LIMIT=0 (src/core/http/rate-limit.ts). */
  rateLimiter: RateLimiter | undefined
  /** Password hashing with this instance's slots on the thread pool (src/auth/password.ts). */
  passwords: PasswordHasher
  /** Moves committed events from the outbox to the event log, numbered in commit order (src/events/publisher.ts). */
  eventPublisher: EventPublisher
  /** This instance's GET /events/stream clients, and the reader of new events that feeds them (src/events/hub.ts). */
  eventHub: EventHub
  /** This instance's share of webhook deliveries (src/webhooks/worker.ts). */
  webhooks: WebhookWorker
  /** Sends the mail outbox with the configured transport (`mail.transport`: undefined when none is, src/mail/transport.ts). */
  mail: MailWorker
  /** Password-reset requests, worked on after their answer (src/auth/recovery-routes.ts). */
  recoveryRequests: BackgroundWork
  /** The identity provider whose access tokens are accepted beside ours (OIDC_ISSUER, src/auth/oidc/); undefined without one. */
  identityProvider: IdentityProvider | undefined
  /** Deletes events and deliveries older than EVENTS_RETENTION_DAYS, a batch at a time (src/events/retention.ts). */
  retention: EventRetention
}

/** Entries each credential cache holds at most; the oldest leaves first. */
export const CREDENTIAL_CACHE_SIZE = 10_000
