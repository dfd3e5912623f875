// What the primary and its workers tell each other over the cluster's IPC
// channel (src/cluster/primary.ts, src/cluster/worker.ts). Node's own cluster
// messages carry `cmd: 'NODE_CLUSTER'`; these carry `upa`.

/** The variable that gives a worker its number (1 to WORKERS), which its replacement keeps. */
export const WORKER_SLOT_VARIABLE = 'UPA_WORKER_SLOT'

export type WorkerMessage =
  /** The service of this worker started: every component, the port included. */
  | { upa: 'listening'; port: number }
  /** Start-up failed (the message written to stderr): the primary's reason to stop the service. */
  | { upa: 'cannot-start'; reason: string }
  /** GET /metrics: the whole service's figures, please. */
  | { upa: 'metrics'; id: number }
  /** This worker's figures, for the collection `id`. */
  | { upa: 'metrics-part'; id: number; text: string }

export type PrimaryMessage =
  /** Send your figures for collection `id`. */
  | { upa: 'collect-metrics'; id: number }
  /** The whole service's figures, the answer to a worker's `metrics` request `id`. */
  | { upa: 'metrics'; id: number; text: string }

export const isOurs = (message: unknown): message is { upa: string } =>
  typeof message === 'object' && message !== null && typeof (message as { upa?: unknown }).upa === 'string'
