import type { Server as HttpsServer } from 'node:https'
import type { AddressInfo } from 'node:net'
import { ApiKeyCache } from './api-keys/key-cache.js'
import { LastUsedWrites } from './api-keys/last-used.js'
import { allRoutes, createApp, type AppServer } from './app.js'
import { tlsOptions, watchCertificate } from './core/http/tls.js'
import { CREDENTIAL_CACHE_SIZE, type AppDeps } from './app-deps.js'
import { listenForCredentialChanges } from './auth/credential-changes.js'
import { credentialDeps } from './auth/credentials.js'
import { checkGrants } from './auth/grants.js'
import { JwtCache } from './auth/jwt-cache.js'
import { knownAddressKeysFrom } from './auth/known-addresses.js'
import { LoginGuard } from './auth/login-throttle.js'
import { PasswordHasher } from './auth/password.js'
import { RevocationList } from './auth/revocations.js'
import { cursorKeysFrom } from './auth/secrets.js'
import type { Config } from './config.js'
import { admissionFor } from './core/db/admission.js'
import { connect } from './core/db/connect.js'
import { IdempotencyCleanup } from './core/http/idempotency.js'
import { RateLimiter } from './core/http/rate-limit.js'
import type { AnyRoute } from './core/http/route.js'
import type { Logger } from './core/log.js'
import { Metrics } from './core/metrics.js'
import { ListShapes } from './core/collections/list-sql.js'
import { closeDatabaseWork, shutdown } from './shutdown.js'
import { defaultStreamSettings, EventHub, type StreamSettings } from './events/hub.js'
import { defaultPublisherSettings, EventPublisher, type PublisherSettings } from './events/publisher.js'
import { defaultRetentionSettings, EventRetention, type RetentionSettings } from './events/retention.js'
import { defaultWebhookSettings, WebhookWorker, type WebhookSettings } from './webhooks/worker.js'
import { ReadinessCheck } from './health/readiness.js'
import { buildRegistry, type Registry } from './registry.js'
import { applicationResources } from './resources.js'
import { originOf } from './events/origin.js'

const LISTEN_BACKLOG = 4096

// One service instance owns all of its state: the pool, the caches, the
// limits, the credential listener, the server. Nothing of it lives in a
// module, so two services in one process (tests run several) share nothing.

export interface ServiceOptions {
  log: Logger
  /** Entries per credential cache (JWTs, API keys, last_used_at writes); default CREDENTIAL_CACHE_SIZE. */
  cacheSize?: number
  /** Routes appended to the service's own; /openapi.json describes them too. */
  routes?: readonly AnyRoute[]
  /** Its resources and what is derived from them; default the application's (src/resources.ts). A test adds a resource here. */
  registry?: Registry
  /** Tuning of the event stream, webhook deliveries and retention (tests shorten the times); defaults in each module. */
  streams?: Partial<StreamSettings>
  webhooks?: Partial<WebhookSettings>
  retention?: Partial<RetentionSettings>
  publisher?: Partial<PublisherSettings>
}

export interface Service {
  readonly deps: AppDeps
  readonly server: AppServer
  /** Opens the pool's first connection, then the port; resolves to the address bound (port 0 picks a free port). */
  listen(port: number, host: string): Promise<AddressInfo>
  /** The stop on a signal (src/shutdown.ts): drains requests in flight, bounded by SHUTDOWN_TIMEOUT; never rejects. */
  shutdown(): Promise<void>
  /** Stops at once: the server and every connection on it, the credential listener and its heartbeat, the pool, the listening connection. */
  close(): Promise<void>
}

/**
 * A service on `config.databaseUrl` (migrated already), with
 * `config.jwtSecrets` and `config.databasePooler` resolved. It opens its pool
 * and starts listening for credential changes (on `config.databaseListenUrl`
 * when set) now; `listen` opens the port.
 */
export function createService(config: Config, options: ServiceOptions): Service {
  // Read first: a certificate that cannot be read stops start-up before anything is opened.
  const tls = config.tls ? tlsOptions(config.tls) : undefined
  const deps = createDeps(config, options)
  const server = createApp(deps, allRoutes(deps.registry, config.apiPrefix, options.routes), tls)
  const stopWatchingCertificate = config.tls ? watchCertificate(server as HttpsServer, config.tls, options.log) : () => {}
  return {
    deps,
    server,
    async listen(port, host) {
      // Ready before the first request: a login's timing must not depend on
      // whether the decoy hash exists yet, and the pool's first connection is
      // open (the first request does not pay for connecting; a database that
      // cannot be reached fails start-up, not a request).
      await Promise.all([deps.passwords.decoy(), deps.sql`SELECT 1`])
      deps.eventPublisher.start()
      deps.eventHub.start()
      deps.webhooks.start()
      deps.retention.start()
      return new Promise<AddressInfo>((resolve, reject) => {
        server.once('error', reject)
        // Node's default backlog (511) drops connection attempts when a thousand clients connect at
        // once, and each dropped one waits 1 s, then 3 s, for its SYN to be sent again; the kernel
        // caps this at net.core.somaxconn.
        server.listen({ port, host, backlog: LISTEN_BACKLOG }, () => {
          server.off('error', reject)
          resolve(server.address() as AddressInfo)
        })
      })
    },
    shutdown: () => {
      stopWatchingCertificate()
      return shutdown(server, deps)
    },
    async close() {
      stopWatchingCertificate()
      server.closeAllConnections()
      // Its error, when the server never listened, is of no interest here.
      await new Promise<unknown>((resolve) => server.close(resolve))
      await closeDatabaseWork(deps, 5)
    },
  }
}

function createDeps(config: Config, { log, cacheSize = CREDENTIAL_CACHE_SIZE, registry = buildRegistry(applicationResources), ...tuning }: ServiceOptions): AppDeps {
  if (config.databaseUrl === undefined) throw new Error('createService: config.databaseUrl is not set')
  if (config.databasePooler === 'auto') throw new Error('createService: config.databasePooler is not resolved (resolvePooler, src/core/db/pooler.ts)')
  const metrics = new Metrics({ max: config.poolMax })
  const { statementTimeoutMs } = config
  const pooled = config.databasePooler === 'transaction'
  const sql = connect(config.databaseUrl, { max: config.poolMax, statementTimeoutMs, pooled, onQuery: () => void metrics.queries++ })
  // Its `listen` opens one connection of its own (postgres.js), and nothing else does; without a listen URL, the pool's does.
  const listenSql = config.databaseListenUrl ? connect(config.databaseListenUrl, { max: 1, statementTimeoutMs, onQuery: () => void metrics.queries++ }) : sql
  const lifecycle = { shuttingDown: false }
  const apiKeyCache = new ApiKeyCache(cacheSize)
  const revocations = new RevocationList()
  const deps: AppDeps = {
    registry,
    sql,
    listenSql,
    config,
    log,
    lifecycle,
    readiness: new ReadinessCheck(() => sql`SELECT 1`),
    cursorKeys: cursorKeysFrom(config.jwtSecrets),
    metrics,
    jwtCache: new JwtCache(cacheSize),
    apiKeyCache,
    apiKeyUse: new LastUsedWrites(cacheSize),
    logins: new LoginGuard(config.rateLimit > 0 ? config.loginRateLimit : 0, knownAddressKeysFrom(config.jwtSecrets), log),
    revocations,
    credentialChanges: listenForCredentialChanges(sql, listenSql, apiKeyCache, revocations, log, { lifecycle }),
    databaseAdmission: admissionFor(config.poolMax, config.statementTimeoutMs, log),
    rateLimiter: config.rateLimit > 0 ? new RateLimiter(config.rateLimit) : undefined,
    passwords: new PasswordHasher(),
    listShapes: new ListShapes({ prepare: !pooled }),
    changeOrigin: (ctx) => originOf(ctx.principal, ctx.requestId),
    idempotencySecrets: config.jwtSecrets.map((k) => k.secret),
    idempotencyCleanup: new IdempotencyCleanup(),
    eventPublisher: new EventPublisher(sql, log, { ...defaultPublisherSettings, ...tuning.publisher }),
    // Streams are checked in the background, outside the database admission that requests wait under;
    // before events are let through, once this instance has applied every credential change committed before (src/events/stream-authority.ts).
    eventHub: new EventHub(sql, listenSql, log, { ...defaultStreamSettings, ...tuning.streams }, async (grants, { catchUp }) => {
      if (catchUp) await deps.credentialChanges.caughtUp()
      return checkGrants(grants, credentialDeps(deps, (work) => work()), config.allowSignup)
    }),
    webhooks: new WebhookWorker(sql, listenSql, config, log, { ...defaultWebhookSettings, ...tuning.webhooks }),
    retention: new EventRetention(sql, log, config.eventsRetentionDays, { ...defaultRetentionSettings, ...tuning.retention }),
  }
  return deps
}
