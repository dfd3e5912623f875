import { join } from 'node:path'
import type { Sql } from 'postgres'
import { PasswordHasher } from './auth/password.js'
import { resolveSecrets } from './auth/secrets.js'
import { cannotListen, claimPort } from './claim-port.js'
import { ConfigError } from './core/config-error.js'
import { readConfig, type Config } from './config.js'
import { connect } from './core/db/connect.js'
import { assertDriverPatched, DriverPatchError } from './core/db/driver-check.js'
import { DatabaseUnreachable, unreachable, urlTarget } from './core/db/target.js'
import { dataRoot, LocalClusterError, localDevelopmentDatabase } from './dev/local-cluster.js'
import { migrate, MigrationError } from './core/db/migrate.js'
import { resolvePooler } from './core/db/pooler.js'
import { batchedWriter, createLogger, describeError, type Logger } from './core/log.js'
import { runPrimary } from './cluster/primary.js'
import { reportCannotStart, workerLink, type WorkerLink } from './cluster/worker.js'
import { warnIfEndOfLife } from './node-support.js'
import { readSecret } from './secret-files.js'
// The patch script itself, from src/ and from dist/ alike (both one level under the project; the image copies it).
import { PATCH_SCRIPT, patchProblem } from '../src/driver-patch/postgres.mjs'
import { adminPasswordFrom, bootstrapAdminIfNone, createOrResetAdmin } from './users/admin-bootstrap.js'

// The commands that start the service's work (serve, migrate, admin):
// configuration, database, signals, the listening socket. With WORKERS > 1
// this process migrates, then is the primary of that many workers
// (src/cluster/primary.ts), each of which runs src/main.ts again and goes
// straight to serving. Loaded by src/main.ts only for these commands, so
// that the health check does not load the service.

/** What the kernel writes to a pipe whole (PIPE_BUF on Linux): workers share the primary's stdout. */
const PIPE_BUF = 4096

export type Kind = 'serve' | 'migrate' | 'admin'

export async function start(kind: Kind, args: string[]): Promise<void> {
  // Before anything connects (the local cluster's set-up, the pooler's detection, migrations, a worker's pool):
  // on a driver without its patch, a database restart could crash the process.
  assertDriverPatched({ problem: patchProblem, script: PATCH_SCRIPT })
  // For `admin`, ADMIN_EMAIL and ADMIN_PASSWORD name the admin to make, not the one to create at start-up.
  const env =
    kind === 'admin'
      ? { ...process.env, ADMIN_EMAIL: undefined, ADMIN_PASSWORD: undefined, ADMIN_PASSWORD_FILE: undefined }
      : process.env
  const worker = workerLink()
  const { config, warnings } = readConfig(env, kind)
  const stdout = batchedWriter(
    (text) => process.stdout.write(text),
    undefined,
    config.workers > 1 ? PIPE_BUF : undefined,
  )
  process.on('exit', stdout.flush)
  const log = createLogger(config.logLevel, stdout.write, worker?.logFields)
  // Last resort. Every known way for the database driver to throw outside a
  // request is patched (src/driver-patch/postgres.mjs), so reaching this is a bug
  // whose consequences are unknown: carrying on could serve from a broken
  // pool or half-updated state. Do what Node would do (exit 1, so the
  // supervisor restarts the process), but first write the error as a JSON
  // log line like every other, where log collection will see it.
  const fatal = (what: string) => (err: unknown) => {
    log.error(`${what}; exiting`, describeError(err))
    process.exit(1)
  }
  process.on('uncaughtException', fatal('uncaught exception'))
  process.on('unhandledRejection', fatal('unhandled promise rejection'))

  // A worker is given both by its primary (DATABASE_URL, DATABASE_POOLER resolved), which migrated and wrote the
  // development secret.
  if (worker)
    return serve({ ...config, jwtSecrets: resolveSecrets(config, dataRoot) }, log, worker).catch((err: unknown) => {
      throw named(err, [['DATABASE_URL', config.databaseUrl]])
    })

  // Once per service: the primary (or the only process) says these, not each worker.
  warnIfEndOfLife(log)
  for (const warning of warnings) log.warn('a variable looks misspelt; it is ignored', { problem: warning })
  if (kind === 'serve' && !config.production) warnDevelopment(config, log)
  // Before anything lasts (migrations, the first admin): a port that is taken stops the start here, once.
  // Port 0 cannot be taken: one process lets the system pick when it listens; a primary needs one port for all
  // its workers, so it has the system pick it here.
  const port =
    kind === 'serve' && (config.port !== 0 || config.workers > 1)
      ? await claimPort(config.host, config.port)
      : config.port

  // Without DATABASE_URL, the local cluster's database, served as
  // a runtime role and migrated as its owner, as in production.
  const local = config.databaseUrl === undefined ? await localDevelopmentDatabase() : undefined
  const databaseUrl = config.databaseUrl ?? local!.url
  const databaseSettings: DatabaseSettings = [
    [config.databaseUrl ? 'DATABASE_URL' : 'DATABASE_URL (unset: the local development cluster)', databaseUrl],
    ['DATABASE_LISTEN_URL', config.databaseListenUrl],
    ['DATABASE_MIGRATION_URL', config.databaseMigrationUrl],
  ]
  try {
    // Before anything else: a transaction pooler changes how every connection is opened (src/core/db/pooler.ts).
    const databasePooler = await resolvePooler({ ...config, databaseUrl })
    if (kind === 'serve') logStart(config, databaseUrl, databasePooler, log)
    if (databasePooler === 'transaction') {
      log.info(
        'DATABASE_URL goes through a transaction pooler: no prepared statements there; LISTEN (and migrations, ' +
          'without DATABASE_MIGRATION_URL) on DATABASE_LISTEN_URL',
        { pooler: config.databasePooler === 'auto' ? 'detected' : 'DATABASE_POOLER' },
      )
    }
    // Migrations and the commands run on a short connection of their own: as the schema's owner on
    // DATABASE_MIGRATION_URL when DATABASE_URL's role may only read and write (deploy/postgres/runtime-role.psql), else
    // on DATABASE_LISTEN_URL when set: PostgreSQL itself, so that what a migration file does never depends on a pooler.
    // The service opens its pool after them.
    const setupUrl = config.databaseMigrationUrl ?? local?.ownerUrl ?? config.databaseListenUrl ?? databaseUrl
    const setup = connect(setupUrl, { max: 1, statementTimeoutMs: config.statementTimeoutMs })
    try {
      const applied = await migrate(setup).catch((err: unknown) => {
        throw unreachable(setupUrl, setup, err)
      })
      if (applied.length) log.info('migrations applied', { migrations: applied })
      if (kind === 'migrate') return log.info('database is up to date')
      if (kind === 'admin')
        return await adminCommand(setup, new PasswordHasher(config.passwordHashCost), args, config.oidcLocalPasswords)
      if (
        config.bootstrapAdmin &&
        (await bootstrapAdminIfNone(setup, new PasswordHasher(config.passwordHashCost), config.bootstrapAdmin))
      ) {
        log.info('created the first admin from ADMIN_EMAIL', { email: config.bootstrapAdmin.email })
      }
    } finally {
      await setup.end({ timeout: 5 })
    }
    const resolved = { ...config, port, databaseUrl, databasePooler, jwtSecrets: resolveSecrets(config, dataRoot) }
    // Workers read the configuration as this process did (secret
    // files included); they are given only what it found out.
    if (config.workers > 1)
      return await runPrimary(resolved, log, {
        ...(config.databaseUrl ? {} : { DATABASE_URL: databaseUrl }),
        DATABASE_POOLER: databasePooler,
      })
    await serve(resolved, log)
  } catch (err) {
    throw named(err, databaseSettings)
  }
}

/** The variables of the database URLs, and their URLs. */
type DatabaseSettings = Array<[variable: string, url: string | undefined]>

/** A database that could not be reached, as a ConfigError naming the variable to fix (the first with that URL). */
function named(err: unknown, settings: DatabaseSettings): unknown {
  if (!(err instanceof DatabaseUnreachable)) return err
  const variable = settings.find(([, url]) => url === err.url)?.[0] ?? 'DATABASE_URL'
  return new ConfigError(`${variable}: ${err.message}`)
}

/** Mode, address, database (never its password) and pooler: what an operator checks first when something is off. */
function logStart(config: Config, databaseUrl: string, pooler: string, log: Logger): void {
  const { host, port, database, user } = urlTarget(databaseUrl)
  log.info('starting', {
    mode: config.production ? 'production' : 'development',
    host: config.host,
    port: config.port,
    database_host: host,
    database_port: port,
    database_name: database,
    database_user: user,
    pooler,
    workers: config.workers,
  })
}

/** `npm start` without NODE_ENV: said loudly, with what it implies and how to run in production. */
function warnDevelopment(config: Config, log: Logger): void {
  log.warn('development mode: NODE_ENV is not "production"', {
    jwt_secrets: config.jwtSecrets.length ? 'JWT_SECRETS' : `generated, kept in ${join(dataRoot, 'jwt-secret')}`,
    database: config.databaseUrl ? 'DATABASE_URL' : 'the local development cluster in .data/',
    listening_on: config.host,
    for_production: 'set NODE_ENV=production, DATABASE_URL and JWT_SECRETS (docs/operations.md, "Configuration")',
  })
}

/**
 * `make admin EMAIL=…`: the password from ADMIN_PASSWORD (or its _FILE) or
 * standard input, never from argv (it would show in `ps`). A password given
 * is never printed back (it would land in a terminal's scroll-back or a CI
 * log); a generated one is printed, since it is shown nowhere else.
 */
async function adminCommand(
  sql: Sql,
  passwords: PasswordHasher,
  args: string[],
  localPasswords: boolean,
): Promise<void> {
  if (args.length > 1)
    throw new ConfigError(
      'admin takes the e-mail only; give the password in ADMIN_PASSWORD or on standard input, not on the command ' +
        'line (it would show in ps).',
    )
  // src/main.ts refuses the command without either.
  const email = args[0] || process.env.ADMIN_EMAIL!
  const secret = readSecret(process.env, 'ADMIN_PASSWORD')
  if (secret.problem) throw new ConfigError(secret.problem)
  const given = await adminPasswordFrom({ ADMIN_PASSWORD: secret.value }, process.stdin)
  const admin = await createOrResetAdmin(sql, passwords, email, given, localPasswords)
  const verb = admin.created ? 'Created' : 'Reset'
  const source = secret.file ? 'ADMIN_PASSWORD_FILE' : secret.value ? 'ADMIN_PASSWORD' : 'standard input'
  process.stdout.write(
    given === undefined
      ? `${verb} admin ${email} (id ${admin.id}). Password: ${admin.password}\n`
      : `${verb} admin ${email} (id ${admin.id}) with the password from ${source}.\n`,
  )
}

async function serve(config: Config, log: Logger, worker?: WorkerLink): Promise<void> {
  // Loaded here, not at the top: a primary of workers never serves,
  // and the whole application is most of a process's memory.
  const { createService } = await import('./service.js')
  const service = createService(config, { log, metricsReport: worker && (() => worker.serviceMetrics()) })
  // The port was claimed before the migrations; taken since (or port 0's pick lost), it is said the same way.
  const { address, port } = await service
    .listen(config.port, config.host, { reusePort: worker !== undefined })
    .catch((err: unknown) => {
      throw (err as NodeJS.ErrnoException).syscall === 'listen' ? cannotListen(config.host, config.port, err) : err
    })
  log.info('listening', { address, port, prefix: config.apiPrefix || null })
  worker?.listening(port, service.deps.metrics)

  let stopping: NodeJS.Signals | undefined
  const onSignal = (signal: NodeJS.Signals) => {
    // The same signal again (Ctrl-C twice) ends SHUTDOWN_DELAY. Not another one: a worker stopped
    // by Ctrl-C gets the terminal's SIGINT and its primary's SIGTERM, and must wait all the same.
    if (stopping) return void (signal === stopping && service.shutdown())
    stopping = signal
    log.info('shutting down', { signal })
    // shutdown() never rejects and is bounded by SHUTDOWN_DELAY + SHUTDOWN_TIMEOUT, also with the database down.
    void service.shutdown().then(() => process.exit(0))
  }
  process.on('SIGTERM', onSignal)
  process.on('SIGINT', onSignal)
}

/** Start-up failures an operator can act on: their message alone, one line per problem, no stack trace. */
const explained = (err: unknown): err is Error =>
  err instanceof ConfigError ||
  err instanceof MigrationError ||
  err instanceof LocalClusterError ||
  err instanceof DriverPatchError

/**
 * Says why a command failed, one line per problem and no stack trace when an operator can act on it, and exits 1. Each
 * line begins with what failed: `failure`, the command's own words (src/main.ts), "Cannot start" by default.
 */
export async function exitCannotStart(err: unknown, failure = 'Cannot start'): Promise<never> {
  const lines =
    err instanceof ConfigError ? err.problems : explained(err) ? [err.message] : [JSON.stringify(describeError(err))]
  process.stderr.write(lines.map((line) => `${failure}: ${line}\n`).join(''))
  await reportCannotStart(explained(err) || !(err instanceof Error) ? lines.join('; ') : err.message)
  process.exit(1)
}
