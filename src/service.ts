import type { Server as HttpsServer } from 'node:https'
import type { AddressInfo } from 'node:net'
import { ApiKeyCache } from './auth/api-keys/key-cache.js'
import { LastUsedWrites } from './auth/api-keys/last-used.js'
import { allRoutes, createApp, type AppServer } from './app.js'
import { certificateReloadJob, tlsOptions } from './core/http/tls.js'
import { CREDENTIAL_CACHE_SIZE, type AppDeps } from './app-deps.js'
import { CredentialChanges } from './auth/revocation/credential-changes.js'
import { credentialDeps } from './auth/credentials.js'
import { checkGrants } from './auth/grants.js'
import { JwtCache } from './auth/jwt-cache.js'
import { knownAddressKeysFrom } from './auth/login/known-addresses.js'
import { LoginGuard } from './auth/login/login-throttle.js'
import { PasswordHasher } from './auth/password.js'
import { RevocationList } from './auth/revocation/revocations.js'
import { cursorKeysFrom } from './auth/secrets.js'
import type { Config } from './config.js'
import { admissionFor } from './core/db/admission.js'
import { backgroundConnection, connect } from './core/db/connect.js'
import { purgeJob } from './core/db/batched-delete.js'
import { DatabaseComponent } from './core/db/database-component.js'
import { expiredIdempotencyRecords } from './core/http/idempotency.js'
import { Lifecycle } from './core/lifecycle.js'
import { BatchSlots } from './core/http/batch.js'
import { Scheduler } from './core/scheduler.js'
import { RateLimiter } from './core/http/rate-limit.js'
import type { AnyRoute } from './core/http/route.js'
import type { Logger } from './core/log.js'
import { Metrics } from './core/metrics.js'
import { ListShapes } from './core/collections/list-sql.js'
import { DrainDelay, HttpServerComponent } from './shutdown.js'
import { defaultStreamSettings, EventHub, type StreamSettings } from './events/hub.js'
import { defaultPublisherSettings, EventPublisher, type PublisherSettings } from './events/publisher.js'
import { defaultRetentionSettings, EventRetention, type RetentionSettings } from './events/retention.js'
import { TrashPurge } from './core/resources/trash-purge.js'
import { defaultWebhookSettings, WebhookWorker, type WebhookSettings } from './webhooks/worker.js'
import { wakeWorkers } from './webhooks/wake.js'
import { mailTransportFor } from './mail/transport.js'
import { defaultMailSettings, MailWorker, type MailSettings } from './mail/worker.js'
import { BackgroundWork, type BackgroundWorkSettings } from './core/background-work.js'
import { defaultRecoveryRequestSettings } from './auth/recovery/recovery-routes.js'
import { ReadinessCheck } from './health/readiness.js'
import { buildRegistry, type Registry } from './registry.js'
import { applicationModules } from './modules.js'
import { originOf } from './auth/origin.js'
import { DEFAULT_LEEWAY_SECONDS } from './auth/jwt.js'
import { IdentityProvider, type ProviderTuning } from './auth/oidc/provider-principals.js'
import { users } from './users/resource.js'
import { systemClock, type Clock } from './core/lib/clock.js'

// One service instance owns all of its state: the pool, the caches, the
// limits, the credential listener, the server. Nothing of it lives in a
// module, so two services in one process (tests run several) share nothing.
//
// Everything it runs beside its requests is a component of one lifecycle
// (src/core/lifecycle.ts), every repeating job a job of one scheduler
// (src/core/scheduler.ts). Creating a service opens nothing; `listen`
// starts the components in the order registered below, and `shutdown` and
// `close` stop them in the reverse order, through one path.

/** How long `close` gives the components to stop. */
const CLOSE_TIMEOUT_MS = 5000

export interface ServiceOptions {
  log: Logger
  /** Entries per credential cache (JWTs, API keys, last_used_at writes); default CREDENTIAL_CACHE_SIZE. */
  cacheSize?: number
  /** Routes appended to the service's own; /openapi.json describes them too. */
  routes?: readonly AnyRoute[]
  /**
   * Its resources and what is derived from them; default the application's modules (src/modules.ts). A test adds a
   * module here.
   */
  registry?: Registry
  /**
   * Tuning of the event stream, webhook deliveries and retention (tests shorten the times); defaults in each module.
   */
  streams?: Partial<StreamSettings>
  webhooks?: Partial<WebhookSettings>
  retention?: Partial<RetentionSettings>
  publisher?: Partial<PublisherSettings>
  /** The mail worker's times, and a transport in place of the configuration's (a test's that fails, then recovers). */
  mail?: Partial<MailSettings>
  /**
   * How the identity provider's keys are fetched (src/auth/oidc/key-set.ts): tests shorten the wait between fetches for
   * unknown kids.
   */
  identityProvider?: ProviderTuning
  /** How many password-reset requests are worked on at once and held at most (src/auth/recovery/recovery-routes.ts). */
  recoveryRequests?: Partial<BackgroundWorkSettings>
  /**
   * The time its own expiry checks read; default the system's. Tests
   * move theirs forward instead of waiting (src/core/lib/clock.ts).
   */
  clock?: Clock
  /**
   * What GET /metrics answers; default this service's figures. A cluster
   * worker answers for every worker (src/cluster/worker.ts).
   */
  metricsReport?: () => Promise<string>
}

export interface Service {
  readonly deps: AppDeps
  readonly server: AppServer
  /** Its components, started by `listen` in this order and stopped in the reverse. */
  readonly lifecycle: Lifecycle
  /** Its repeating jobs. */
  readonly scheduler: Scheduler
  /**
   * Starts every component, the port last but the streams; resolves to the
   * address bound (port 0 picks a free port). `reusePort`: one of several
   * sockets on the port (a worker's, src/cluster/primary.ts).
   */
  listen(port: number, host: string, options?: { reusePort?: boolean }): Promise<AddressInfo>
  /**
   * The stop on a signal: /readyz fails at once; requests are still served
   * for SHUTDOWN_DELAY (src/shutdown.ts, DrainDelay); then requests in flight
   * are drained and the rest stopped, within SHUTDOWN_TIMEOUT from the
   * drain's start. A second call (a second signal) ends the delay at once.
   * Never rejects.
   */
  shutdown(): Promise<void>
  /** The same stop without the drain: the clients' connections are cut first. */
  close(): Promise<void>
}

/**
 * A service on `config.databaseUrl` (migrated already), with
 * `config.jwtSecrets` and `config.databasePooler` resolved. Opens nothing
 * until `listen`, but what its pool opens when used before (`deps.sql`),
 * which `close` ends too.
 */
export function createService(config: Config, options: ServiceOptions): Service {
  const { log } = options
  // Read first: a certificate that cannot be read stops start-up before anything is opened.
  const tls = config.tls ? tlsOptions(config.tls) : undefined
  const scheduler = new Scheduler(log)
  const lifecycle = new Lifecycle(log)
  const deps = createDeps(config, options)
  const { modules } = deps.registry
  const server = createApp(deps, allRoutes(deps.registry, config.apiPrefix, options.routes), tls)
  const http = new HttpServerComponent(server, config, log)

  scheduler.add(
    purgeJob({
      name: 'idempotency.purge',
      table: 'idempotency_keys',
      where: expiredIdempotencyRecords,
      sql: deps.maintenanceSql,
    }),
  )
  if (config.tls) scheduler.add(certificateReloadJob(server as HttpsServer, config.tls, log))
  for (const module of modules) for (const job of module.jobs?.(deps) ?? []) scheduler.add(job)
  for (const job of deps.trash.jobs) scheduler.add(job)

  // Each uses, starting and stopping, what is registered before it.
  lifecycle.register(new DatabaseComponent(deps.sql, deps.listenSql, deps.maintenanceSql, config.databaseUrl!))
  lifecycle.register(deps.databaseAdmission)
  for (const module of modules)
    for (const component of module.components?.(deps) ?? []) if (component) lifecycle.register(component)
  lifecycle.register(scheduler)
  lifecycle.register(http)
  // Streams never finish by themselves: they end before the server drains, and their clients resume elsewhere.
  for (const module of modules) for (const component of module.streams?.(deps) ?? []) lifecycle.register(component)

  let stopped: Promise<void> | undefined
  const stop = (deadline: number) =>
    (stopped ??= (async () => {
      const started = performance.now()
      deps.stopping.draining = true
      await lifecycle.stop(deadline)
      log.info('stopped', { duration_ms: Math.round(performance.now() - started) })
    })())
  let leaving: { delay: DrainDelay | undefined; stopped: Promise<void> } | undefined
  const shutdown = () => {
    if (leaving) {
      const left = leaving.delay?.skip() ?? 0
      if (left > 0)
        log.info('the drain begins now, before the end of SHUTDOWN_DELAY (a second signal)', {
          skipped_ms: Math.round(left),
        })
      return leaving.stopped
    }
    const drain = () => stop(performance.now() + config.shutdownTimeoutMs)
    if (config.shutdownDelayMs === 0) return (leaving = { delay: undefined, stopped: drain() }).stopped
    const delay = new DrainDelay(config.shutdownDelayMs)
    deps.stopping.drainsAt = delay.drainsAt
    log.info('not ready: serving for SHUTDOWN_DELAY while load balancers stop sending requests here, then draining', {
      shutdown_delay_s: config.shutdownDelayMs / 1000,
    })
    const stopped = delay.over.then(() => {
      log.info('draining')
      return drain()
    })
    return (leaving = { delay, stopped }).stopped
  }
  return {
    deps,
    server,
    lifecycle,
    scheduler,
    async listen(port, host, options) {
      http.bind(port, host, options)
      await lifecycle.start()
      return http.address
    },
    shutdown,
    close() {
      leaving?.delay?.skip()
      server.closeAllConnections()
      return stop(performance.now() + CLOSE_TIMEOUT_MS)
    },
  }
}

function createDeps(
  config: Config,
  {
    log,
    cacheSize = CREDENTIAL_CACHE_SIZE,
    registry = buildRegistry(applicationModules),
    clock = systemClock,
    ...tuning
  }: ServiceOptions,
): AppDeps {
  if (config.databaseUrl === undefined) throw new Error('createService: config.databaseUrl is not set')
  if (config.databasePooler === 'auto')
    throw new Error('createService: config.databasePooler is not resolved (resolvePooler, src/core/db/pooler.ts)')
  const metrics = new Metrics({ max: config.poolMax })
  const { statementTimeoutMs } = config
  const pooled = config.databasePooler === 'transaction'
  const sql = connect(config.databaseUrl, {
    max: config.poolMax,
    statementTimeoutMs,
    pooled,
    onQuery: () => void metrics.queries++,
  })
  // Its `listen` opens one connection of its own (postgres.js), and
  // nothing else does; without a listen URL, the pool's does.
  const listenSql = config.databaseListenUrl
    ? connect(config.databaseListenUrl, { max: 1, statementTimeoutMs, onQuery: () => void metrics.queries++ })
    : sql
  const stopping = { draining: false }
  const maintenanceSql = backgroundConnection(sql)
  const apiKeyCache = new ApiKeyCache(cacheSize, () => clock.now())
  const revocations = new RevocationList(() => clock.now())
  const mailSettings = { ...defaultMailSettings, ...tuning.mail }
  const passwords = new PasswordHasher(config.passwordHashCost)
  const hashesHelp =
    'Password hashes derived (scrypt runs): logins, against a decoy for unknown accounts, and new passwords.'
  metrics.counterOf('password_hashes_total', hashesHelp, () => passwords.derivations)
  const databaseAdmission = admissionFor(config.poolMax, config.statementTimeoutMs, log)
  metrics.counterOf(
    'db_admission_refused_total',
    'Requests refused at once (503) by database admission: the database was not keeping up with those waiting.',
    () => databaseAdmission.refused,
  )
  metrics.counterOf(
    'db_admission_overdue_total',
    'Requests answered 503 at their database deadline (STATEMENT_TIMEOUT + 5 s): the database was not answering.',
    () => databaseAdmission.overdue,
  )
  const deps: AppDeps = {
    registry,
    sql,
    listenSql,
    maintenanceSql,
    config,
    clock,
    log,
    stopping,
    readiness: new ReadinessCheck(
      () => sql`SELECT 1`,
      () => clock.now(),
    ),
    cursorKeys: cursorKeysFrom(config.jwtSecrets),
    metrics,
    metricsReport: tuning.metricsReport ?? (async () => metrics.render()),
    jwtCache: new JwtCache(cacheSize),
    apiKeyCache,
    apiKeyUse: new LastUsedWrites(cacheSize),
    logins: new LoginGuard(
      config.rateLimit > 0 ? config.loginRateLimit : 0,
      knownAddressKeysFrom(config.jwtSecrets),
      () => clock.now(),
    ),
    revocations,
    credentialChanges: new CredentialChanges(sql, listenSql, apiKeyCache, revocations, log, { stopping }),
    databaseAdmission,
    problems: registry.problems,
    rateLimiter: config.rateLimit > 0 ? new RateLimiter(config.rateLimit, undefined, () => clock.now()) : undefined,
    passwords,
    listShapes: new ListShapes({ prepare: !pooled }),
    changeOrigin: (ctx) => originOf(ctx.principal, ctx.requestId),
    idempotencySecrets: config.jwtSecrets.map((k) => k.secret),
    batchSlots: new BatchSlots(config.poolMax),
    eventPublisher: new EventPublisher(sql, wakeWorkers, { ...defaultPublisherSettings, ...tuning.publisher }),
    // Streams are checked in the background, outside the database admission that requests wait under;
    // before events are let through, once this instance has applied every credential
    // change committed before (src/events/stream-authority.ts).
    eventHub: new EventHub(
      sql,
      listenSql,
      log,
      { ...defaultStreamSettings, ...tuning.streams },
      async (grants, { catchUp }) => {
        if (catchUp) await deps.credentialChanges.caughtUp()
        return checkGrants(
          grants,
          credentialDeps(deps, (work) => work()),
          config,
        )
      },
    ),
    webhooks: new WebhookWorker(sql, listenSql, registry.resourceOf('webhooks'), config, log, {
      ...defaultWebhookSettings,
      ...tuning.webhooks,
    }),
    mail: new MailWorker(
      sql,
      listenSql,
      mailSettings.transport ?? mailTransportFor(config, log),
      log,
      metrics,
      mailSettings,
    ),
    recoveryRequests: new BackgroundWork('recovery-requests', log, {
      ...defaultRecoveryRequestSettings,
      ...tuning.recoveryRequests,
    }),
    identityProvider: config.oidc
      ? new IdentityProvider(
          config.oidc,
          users,
          log,
          cacheSize,
          DEFAULT_LEEWAY_SECONDS,
          metrics,
          clock,
          tuning.identityProvider,
        )
      : undefined,
    trash: new TrashPurge(
      maintenanceSql,
      registry.trash,
      config.trashRetention,
      () => clock.now(),
      (resource, rows) => log.info('trash purged', { table: resource.table, rows }),
    ),
    retention: new EventRetention(maintenanceSql, log, config.eventsRetentionDays, {
      ...defaultRetentionSettings,
      ...tuning.retention,
    }),
  }
  const deliveries = deps.webhooks.counts
  metrics.counterOf(
    'webhook_delivered_total',
    'Webhook deliveries the receiver accepted (2xx).',
    () => deliveries.delivered,
  )
  metrics.counterOf(
    'webhook_retried_total',
    'Webhook attempts that failed and are due again after their retry delay.',
    () => deliveries.retried,
  )
  metrics.counterOf(
    'webhook_failed_total',
    'Webhook deliveries given up on: their last retry failed too.',
    () => deliveries.failed,
  )
  return deps
}
