import cluster, { type Worker } from 'node:cluster'
import type { Logger } from '../core/log.js'
import { isOurs, WORKER_SLOT_VARIABLE, type PrimaryMessage, type WorkerMessage } from './messages.js'
import { mergeExpositions, workerRestarts } from './metrics.js'
import { RestartPolicy } from './restart-policy.js'

// WORKERS=N (N > 1): this process serves nothing itself. It has migrated the
// database (src/start.ts) and forks N workers, each of them the whole
// service as one process runs it (its own pool, caches, scheduler,
// components) on the one port:
// N instances on one database, which the service supports as it supports
// instances on several machines (docs/scaling.md).
//
// Each worker listens on a socket of its own on the port, with SO_REUSEPORT
// (src/cluster/reuse-port.ts); the port is claimed first, alone
// (src/claim-port.ts), so that a port already taken (by another copy of the
// service, say) stops the service before it migrates or forks, and port 0
// becomes one port for every worker. A worker that
// dies loses the connections it had and those waiting in its socket's accept
// queue (they are reset); new ones go to the others. docs/scaling.md, "WORKERS".

/**
 * Past SHUTDOWN_DELAY + SHUTDOWN_TIMEOUT, how long workers are given to stop (their pool's end, the exit) before they
 * are killed.
 */
const KILL_MARGIN_MS = 2000
/** How long a GET /metrics waits for the other workers' figures; a worker that has not answered by then is left out. */
const COLLECT_TIMEOUT_MS = 1000

/**
 * What the primary needs of the configuration (src/config.ts):
 * where to listen, how many workers, how long a stop may take.
 */
export interface PrimarySettings {
  host: string
  port: number
  workers: number
  shutdownDelayMs: number
  shutdownTimeoutMs: number
}

interface Slot {
  worker: Worker | undefined
  startedAt: number
  listened: boolean
  /** Why its start failed, as the worker said before exiting. */
  cannotStart?: string
  restart?: NodeJS.Timeout
}

/**
 * Runs the primary until a signal stops the service, or a worker that dies
 * before every worker has listened once stops its start; the process then
 * exits (0 on a signal, 1 otherwise). A worker that dies later is replaced
 * (src/cluster/restart-policy.ts), however often. `config.port` is one
 * claimed already (src/claim-port.ts): every worker is given it.
 */
export async function runPrimary(config: PrimarySettings, log: Logger, env: Record<string, string>): Promise<void> {
  const { port } = config
  const slots = new Map<number, Slot>()
  const slotOf = new Map<Worker, number>()
  const policy = new RestartPolicy()
  /** Replacements per slot since the service started: the primary's own figures (workerRestarts). */
  const restarts = new Map<number, number>()
  let up = false
  let stopping = false
  let exitCode = 0

  const fork = (slot: number) => {
    const worker = cluster.fork({ ...env, PORT: String(port), [WORKER_SLOT_VARIABLE]: String(slot) })
    slots.set(slot, { worker, startedAt: performance.now(), listened: false })
    slotOf.set(worker, slot)
    log.info('worker started', { worker: slot, pid: worker.process.pid })
  }

  const stop = (why: Record<string, unknown>, code: number) => {
    if (stopping) return
    stopping = true
    exitCode = code
    if (code === 0) log.info('shutting down', why)
    else log.error('stopping the service', why)
    for (const slot of slots.values()) clearTimeout(slot.restart)
    // Each worker runs its own drain (src/start.ts `serve`): the same path as a SIGTERM sent to it alone.
    for (const worker of live()) worker.process.kill('SIGTERM')
    setTimeout(
      () => {
        const left = live()
        if (left.length)
          log.warn('workers still running past SHUTDOWN_DELAY + SHUTDOWN_TIMEOUT were killed', {
            workers: left.map((w) => slotOf.get(w)),
            shutdown_delay_s: config.shutdownDelayMs / 1000,
            shutdown_timeout_s: config.shutdownTimeoutMs / 1000,
          })
        for (const worker of left) worker.process.kill('SIGKILL')
      },
      config.shutdownDelayMs + config.shutdownTimeoutMs + KILL_MARGIN_MS,
    ).unref()
    exitWhenAllGone()
  }
  const live = () => [...slots.values()].flatMap((s) => (s.worker && !s.worker.isDead() ? [s.worker] : []))
  const serving = () => [...slots.values()].some((s) => s.listened && s.worker && !s.worker.isDead())
  const exitWhenAllGone = () => {
    if (stopping && live().length === 0) {
      log.info('stopped', { exit_code: exitCode })
      process.exit(exitCode)
    }
  }

  cluster.on('exit', (worker, code, signal) => {
    const n = slotOf.get(worker)!
    const slot = slots.get(n)!
    slotOf.delete(worker)
    slot.worker = undefined
    if (stopping) {
      log.info('worker stopped', { worker: n, pid: worker.process.pid, code, signal })
      return exitWhenAllGone()
    }
    const died = { worker: n, pid: worker.process.pid, code, signal }
    if (!up)
      return stop(
        {
          ...died,
          reason:
            `worker ${n} exited before the service was ` +
            `up: ${slot.cannotStart ?? `code ${code}, signal ${signal}`}`,
        },
        1,
      )
    restarts.set(n, (restarts.get(n) ?? 0) + 1)
    const { replaceInMs, deathsInARow } = policy.onDeath(n, slot.startedAt, performance.now())
    log.error('worker died; replacing it', { ...died, deaths_in_a_row: deathsInARow, replace_in_ms: replaceInMs })
    // Said once per death that leaves the port without a worker: the process is up, and serves nothing until then.
    if (!serving()) log.error('no worker is serving; each is replaced as its delay ends', { workers: config.workers })
    slot.restart = setTimeout(() => fork(n), replaceInMs)
  })

  const collections = new Map<
    number,
    { parts: Array<{ worker: number; text: string }>; waiting: number; done(): void }
  >()
  let collectionIds = 0
  cluster.on('message', (worker, message: unknown) => {
    if (!isOurs(message)) return
    const n = slotOf.get(worker)
    if (n === undefined) return
    const m = message as WorkerMessage
    if (m.upa === 'listening') {
      slots.get(n)!.listened = true
      log.debug('worker listening', { worker: n, port: m.port })
      up ||= [...slots.values()].every((s) => s.listened)
      // At start, and again whenever a replacement makes the set whole.
      if (!stopping && slots.size === config.workers && [...slots.values()].every((s) => s.listened && s.worker))
        log.info('every worker is listening', { workers: config.workers, port: m.port })
    } else if (m.upa === 'cannot-start') {
      slots.get(n)!.cannotStart = m.reason
    } else if (m.upa === 'metrics') {
      const answer = (text: string) => !worker.isDead() && send(worker, { upa: 'metrics', id: m.id, text })
      collect((parts) =>
        answer(mergeExpositions(parts.sort((a, b) => a.worker - b.worker)) + workerRestarts(restarts, config.workers)),
      )
    } else if (m.upa === 'metrics-part') {
      const c = collections.get(m.id)
      if (!c) return
      c.parts.push({ worker: n, text: m.text })
      if (--c.waiting === 0) c.done()
    }
  })

  const collect = (then: (parts: Array<{ worker: number; text: string }>) => void) => {
    const id = ++collectionIds
    const asked = [...slots.entries()].flatMap(([, s]) =>
      s.listened && s.worker && !s.worker.isDead() ? [s.worker] : [],
    )
    const timer = setTimeout(() => done(), COLLECT_TIMEOUT_MS)
    const done = () => {
      clearTimeout(timer)
      const c = collections.get(id)
      if (!c) return
      collections.delete(id)
      then(c.parts)
    }
    collections.set(id, { parts: [], waiting: asked.length, done })
    for (const worker of asked) send(worker, { upa: 'collect-metrics', id })
  }

  let firstSignal: NodeJS.Signals | undefined
  const onSignal = (signal: NodeJS.Signals) => {
    // The same signal again (Ctrl-C twice) is passed on: each worker then ends its SHUTDOWN_DELAY (src/start.ts).
    if (stopping && signal === firstSignal) return void live().forEach((worker) => worker.process.kill('SIGTERM'))
    firstSignal ??= signal
    stop({ signal }, 0)
  }
  process.on('SIGTERM', onSignal)
  process.on('SIGINT', onSignal)
  log.info('starting workers', { workers: config.workers })
  for (let n = 1; n <= config.workers; n++) fork(n)
}

function send(worker: Worker, message: PrimaryMessage): void {
  // A worker that exits meanwhile closes its channel; its exit is handled where it is reported.
  if (worker.isConnected()) worker.send(message, () => {})
}
