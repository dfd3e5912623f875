import type { Sql } from 'postgres'
import type { Logger } from '../log.js'

// PLACEHOLDER, filled in by the SSE work: one reader of new events per
// instance, woken by NOTIFY on channel `events` (sql/007), fanning out to
// every connected GET /events/stream client.

export interface StreamSettings {
  /** How often an idle stream gets a comment line, so proxies do not close it. */
  heartbeatMs: number
  /** Streams this instance holds at most; the next one is refused with 503. */
  maxStreams: number
  /** Bytes a stream may have waiting to be sent; past this, the client is too slow and is disconnected. */
  bufferLimitBytes: number
}

export const defaultStreamSettings: StreamSettings = { heartbeatMs: 15_000, maxStreams: 2_000, bufferLimitBytes: 256 * 1024 }

export class EventHub {
  constructor(
    readonly sql: Sql,
    readonly log: Logger,
    readonly settings: StreamSettings,
  ) {}

  /** Starts listening for new events. */
  start(): void {}

  /** Ends every stream now (SIGTERM): each client gets a clean end of stream and resumes elsewhere. */
  closeAll(): void {}

  /** Ends every stream and stops listening. */
  async stop(): Promise<void> {}
}
