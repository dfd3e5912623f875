import cluster from 'node:cluster'
import type { LogFields } from '../core/log.js'
import { withDeadline } from '../core/lib/settled-by.js'
import type { Metrics } from '../core/metrics.js'
import { isOurs, WORKER_SLOT_VARIABLE, type PrimaryMessage, type WorkerMessage } from './messages.js'
import { labelled } from './metrics.js'

// A worker's side of the cluster (src/cluster/primary.ts): its number, what it
// tells the primary, and its share of GET /metrics. Outside a worker
// (WORKERS=1) none of this exists: `workerLink()` is undefined.

/** How long a GET /metrics waits for the primary's collection before answering with this worker's figures alone. */
const METRICS_TIMEOUT_MS = 2000

export interface WorkerLink {
  /** This worker's number, 1 to WORKERS; its replacement gets the same. */
  readonly slot: number
  /** The fields of its log lines: `worker`. */
  readonly logFields: LogFields
  /** Its service has started: the primary counts it as up, and may ask for its figures. */
  listening(port: number, metrics: Metrics): void
  /**
   * The whole service's figures, collected by the primary (this worker's alone, labelled, when the primary does not
   * answer in time).
   */
  serviceMetrics(): Promise<string>
}

/**
 * Whether this process is a worker of src/cluster/primary.ts (not of another cluster, such as PM2's cluster mode, which
 * runs the service as a worker of its own).
 */
const isOurWorker = () => cluster.isWorker && process.env[WORKER_SLOT_VARIABLE] !== undefined

export function workerLink(): WorkerLink | undefined {
  if (!isOurWorker()) return undefined
  const slot = Number(process.env[WORKER_SLOT_VARIABLE])
  let metrics: Metrics | undefined
  const waiting = new Map<number, (text: string) => void>()
  let ids = 0
  process.on('message', (message: unknown) => {
    if (!isOurs(message)) return
    const m = message as PrimaryMessage
    if (m.upa === 'collect-metrics' && metrics) tell({ upa: 'metrics-part', id: m.id, text: metrics.render() })
    else if (m.upa === 'metrics') waiting.get(m.id)?.(m.text)
  })
  const alone = () =>
    metrics!
      .render()
      .split('\n')
      .map((line) => (line === '' || line.startsWith('#') ? line : labelled(line, slot)))
      .join('\n')
  return {
    slot,
    logFields: { worker: slot },
    listening(port, ofService) {
      metrics = ofService
      tell({ upa: 'listening', port })
    },
    serviceMetrics() {
      const id = ++ids
      const collected = new Promise<string>((resolve) => waiting.set(id, resolve))
      tell({ upa: 'metrics', id })
      return withDeadline(collected, METRICS_TIMEOUT_MS, alone).finally(() => waiting.delete(id))
    },
  }
}

/**
 * In a worker, tells the primary why start-up failed (resolves once sent, so the exit that follows does not lose it);
 * elsewhere nothing.
 */
export function reportCannotStart(reason: string): Promise<void> {
  if (!isOurWorker() || !process.connected) return Promise.resolve()
  return new Promise((resolve) =>
    process.send!({ upa: 'cannot-start', reason } satisfies WorkerMessage, undefined, undefined, () => resolve()),
  )
}

function tell(message: WorkerMessage): void {
  if (process.connected) process.send!(message, undefined, undefined, () => {})
}
