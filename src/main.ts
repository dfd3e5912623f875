import type { Sql } from 'postgres'
import { PasswordHasher } from './auth/password.js'
import { resolveSecrets } from './auth/secrets.js'
import { ConfigError } from './core/config-error.js'
import { loadConfig, type Config } from './config.js'
import { connect, DriverPatchError } from './core/db/connect.js'
import { dataRoot, LocalClusterError, localDevelopmentUrl } from './dev/local-cluster.js'
import { migrate, MigrationError } from './core/db/migrate.js'
import { resolvePooler } from './core/db/pooler.js'
import { batchedWriter, createLogger, describeError, type Logger } from './core/log.js'
import { runPrimary } from './cluster/primary.js'
import { reportCannotStart, workerLink, type WorkerLink } from './cluster/worker.js'
import { warnIfEndOfLife } from './node-support.js'
import { healthcheckCommand } from './healthcheck.js'
import { adminPasswordFrom, bootstrapAdminIfNone, createOrResetAdmin } from './users/admin-bootstrap.js'

// The process: configuration, database, signals, the listening socket.
// `node dist/main.js` serves; `node dist/main.js migrate` only migrates.
// With WORKERS > 1 this process migrates, then is the primary of that many
// workers (src/cluster/primary.ts), each of which runs this file again and
// goes straight to `serve`.

/** What the kernel writes to a pipe whole (PIPE_BUF on Linux): workers share the primary's stdout. */
const PIPE_BUF = 4096

async function main(): Promise<void> {
  const command = process.argv[2]
  // The image's HEALTHCHECK (src/healthcheck.ts): no logger, no database, every few seconds.
  if (command === 'healthcheck') process.exit(await healthcheckCommand(process.argv.slice(3), process.env))
  // For `admin`, ADMIN_EMAIL and ADMIN_PASSWORD name the admin to make, not the one to create at start-up.
  const config = loadConfig(command === 'admin' ? { ...process.env, ADMIN_EMAIL: undefined, ADMIN_PASSWORD: undefined } : process.env)
  const worker = workerLink()
  const stdout = batchedWriter((text) => process.stdout.write(text), undefined, config.workers > 1 ? PIPE_BUF : undefined)
  process.on('exit', stdout.flush)
  const log = createLogger(config.logLevel, stdout.write, worker?.logFields)
  // Once per service: the primary (or the only process) says it, not each worker.
  if (!worker) warnIfEndOfLife(log)
  // Last resort. Every known way for the database driver to throw outside a
  // request is patched (src/core/db/postgres-patch.mjs), so reaching this is a bug
  // whose consequences are unknown: carrying on could serve from a broken
  // pool or half-updated state. Do what Node would do (exit 1, so the
  // supervisor restarts the process), but first write the error as a JSON
  // log line like every other, where log collection will see it.
  const fatal = (kind: string) => (err: unknown) => {
    log.error(`${kind}; exiting`, describeError(err))
    process.exit(1)
  }
  process.on('uncaughtException', fatal('uncaught exception'))
  process.on('unhandledRejection', fatal('unhandled promise rejection'))

  // A worker is given both by its primary (DATABASE_URL, DATABASE_POOLER resolved), which migrated and wrote the development secret.
  if (worker) return serve({ ...config, jwtSecrets: resolveSecrets(config, dataRoot) }, log, worker)
  const databaseUrl = config.databaseUrl ?? (await localDevelopmentUrl())
  // Before anything else: a transaction pooler changes how every connection is opened (src/core/db/pooler.ts).
  const databasePooler = await resolvePooler({ ...config, databaseUrl })
  if (databasePooler === 'transaction') {
    log.info('DATABASE_URL goes through a transaction pooler: no prepared statements there; LISTEN and migrations on DATABASE_LISTEN_URL', { pooler: config.databasePooler === 'auto' ? 'detected' : 'DATABASE_POOLER' })
  }
  // Migrations and the commands run on a short connection of their own, on DATABASE_LISTEN_URL when set:
  // PostgreSQL itself, so that what a migration file does never depends on a pooler. The service opens its pool after them.
  const setup = connect(config.databaseListenUrl ?? databaseUrl, { max: 1, statementTimeoutMs: config.statementTimeoutMs })
  try {
    const applied = await migrate(setup)
    if (applied.length) log.info('migrations applied', { migrations: applied })
    if (command === 'migrate') return log.info('database is up to date')
    if (command === 'admin') return await adminCommand(setup)
    if (config.bootstrapAdmin && (await bootstrapAdminIfNone(setup, new PasswordHasher(), config.bootstrapAdmin))) {
      log.info('created the first admin from ADMIN_EMAIL', { email: config.bootstrapAdmin.email })
    }
  } finally {
    await setup.end({ timeout: 5 })
  }
  const resolved = { ...config, databaseUrl, databasePooler, jwtSecrets: resolveSecrets(config, dataRoot) }
  if (config.workers > 1) return await runPrimary(resolved, log, { DATABASE_URL: databaseUrl, DATABASE_POOLER: databasePooler })
  await serve(resolved, log)
}

/** `make admin EMAIL=…`, the password from ADMIN_PASSWORD or standard input, never from argv (it would show in `ps`). */
async function adminCommand(sql: Sql): Promise<void> {
  if (process.argv.length > 4) throw new ConfigError('admin takes the e-mail only; give the password in ADMIN_PASSWORD or on standard input, not on the command line (it would show in ps).')
  const email = process.argv[3] || process.env.ADMIN_EMAIL || 'admin@example.com'
  const admin = await createOrResetAdmin(sql, new PasswordHasher(), email, await adminPasswordFrom(process.env, process.stdin))
  process.stdout.write(`${admin.created ? 'Created' : 'Reset'} admin ${email} (id ${admin.id}). Password: ${admin.password}\n`)
}

async function serve(config: Config, log: Logger, worker?: WorkerLink): Promise<void> {
  // Loaded here, not at the top: a primary of workers never serves, and the whole application is most of a process's memory.
  const { createService } = await import('./service.js')
  const service = createService(config, { log, metricsReport: worker && (() => worker.serviceMetrics()) })
  const { address, port } = await service.listen(config.port, config.host, { reusePort: worker !== undefined })
  log.info('listening', { address, port, prefix: config.apiPrefix || null })
  worker?.listening(port, service.deps.metrics)

  let stopping = false
  const onSignal = (signal: NodeJS.Signals) => {
    if (stopping) return
    stopping = true
    log.info('shutting down', { signal })
    // shutdown() never rejects and is bounded by SHUTDOWN_TIMEOUT, also with the database down.
    void service.shutdown().then(() => process.exit(0))
  }
  process.on('SIGTERM', onSignal)
  process.on('SIGINT', onSignal)
}

main().catch(async (err: unknown) => {
  const known = err instanceof ConfigError || err instanceof MigrationError || err instanceof LocalClusterError || err instanceof DriverPatchError
  const reason = known ? err.message : JSON.stringify(describeError(err))
  process.stderr.write(`Cannot start: ${reason}\n`)
  await reportCannotStart(known || !(err instanceof Error) ? reason : err.message)
  process.exit(1)
})
