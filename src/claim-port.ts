import { createServer } from 'node:net'
import { ConfigError } from './core/config-error.js'

// Start-up claims its port before it does anything that lasts (migrations,
// the admin bootstrap, forking workers): a port that is taken, by another
// program or a second copy of the service, stops the start there, with one
// line, and leaves the database as it was.

/**
 * Binds host:port alone (without SO_REUSEPORT) and lets go at once: resolves
 * to the port, the one the system picked for port 0. A port that cannot be
 * had (EADDRINUSE, EACCES, an address not on this
 * machine) is a ConfigError (`cannotListen`).
 */
export function claimPort(host: string, port: number): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    const probe = createServer()
    probe.once('error', reject)
    probe.listen({ host, port, exclusive: true }, () => {
      const { port: bound } = probe.address() as { port: number }
      probe.close(() => resolve(bound))
    })
  }).catch((err: unknown) => {
    throw cannotListen(host, port, err)
  })
}

/** The line start-up stops with when `listen` on host:port failed with `err`, whoever tried. */
export function cannotListen(host: string, port: number, err: unknown): ConfigError {
  const { code, message } = err as NodeJS.ErrnoException
  const hint =
    code === 'EADDRINUSE'
      ? '; is another copy of the service running?'
      : code === 'EADDRNOTAVAIL'
        ? '; HOST must be an address of this machine'
        : ''
  return new ConfigError(`PORT=${port} on HOST=${host}: cannot listen (${code ?? message})${hint}`)
}
