import type { ServerResponse } from 'node:http'
import { setImmediate as yieldToIo } from 'node:timers/promises'
import type { Sql } from 'postgres'
import type { Grant } from '../auth/grants.js'
import { HttpError } from '../core/http/problem.js'
import type { StreamBody } from '../core/http/route.js'
import { describeError, type Logger } from '../core/log.js'
import { eventSerializer } from './feed.js'
import { SSE_CONTENT_TYPE, sseEvent, sseRetry } from './sse.js'
import { EventStream } from './stream.js'
import { StreamAuthority, type GrantCheck } from './stream-authority.js'
import { catchUpPage, eventsAfter, newestEventId, type FeedRow } from './stream-reads.js'

// One reader of new events per instance, however many clients follow
// GET /events/stream. It reads only while a stream is open: woken by the
// NOTIFY every event's commit sends on EVENTS_CHANNEL (sql/007), by the
// listening connection coming back (notifications sent while it was away
// are lost), and by a poll every `pollMs`, so a lost notification delays
// events by that much at most. Reads are coalesced: one at a time, and one
// more if woken meanwhile. Each event is written as SSE text once and that
// same string is handed to every stream that wants it.
//
// `head` is the id up to which the reader has fanned out. A new stream first
// catches up from the table at its own pace (paging, waiting for 'drain'),
// from its Last-Event-ID (or from the newest event when it has none), until
// its position reaches `head`; the check and the joining of the fan-out are
// one synchronous step, so an event is either at or below the position
// (sent by the catch-up, or passed over as another type) or above the head
// (fanned out after the join), never neither; one in both (the catch-up read
// past the head) is skipped by the stream's position (EventStream.deliver).
//
// A stream lives no longer than the authority it was opened with
// (src/events/stream-authority.ts): events read from the table, by the
// reader or a catch-up, are written to a stream only once a check of its
// authority that started after the read has passed, and the stream joins
// the fan-out only once it was checked after the reader's last read.

export const EVENTS_CHANNEL = 'events'

export interface StreamSettings {
  /** How often an idle stream gets a comment line, so proxies do not close it. */
  heartbeatMs: number
  /** Streams this instance holds at most; the next one is refused with 503. */
  maxStreams: number
  /** Bytes a stream may have waiting to be sent; past this, the client is too slow and is disconnected. */
  bufferLimitBytes: number
  /** How often new events are read while streams are open, notification or not. */
  pollMs: number
  /** Events per read, the reader's and each catch-up's. */
  pageSize: number
  /** The `retry:` a stream starts with: how long a client waits before it reconnects. */
  retryMs: number
  /** How often every open stream's authority is checked when no event is read meanwhile (each read checks it too). */
  authorityCheckMs: number
}

export const defaultStreamSettings: StreamSettings = {
  heartbeatMs: 15_000,
  maxStreams: 2_000,
  bufferLimitBytes: 256 * 1024,
  pollMs: 1000,
  pageSize: 200,
  retryMs: 2000,
  authorityCheckMs: 500,
}

/** Seconds a client refused for the stream limit is asked to wait. */
const FULL_RETRY_AFTER_S = '5'

export interface StreamRequest {
  /** Resume after this event id; undefined: start with the events committed from now on. */
  after: number | undefined
  /** The event types wanted; every type when undefined. */
  types: ReadonlySet<string> | undefined
  requestId: string
  /** The bound on waiting for the database (src/core/db/admission.ts), for the catch-up's statements. */
  bounded: <T>(work: () => Promise<T>) => Promise<T>
  /** The authority the stream is opened with, held only while it holds. */
  grant: Grant
}

export class EventHub {
  private readonly streams = new Set<EventStream>()
  /** The streams in the fan-out: caught up. */
  private readonly live = new Set<EventStream>()
  /** Places given by `reserve` to streams not started yet: they count against the limit. */
  private reserved = 0
  /** Every event up to this id has been fanned out; undefined until a stream sets it after a time with none. */
  private head: number | undefined
  /** Changes whenever the last stream leaves, so a read started before cannot set the head after. */
  private epoch = 0
  private reading: Promise<void> | undefined
  private wokenWhileReading = false
  private failing = false
  private listening = false
  private timers: NodeJS.Timeout[] = []
  /** SIGTERM: no stream starts any more. */
  private closing = false
  private stopped = false
  /** When the reader's last read of events ended (performance.now()): a stream joins the fan-out once checked since. */
  private readAt = -Infinity
  private readonly authority: StreamAuthority

  constructor(
    readonly sql: Sql,
    /** Where it listens: a session (AppDeps.listenSql), not a transaction pooler's connection. */
    readonly listenSql: Sql,
    readonly log: Logger,
    readonly settings: StreamSettings,
    /** Whether the streams' grants still hold (src/auth/grants.ts). */
    check: GrantCheck,
  ) {
    this.authority = new StreamAuthority(this.streams, check, settings.authorityCheckMs, log)
  }

  /** Streams open or about to be. */
  get size(): number {
    return this.streams.size + this.reserved
  }

  /**
   * Starts the checks of the streams' authority (nothing to check, and no
   * statement, while none is open). The hub listens when its first stream
   * opens, so that an instance serving none is not woken by every commit of
   * the cluster.
   */
  start(): void {
    this.authority.start()
  }

  /** Listens on EVENTS_CHANNEL, from the first stream on, for good (postgres.js listens again after a reconnection). */
  private listen(): void {
    this.listening = true
    const wake = () => this.wake()
    // A failed first attempt: postgres.js goes on trying and calls the second `wake` when it listens.
    this.listenSql.listen(EVENTS_CHANNEL, wake, wake).catch((err: unknown) => {
      if (!this.stopped) this.log.warn('cannot listen for events yet; streams read them every poll meanwhile', describeError(err))
    })
  }

  /**
   * A stream's place, taken when its request is answered: 503 when the
   * instance holds its maximum. The place is the stream's once the answer's
   * head is written, or given back if it never is.
   */
  reserve(request: StreamRequest): StreamBody {
    if (this.closing || this.size >= this.settings.maxStreams) {
      throw new HttpError('too_many_streams', `This instance serves its maximum of ${this.settings.maxStreams} event streams; retry later, or on another instance.`, {
        headers: { 'retry-after': FULL_RETRY_AFTER_S },
      })
    }
    this.reserved++
    let taken = false
    const take = (): boolean => {
      if (taken) return false
      taken = true
      this.reserved--
      return true
    }
    return {
      contentType: SSE_CONTENT_TYPE,
      start: (res) => {
        if (take()) this.open(res, request)
      },
      cancel: () => void take(),
    }
  }

  /** Ends every stream now (SIGTERM): each client gets a clean end of stream and resumes elsewhere. */
  closeAll(): void {
    this.closing = true
    for (const stream of this.streams) stream.end('shutdown')
  }

  /** Ends every stream and stops reading. The listening connection closes with the pool: an UNLISTEN sent to a database that stopped answering could wait forever. */
  async stop(): Promise<void> {
    this.closeAll()
    this.stopped = true
    this.stopTimers()
    await Promise.all([this.reading, this.authority.stop()])
  }

  private open(res: ServerResponse, request: StreamRequest): void {
    const stream = new EventStream(res, request.requestId, request.types, request.grant, this.settings.bufferLimitBytes)
    if (!this.listening) this.listen()
    if (this.streams.size === 0) this.startTimers()
    this.streams.add(stream)
    res.once('close', () => this.remove(stream))
    if (this.closing) return stream.end('shutdown')
    void this.join(stream, request)
  }

  /**
   * Catches the stream up from the table, then joins it to the fan-out (see
   * the top of this file). The stream's first line, `retry:`, is written
   * once its starting point is fixed: a client that has seen it gets every
   * event committed afterwards.
   */
  private async join(stream: EventStream, { after, types, bounded }: StreamRequest): Promise<void> {
    const typeList = types && [...types]
    try {
      let newest = after === undefined ? await bounded(() => newestEventId(this.sql)) : undefined
      let position = after ?? newest!
      stream.start(sseRetry(this.settings.retryMs))
      for (;;) {
        if (stream.closed) return
        if (this.caughtUp(position, newest)) {
          // The fan-out goes on writing what the reader read last: only to streams checked since.
          if (stream.checkedAt < this.readAt) {
            await this.authority.roundSinceNow()
            continue
          }
          stream.position = position
          this.live.add(stream)
          return
        }
        const page = await bounded(() => catchUpPage(this.sql, position, this.settings.pageSize, typeList))
        if (page.events.length > 0) await this.authority.roundSinceNow()
        for (const row of page.events) {
          await stream.pace(this.frameOf(row))
          if (stream.closed) return
        }
        position = page.position
        newest = page.newest
      }
    } catch (err) {
      // The client reconnects after `retry:` and resumes from the last event it got.
      if (!stream.closed) this.log.warn('an event stream could not catch up; it is ended', { request_id: stream.requestId, ...describeError(err) })
      stream.end('database_error')
    }
  }

  /**
   * Whether a stream at `position` may join the fan-out, `newest` being the
   * newest committed id its last read saw. With no head (no stream was open),
   * the first stream to have read up to a newest id sets the head there: not
   * at its own position, which may be an id resumed from that does not exist
   * yet, and which the reader would then jump over for everyone.
   */
  private caughtUp(position: number, newest: number | undefined): boolean {
    if (this.head === undefined && newest !== undefined && position >= newest) this.head = newest
    return this.head !== undefined && position >= this.head
  }

  private remove(stream: EventStream): void {
    if (!this.streams.delete(stream)) return
    this.live.delete(stream)
    this.log.info('event stream closed', {
      request_id: stream.requestId,
      user_id: stream.grant.principal.userId,
      reason: stream.ended ?? 'client_closed',
      events: stream.sent,
      duration_ms: Math.round(performance.now() - stream.opened),
    })
    if (this.streams.size > 0) return
    this.stopTimers()
    // Nothing is read with no stream open, so the head goes stale: the next stream sets it anew.
    this.head = undefined
    this.epoch++
  }

  private wake(): void {
    if (this.stopped || this.streams.size === 0) return
    if (this.reading) this.wokenWhileReading = true
    else this.reading = this.readAll()
  }

  private async readAll(): Promise<void> {
    try {
      do {
        this.wokenWhileReading = false
        while (await this.readOnce());
      } while (this.wokenWhileReading)
      if (this.failing) this.log.info('reading new events works again')
      this.failing = false
    } catch (err) {
      // The next poll tries again; one warning per outage.
      if (!this.failing && !this.stopped) this.log.warn('reading new events failed; streams wait for the next poll', describeError(err))
      this.failing = true
    } finally {
      this.reading = undefined
    }
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
    if (head === undefined || this.streams.size === 0 || this.stopped) return false
    const rows = await eventsAfter(this.sql, head, this.settings.pageSize)
    if (rows.length > 0) await this.authorized((this.readAt = performance.now()))
    const share = this.settings.bufferLimitBytes / 4
    let written = 0
    for (const row of rows) {
      if (epoch !== this.epoch) return false
      const frame = this.frameOf(row)
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

  private frameOf(row: FeedRow): string {
    return sseEvent(row.id, row.type, eventSerializer.one(row as unknown as Record<string, unknown>))
  }

  private startTimers(): void {
    const every = (ms: number, fn: () => void) => this.timers.push(setInterval(fn, ms).unref())
    every(this.settings.pollMs, () => this.wake())
    every(this.settings.heartbeatMs, () => {
      for (const stream of this.streams) stream.beat()
    })
  }

  private stopTimers(): void {
    for (const timer of this.timers) clearInterval(timer)
    this.timers = []
  }
}
