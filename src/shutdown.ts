import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import type { AppServer } from './app.js'
import type { Config } from './config.js'
import type { Component } from './core/lifecycle.js'
import type { Logger } from './core/log.js'

const LISTEN_BACKLOG = 4096

/**
 * SHUTDOWN_DELAY: the wait between the signal and the drain. A load balancer
 * (a Kubernetes Service's endpoints, an ingress, a cloud balancer) learns that
 * an instance is leaving from its failing readiness probe or from the
 * orchestrator, some time after the signal; a listener that closed at the
 * signal would refuse whatever it still sends meanwhile. So for this long the
 * instance fails /readyz but serves every request as usual, on its open
 * connections and on new ones, each answer saying `Connection: close` so that
 * kept-alive clients reconnect to an instance that stays; then it drains.
 * `skip` ends the wait early (a second signal of the same kind: Ctrl-C twice).
 */
export class DrainDelay {
  /** The performance.now() instant the drain begins, unless skipped before. */
  readonly drainsAt: number
  /** Resolves when the wait is over: at drainsAt, or at once on `skip`. */
  readonly over: Promise<void>
  private readonly skipped = new AbortController()
  private ended = false

  constructor(delayMs: number) {
    this.drainsAt = performance.now() + delayMs
    this.over = sleep(delayMs, undefined, { signal: this.skipped.signal })
      .catch(() => {})
      .then(() => void (this.ended = true))
  }

  /** Ends the wait now; returns how long was left of it (ms), 0 when it was over already. */
  skip(): number {
    if (this.ended || this.skipped.signal.aborted) return 0
    this.skipped.abort()
    return Math.max(0, this.drainsAt - performance.now())
  }
}

/**
 * The HTTP server as a component: it opens the port when started, last but
 * the event streams (src/service.ts), and stops first but them. Its stop is
 * the drain of a graceful stop, bounded by the deadline (SHUTDOWN_TIMEOUT
 * from the drain's start, which is the signal,
 * or SHUTDOWN_DELAY after it, src/service.ts):
 * - /readyz already answers 503 and new requests on open connections get 503
 *   shutting_down, every answer carrying `Connection: close`
 *   (`stopping.draining`, flipped before the components stop); the
 *   streams have ended (they never finish by themselves);
 * - the listening socket closes (new connections are refused) and idle
 *   keep-alive connections close at once;
 * - requests in flight finish; whatever still runs at the deadline is cut.
 * The components registered before it stop after it, in reverse order; the
 * pool last, within what is left of the deadline: postgres.js waits for
 * running statements, and without a time-out could wait forever for a
 * database that stopped answering (porsager/postgres#1097).
 */
export class HttpServerComponent implements Component {
  readonly name = 'http-server'
  private bindTo: { port: number; host: string; reusePort: boolean } | undefined

  constructor(
    private readonly server: AppServer,
    private readonly config: Pick<Config, 'shutdownTimeoutMs'>,
    private readonly log: Logger,
  ) {}

  /**
   * Where `start` listens; port 0 picks a free port. `reusePort`: a socket of
   * this process's own, one of several on the port (SO_REUSEPORT), among
   * which the kernel spreads new connections: a worker's (src/cluster/).
   */
  bind(port: number, host: string, { reusePort = false } = {}): void {
    this.bindTo = { port, host, reusePort }
  }

  get address(): AddressInfo {
    return this.server.address() as AddressInfo
  }

  start(): Promise<void> {
    const { server, bindTo } = this
    if (!bindTo) throw new Error('HttpServerComponent: bind(port, host) before start')
    return new Promise<void>((resolve, reject) => {
      server.once('error', reject)
      // Node's default backlog (511) drops connection attempts when a thousand clients connect at
      // once, and each dropped one waits 1 s, then 3 s, for its SYN to be sent again; the kernel
      // caps this at net.core.somaxconn.
      // `exclusive`: a cluster worker binds its own socket instead of asking the primary for one.
      const own = bindTo.reusePort ? { reusePort: true, exclusive: true } : {}
      server.listen({ port: bindTo.port, host: bindTo.host, backlog: LISTEN_BACKLOG, ...own }, () => {
        server.off('error', reject)
        resolve()
      })
    })
  }

  async stop(deadline: number): Promise<void> {
    const { server } = this
    // Its error, when the server never listened, is of no interest here.
    const closed = new Promise<unknown>((resolve) => server.close(resolve))
    server.closeIdleConnections()
    let cut = false
    const timer = setTimeout(
      () => {
        cut = true
        server.closeAllConnections()
      },
      Math.max(0, deadline - performance.now()),
    )
    await closed
    clearTimeout(timer)
    if (cut)
      this.log.warn('requests still running at SHUTDOWN_TIMEOUT were cut', {
        shutdown_timeout_s: this.config.shutdownTimeoutMs / 1000,
      })
  }
}
