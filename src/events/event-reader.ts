import { setImmediate as yieldToIo } from 'node:timers/promises'
import type { Sql } from 'postgres'
import type { Component } from '../core/lifecycle.js'
import { describeError, type Logger } from '../core/log.js'
import { Job } from '../core/scheduler.js'
import { eventSerializer } from './feed.js'
import { sseEvent } from './sse.js'
import type { EventStream } from './stream.js'
import type { StreamAuthority } from './stream-authority.js'
import { eventsAfter, type FeedRow } from './stream-reads.js'

// The one reader of new events per instance, and its fan-out to the streams
// that have caught up (`live`). It reads (job `events.read`) only while a
// stream is open: woken by the NOTIFY every event's commit sends on
// EVENTS_CHANNEL (sql/007), by the listening connection coming back
// (notifications sent while it was away are lost), and by its period, so a
// lost notification delays events by that much at most. Each event is
// written as SSE text once and that same string is handed to every stream
// that wants it.
//
// `head` is the id up to which the reader has fanned out. A stream joins
// the fan-out (`join`) once its catch-up (src/events/stream-catch-up.ts) has
// reached the head: the check and the joining are one synchronous step, so
// an event is either at or below the stream's position (sent by the
// catch-up, or passed over as another type) or above the head (fanned out
// after the join), never neither; one in both is skipped by the stream's
// position (EventStream.deliver).
//
// Events read are written to the live streams only once each has passed a
// check of its authority (src/events/stream-authority.ts) that started after
// the read, and a stream joins only once checked since the last read.

export const EVENTS_CHANNEL = 'events'

export interface ReaderSettings {
  /** How often new events are read while streams are open, notification or not. */
  pollMs: number
  /** Events per read, the reader's and each catch-up's. */
  pageSize: number
  /** Bytes a stream may have waiting to be sent (a quarter of it is written between two turns of the event loop). */
  bufferLimitBytes: number
}

/** Reads per run of `events.read` at most; a run that took them all is followed by another at once. */
const PAGES_PER_RUN = 10

/** An event as every stream is sent it. */
export const frameOf = (row: FeedRow): string =>
  sseEvent(row.id, row.type, eventSerializer.one(row as unknown as Record<string, unknown>))

export type JoinOutcome = 'joined' | 'behind' | 'unchecked'

export class EventReader implements Component {
  readonly name = 'event-reader'
  private readonly live = new Set<EventStream>()
  /** Every event up to this id has been fanned out; undefined until a stream sets it after a time with none open. */
  private head: number | undefined
  /** Changes whenever the last stream leaves, so a read started before cannot set the head after. */
  private epoch = 0
  /** When the last read of events ended (performance.now()): a stream joins the fan-out once checked since. */
  private readAt = -Infinity
  private stopped = false
  private readonly reads: Job<void>
  /** Its repeating jobs, which run once the composition root adds them to the scheduler (src/service.ts). */
  readonly jobs: readonly Job<unknown>[]

  constructor(
    private readonly sql: Sql,
    /** Where it listens: a session (AppDeps.listenSql), not a transaction pooler's connection. */
    private readonly listenSql: Sql,
    private readonly log: Logger,
    private readonly settings: ReaderSettings,
    private readonly authority: StreamAuthority,
    /** Whether any stream is open: without one nothing is read. */
    private readonly streamsOpen: () => boolean,
  ) {
    this.reads = new Job({ name: 'events.read', periodMs: settings.pollMs, run: () => this.read() })
    this.jobs = [this.reads]
  }

  /** Listens on EVENTS_CHANNEL (postgres.js listens again after a reconnection, and calls the second `wake`). */
  start(): void {
    const wake = () => this.wake()
    this.listenSql.listen(EVENTS_CHANNEL, wake, wake).catch((err: unknown) => {
      if (!this.stopped)
        this.log.warn('cannot listen for events yet; streams read them every poll meanwhile', describeError(err))
    })
  }

  /**
   * The listening connection closes with the pool: an UNLISTEN sent
   * to a database that stopped answering could wait forever.
   */
  stop(): void {
    this.stopped = true
  }

  /** Reads new events now, or once the read under way has ended. */
  wake(): void {
    if (!this.stopped && this.streamsOpen()) this.reads.trigger()
  }

  /**
   * Joins the stream to the fan-out if it has caught up: `position` is how
   * far it has considered events, `newest` the newest committed id its last
   * read saw. With no head (no stream was open), the first stream to have
   * read up to a newest id sets the head there: not at its own position,
   * which may be an id resumed from that does not exist yet, and which the
   * reader would then jump over for everyone. `unchecked`: caught up, but
   * not checked since the reader's last read (run a round, then try again).
   */
  join(stream: EventStream, position: number, newest: number | undefined): JoinOutcome {
    if (this.head === undefined && newest !== undefined && position >= newest) this.head = newest
    if (this.head === undefined || position < this.head) return 'behind'
    if (stream.checkedAt < this.readAt) return 'unchecked'
    stream.position = position
    this.live.add(stream)
    return 'joined'
  }

  leave(stream: EventStream): void {
    this.live.delete(stream)
  }

  /** No stream is open: nothing is read, so the head goes stale; the next stream sets it anew. */
  forgetHead(): void {
    this.head = undefined
    this.epoch++
  }

  private async read(): Promise<void> {
    for (let page = 0; page < PAGES_PER_RUN; page++) {
      if (!(await this.readOnce())) return
    }
    this.reads.trigger()
  }

  /**
   * One read and its fan-out; true when there may be more to read. Between
   * events worth a quarter of a stream's buffer bound, the loop lets Node
   * write to the sockets (and clients read), so that a burst larger than
   * the bound cuts only the clients that do not take it, not every client
   * for want of a turn. Each event reaches every live stream before the
   * head moves past it, so a stream that joins in between misses nothing.
   */
  private async readOnce(): Promise<boolean> {
    const { head, epoch } = this
    if (head === undefined || !this.streamsOpen() || this.stopped) return false
    const rows = await eventsAfter(this.sql, head, this.settings.pageSize)
    if (rows.length > 0) await this.authorized((this.readAt = performance.now()))
    const share = this.settings.bufferLimitBytes / 4
    let written = 0
    for (const row of rows) {
      if (epoch !== this.epoch) return false
      const frame = frameOf(row)
      for (const stream of this.live) stream.deliver(row.id, row.type, frame)
      this.head = row.id
      written += frame.length
      if (written >= share) {
        written = 0
        await yieldToIo()
      }
    }
    return rows.length === this.settings.pageSize
  }

  /** Once every live stream has passed a check of its authority that started at `readAt` or later. */
  private async authorized(readAt: number): Promise<void> {
    const unchecked = () => {
      for (const stream of this.live) if (!stream.closed && stream.checkedAt < readAt) return true
      return false
    }
    while (unchecked()) await this.authority.roundSinceNow()
  }
}
