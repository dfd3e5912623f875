import type { ServerResponse } from 'node:http'
import type { Sql } from 'postgres'
import type { Grant } from '../auth/grants.js'
import type { Component } from '../core/lifecycle.js'
import { HttpError } from '../core/http/problem.js'
import type { StreamBody } from '../core/http/route.js'
import type { Logger } from '../core/log.js'
import { Job } from '../core/scheduler.js'
import { EventReader, type ReaderSettings } from './event-reader.js'
import { SSE_CONTENT_TYPE } from './sse.js'
import { EventStream } from './stream.js'
import { StreamAuthority, type GrantCheck } from './stream-authority.js'
import { catchUpAndJoin, type CatchUp, type CatchUpFrom } from './stream-catch-up.js'

// The open GET /events/stream responses of an instance: their places (at
// most `maxStreams`), their heartbeat (job `events.stream-heartbeat`), and
// their end. Each catches up on its own (src/events/stream-catch-up.ts),
// then is fed by the instance's one reader (src/events/event-reader.ts); a
// stream lives no longer than the authority it was
// opened with (src/events/stream-authority.ts).
//
// As a component it stops before the HTTP server drains: streams never
// finish by themselves, so they end first, cleanly, and their clients
// resume on another instance. The reader is a component of its own
// (`reader`), registered before the scheduler.

export interface StreamSettings extends ReaderSettings {
  /** How often an idle stream gets a comment line, so proxies do not close it. */
  heartbeatMs: number
  /** Streams this instance holds at most; the next one is refused with 503. */
  maxStreams: number
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

export interface StreamRequest extends CatchUpFrom {
  requestId: string
  /** The authority the stream is opened with, held only while it holds. */
  grant: Grant
}

export class EventHub implements Component {
  readonly name = 'event-streams'
  /** Reads new events for the streams; a component of its own. */
  readonly reader: EventReader
  private readonly streams = new Set<EventStream>()
  /** Places given by `reserve` to streams not started yet: they count against the limit. */
  private reserved = 0
  /** The service stops: no stream starts any more. */
  private closing = false
  private readonly catchUp: CatchUp
  /**
   * Its repeating jobs and its reader's, which run once the composition
   * root adds them to the scheduler (src/service.ts).
   */
  readonly jobs: readonly Job<unknown>[]

  constructor(
    sql: Sql,
    /** Where the reader listens: a session (AppDeps.listenSql), not a transaction pooler's connection. */
    listenSql: Sql,
    private readonly log: Logger,
    readonly settings: StreamSettings,
    /** Whether the streams' grants still hold (src/auth/grants.ts). */
    check: GrantCheck,
  ) {
    const authority = new StreamAuthority(this.streams, check, settings.authorityCheckMs)
    this.reader = new EventReader(sql, listenSql, log, settings, authority, () => this.streams.size > 0)
    this.catchUp = { sql, log, reader: this.reader, authority, pageSize: settings.pageSize, retryMs: settings.retryMs }
    const heartbeat = new Job({
      name: 'events.stream-heartbeat',
      periodMs: settings.heartbeatMs,
      run: async () => {
        for (const stream of this.streams) stream.beat()
      },
    })
    this.jobs = [...this.reader.jobs, ...authority.jobs, heartbeat]
  }

  /** Streams open or about to be. */
  get size(): number {
    return this.streams.size + this.reserved
  }

  start(): void {
    this.closing = false
  }

  /** Ends every stream now: each client gets a clean end of stream and resumes elsewhere. */
  stop(): void {
    this.closing = true
    for (const stream of this.streams) stream.end('shutdown')
  }

  /**
   * A stream's place, taken when its request is answered: 503 when the
   * instance holds its maximum. The place is the stream's once the answer's
   * head is written, or given back if it never is.
   */
  reserve(request: StreamRequest): StreamBody {
    if (this.closing || this.size >= this.settings.maxStreams) {
      throw new HttpError(
        'too_many_streams',
        `This instance serves its maximum ` +
          `of ${this.settings.maxStreams} event streams; retry later, or on another instance.`,
        {
          headers: { 'retry-after': FULL_RETRY_AFTER_S },
        },
      )
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

  private open(res: ServerResponse, request: StreamRequest): void {
    const stream = new EventStream(res, request.requestId, request.types, request.grant, this.settings.bufferLimitBytes)
    this.streams.add(stream)
    res.once('close', () => this.remove(stream))
    if (this.closing) return stream.end('shutdown')
    // The stream's own work: it ends with the stream, which the hub's stop ends.
    void catchUpAndJoin(stream, request, this.catchUp)
  }

  private remove(stream: EventStream): void {
    if (!this.streams.delete(stream)) return
    this.reader.leave(stream)
    this.log.info('event stream closed', {
      request_id: stream.requestId,
      user_id: stream.grant.principal.userId,
      reason: stream.ended ?? 'client_closed',
      events: stream.sent,
      duration_ms: Math.round(performance.now() - stream.opened),
    })
    if (this.streams.size === 0) this.reader.forgetHead()
  }
}
