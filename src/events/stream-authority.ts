import type { Grant, GrantEnd } from '../auth/grants.js'
import { Periodic } from '../core/lib/periodic.js'
import { describeError, type Logger } from '../core/log.js'
import type { EventStream } from './stream.js'

// Whether each open stream may still be sent events (src/auth/grants.ts),
// checked in rounds: every open stream of the instance at once, every
// `intervalMs`, and before events are written (`roundSinceNow`). A stream whose
// grant no longer holds is ended with the reason.
//
// A round stamps each stream that passes with the time the round started
// (`checkedAt`). A round the hub asks for before writing events
// (`roundSinceNow`) first has the check catch up: wait until this instance
// has applied every credential change committed before the round began
// (service.ts: credentialChanges.caughtUp, one statement; at once when the
// instance checks against the database anyway). An event read from the
// database before the round began was committed before it too; a revocation
// committed before that event is then one the round's checks see. The hub
// writes an event to a stream only once the stream's stamp is later than the
// event's read, so no event committed after a revocation reaches the revoked
// stream, on any instance, however late its listener delivers. The rounds
// of the period, which only end streams, check what is remembered as it is,
// and cost no statement while it is trusted.
//
// A round that cannot check (the database is down) ends nothing and stamps
// nothing: events wait until a round succeeds.

/** `catchUp`: first wait until every credential change committed before the call has been applied. */
export type GrantCheck = (grants: readonly Grant[], options: { catchUp: boolean }) => Promise<Array<GrantEnd | undefined>>

export class StreamAuthority {
  private readonly rounds: Periodic<unknown>
  private failing = false
  /** A round was asked for to let events through: the next one catches up first. */
  private gating = false

  constructor(
    private readonly streams: ReadonlySet<EventStream>,
    private readonly check: GrantCheck,
    intervalMs: number,
    private readonly log: Logger,
  ) {
    this.rounds = new Periodic(() => this.round(), intervalMs)
  }

  start(): void {
    this.rounds.start()
  }

  stop(): Promise<void> {
    return this.rounds.stop()
  }

  /** Resolves after a round that started after this call; rejects with its error when it could not check. */
  async roundSinceNow(): Promise<void> {
    this.gating = true
    const failure = await this.rounds.runAnew()
    if (failure !== undefined) throw failure
  }

  /** One round; never rejects: resolves to the error that kept it from checking, or undefined. */
  private async round(): Promise<unknown> {
    const startedAt = performance.now()
    const catchUp = this.gating
    this.gating = false
    const streams = [...this.streams].filter((s) => !s.closed)
    if (streams.length === 0) return undefined
    try {
      const verdicts = await this.check(streams.map((s) => s.grant), { catchUp })
      streams.forEach((stream, i) => {
        const end = verdicts[i]
        if (end) stream.end(end)
        else stream.checkedAt = startedAt
      })
      if (this.failing) this.log.info('checking the authority of event streams works again')
      this.failing = false
      return undefined
    } catch (err) {
      // One warning per outage; streams are sent nothing meanwhile.
      if (!this.failing) this.log.warn('checking the authority of event streams failed; they are sent nothing until a check succeeds', describeError(err))
      this.failing = true
      return err
    }
  }
}
