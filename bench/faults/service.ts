import { createServer } from 'node:net'
import { loadConfig } from '../../src/config.js'
import { resolvePooler } from '../../src/core/db/pooler.js'
import { createLogger } from '../../src/core/log.js'
import { createService, type Service, type ServiceOptions } from '../../src/service.js'
import { OwnCluster, serviceEnv, spawnService, type Spawned } from '../../test/fault-kit.js'

// The services the fault benchmark measures: the real process (`node
// --import tsx src/main.ts`, as the fault tests start it) on a PostgreSQL
// cluster of the section's own, or, where a section needs its insides (the
// event streams), the service in this process.

/** A port free now (the kernel's pick), for a service that must not announce itself on its log. */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer()
      .listen(0, '127.0.0.1', () => {
        const { port } = server.address() as { port: number }
        server.close(() => resolve(port))
      })
      .once('error', reject)
  })
}

/**
 * The real process, logging warnings and errors only: the bench reads no
 * request line, and a line per request parsed here would slow the clients
 * being measured.
 */
export async function quietService(env: Record<string, string>): Promise<Spawned> {
  return spawnService({ LOG_LEVEL: 'warn', PORT: String(await freePort()), ...env })
}

/** A cluster of its own with one migrated database and an admin: what `work` gets, destroyed after. */
export async function withOwnDatabase<T>(
  work: (db: { cluster: OwnCluster; url: string; adminId: number }) => Promise<T>,
): Promise<T> {
  const cluster = await OwnCluster.create()
  try {
    return await work({ cluster, ...(await cluster.createDatabase()) })
  } finally {
    await cluster.destroy()
  }
}

/** The service in this process on `databaseUrl`, listening on a port of its own, with these stream settings. */
export async function inProcessService(
  databaseUrl: string,
  streams: ServiceOptions['streams'] = {},
): Promise<{ service: Service; url: string }> {
  const loaded = { ...loadConfig({ PORT: '0', HOST: '127.0.0.1', ...serviceEnv, LOG_LEVEL: 'error' }), databaseUrl }
  const config = { ...loaded, databasePooler: await resolvePooler(loaded) }
  const service = createService(config, { log: createLogger('error', () => {}), streams })
  const { port } = await service.listen(0, '127.0.0.1')
  return { service, url: `http://127.0.0.1:${port}` }
}
