import type { AddressInfo } from 'node:net'
import { createApp } from './app.js'
import { createDeps } from './app-deps.js'
import { resolveSecrets } from './auth/secrets.js'
import { Metrics } from './metrics/metrics.js'
import { ConfigError, loadConfig } from './config.js'
import { connect, DriverPatchError } from './db/connect.js'
import { dataRoot, LocalClusterError, localDevelopmentUrl } from './db/local-cluster.js'
import { migrate, MigrationError } from './db/migrate.js'
import { batchedWriter, createLogger, describeError } from './log.js'
import { shutdown } from './shutdown.js'
import { adminPasswordFrom, bootstrapAdminIfNone, createOrResetAdmin } from './users/admin-bootstrap.js'

// The process: configuration, database, signals, the listening socket.
// `node dist/main.js` serves; `node dist/main.js migrate` only migrates.

async function main(): Promise<void> {
  const command = process.argv[2]
  // For `admin`, ADMIN_EMAIL and ADMIN_PASSWORD name the admin to make, not the one to create at start-up.
  const config = loadConfig(command === 'admin' ? { ...process.env, ADMIN_EMAIL: undefined, ADMIN_PASSWORD: undefined } : process.env)
  const stdout = batchedWriter((text) => process.stdout.write(text))
  process.on('exit', stdout.flush)
  const log = createLogger(config.logLevel, stdout.write)
  // Last resort. Every known way for the database driver to throw outside a
  // request is patched (src/db/postgres-patch.mjs), so reaching this is a bug
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

  const databaseUrl = config.databaseUrl ?? (await localDevelopmentUrl())
  const metrics = new Metrics({ max: config.poolMax })
  const sql = connect(databaseUrl, { max: config.poolMax, statementTimeoutMs: config.statementTimeoutMs, onQuery: () => void metrics.queries++ })

  const applied = await migrate(sql)
  if (applied.length) log.info('migrations applied', { migrations: applied })
  if (command === 'migrate') {
    log.info('database is up to date')
    await sql.end({ timeout: 5 })
    return
  }
  if (command === 'admin') {
    // `make admin EMAIL=…`, the password from ADMIN_PASSWORD or standard input, never from argv (it would show in `ps`).
    if (process.argv.length > 4) throw new ConfigError('admin takes the e-mail only; give the password in ADMIN_PASSWORD or on standard input, not on the command line (it would show in ps).')
    const email = process.argv[3] || process.env.ADMIN_EMAIL || 'admin@example.com'
    const admin = await createOrResetAdmin(sql, email, await adminPasswordFrom(process.env, process.stdin))
    process.stdout.write(`${admin.created ? 'Created' : 'Reset'} admin ${email} (id ${admin.id}). Password: ${admin.password}\n`)
    await sql.end({ timeout: 5 })
    return
  }
  if (config.bootstrapAdmin && (await bootstrapAdminIfNone(sql, config.bootstrapAdmin))) {
    log.info('created the first admin from ADMIN_EMAIL', { email: config.bootstrapAdmin.email })
  }

  const secrets = resolveSecrets(config, dataRoot)
  const deps = createDeps(sql, { ...config, jwtSecrets: secrets }, log, metrics)
  const server = createApp(deps)
  server.listen(config.port, config.host, () => {
    const { address, port } = server.address() as AddressInfo
    log.info('listening', { address, port, prefix: config.apiPrefix || null })
  })

  let stopping = false
  const onSignal = (signal: NodeJS.Signals) => {
    if (stopping) return
    stopping = true
    log.info('shutting down', { signal })
    // shutdown() never rejects and is bounded by SHUTDOWN_TIMEOUT, also with the database down.
    void shutdown(server, deps).then(() => process.exit(0))
  }
  process.on('SIGTERM', onSignal)
  process.on('SIGINT', onSignal)
}

main().catch((err: unknown) => {
  if (err instanceof ConfigError || err instanceof MigrationError || err instanceof LocalClusterError || err instanceof DriverPatchError) {
    process.stderr.write(`Cannot start: ${err.message}\n`)
  } else {
    process.stderr.write(`Cannot start: ${JSON.stringify(describeError(err))}\n`)
  }
  process.exit(1)
})
