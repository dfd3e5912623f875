import type { Grant, GrantEnd } from '../auth/grants.js'
import { Job } from '../core/scheduler.js'
import type { EventStream } from './stream.js'

// Whether each open stream may still be sent events (src/auth/grants.ts),
// checked in rounds (job `events.stream-authority`): every open stream of
// the instance at once, every `intervalMs`, and before events are written
// (`roundSinceNow`). A stream whose grant no
// longer holds is ended with the reason.
//
// A round stamps each stream that passes with the time the round started
// (`checkedAt`). A round asked for before writing events
// (`roundSinceNow`) first has the check catch up: wait until this instance
// has applied every credential change committed before the round began
// (service.ts: credentialChanges.caughtUp, one statement; at once when the
// instance checks against the database anyway). An event read from the
// database before the round began was committed before it too; a revocation
// committed before that event is then one the round's checks see. The reader
// and the catch-up (src/events/event-reader.ts, stream-catch-up.ts) write an
// event to a stream only once the stream's stamp is later than the
// event's read, so no event committed after a revocation reaches the revoked
// stream, on any instance, however late its listener delivers. The rounds
// of the period, which only end streams, check what is remembered as it is,
// and cost no statement while it is trusted.
//
// A round that cannot check (the database is down) ends nothing and stamps
// nothing: events wait until a round succeeds (the scheduler logs the failure).

/** `catchUp`: first wait until every credential change committed before the call has been applied. */
export type GrantCheck = (
  grants: readonly Grant[],
  options: { catchUp: boolean },
) => Promise<Array<GrantEnd | undefined>>

export class StreamAuthority {
  private readonly rounds: Job<void>
  /** Its repeating jobs, which run once the composition root adds them to the scheduler (src/service.ts). */
  readonly jobs: readonly Job<unknown>[]
  /** A round was asked for to let events through: the next one catches up first. */
  private gating = false

  constructor(
    private readonly streams: ReadonlySet<EventStream>,
    private readonly check: GrantCheck,
    intervalMs: number,
  ) {
    this.rounds = new Job({ name: 'events.stream-authority', periodMs: intervalMs, run: () => this.round() })
    this.jobs = [this.rounds]
  }

  /** Resolves after a round that started after this call; rejects with its error when it could not check. */
  roundSinceNow(): Promise<void> {
    this.gating = true
    return this.rounds.runAnew()
  }

  /** One round: every open stream checked at once; rejects when it could not check. */
  private async round(): Promise<void> {
    const startedAt = performance.now()
    const catchUp = this.gating
    this.gating = false
    const streams = [...this.streams].filter((s) => !s.closed)
    if (streams.length === 0) return
    const verdicts = await this.check(
      streams.map((s) => s.grant),
      { catchUp },
    )
    streams.forEach((stream, i) => {
      const end = verdicts[i]
      if (end) stream.end(end)
      else stream.checkedAt = startedAt
    })
  }
}
