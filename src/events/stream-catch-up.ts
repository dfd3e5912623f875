import type { Sql } from 'postgres'
import { describeError, type Logger } from '../core/log.js'
import type { EventReader } from './event-reader.js'
import { frameOf } from './event-reader.js'
import { sseRetry } from './sse.js'
import type { EventStream } from './stream.js'
import type { StreamAuthority } from './stream-authority.js'
import { catchUpPage, newestEventId } from './stream-reads.js'

// A new stream first catches up from the table at its own pace (paging,
// waiting for 'drain'), from its Last-Event-ID (or from the newest event
// when it has none), until the reader lets it join the fan-out
// (src/events/event-reader.ts). Events it reads are written once a check of
// its authority that started after the read has passed.

export interface CatchUp {
  sql: Sql
  log: Logger
  reader: EventReader
  authority: StreamAuthority
  pageSize: number
  retryMs: number
}

export interface CatchUpFrom {
  /** Resume after this event id; undefined: start with the events committed from now on. */
  after: number | undefined
  /** The event types wanted; every type when undefined. */
  types: ReadonlySet<string> | undefined
  /** Database admission (src/core/db/admission.ts), for the catch-up's statements. */
  bounded: <T>(work: () => Promise<T>) => Promise<T>
}

/**
 * Catches the stream up, then joins it to the fan-out. The stream's first
 * line, `retry:`, is written once its starting point is fixed: a client that
 * has seen it gets every event committed afterwards. Never rejects: a stream
 * that cannot catch up is ended, and its client resumes after `retry:`.
 */
export async function catchUpAndJoin(
  stream: EventStream,
  { after, types, bounded }: CatchUpFrom,
  c: CatchUp,
): Promise<void> {
  const typeList = types && [...types]
  try {
    let newest = after === undefined ? await bounded(() => newestEventId(c.sql)) : undefined
    let position = after ?? newest!
    stream.start(sseRetry(c.retryMs))
    for (;;) {
      if (stream.closed) return
      const joined = c.reader.join(stream, position, newest)
      if (joined === 'joined') return
      // The fan-out goes on writing what the reader read last: only to streams checked since.
      if (joined === 'unchecked') {
        await c.authority.roundSinceNow()
        continue
      }
      const page = await bounded(() => catchUpPage(c.sql, position, c.pageSize, typeList))
      if (page.events.length > 0) await c.authority.roundSinceNow()
      for (const row of page.events) {
        await stream.pace(frameOf(row))
        if (stream.closed) return
      }
      position = page.position
      newest = page.newest
    }
  } catch (err) {
    if (!stream.closed)
      c.log.warn('an event stream could not catch up; it is ended', {
        request_id: stream.requestId,
        ...describeError(err),
      })
    stream.end('database_error')
  }
}
