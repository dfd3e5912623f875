import { settledBy } from './lib/settled-by.js'
import type { Component } from './lifecycle.js'
import { describeError, type Logger } from './log.js'

// Work a request starts and does not wait for: its answer must not depend on
// the work, not even in how long it takes (a password-reset request, whose
// timing would otherwise tell whether an account has the address). The work
// runs after the answer, `concurrency` at a time; at most `capacity` are held
// at once (running and waiting), so that a flood becomes quick refusals
// rather than a backlog. A failure is logged with the work's name only:
// whatever the work was given (an address) stays out of the log. Held work
// lives in this process alone; stopping waits for it until the deadline.

export interface BackgroundWorkSettings {
  /** Pieces of work running at once. */
  concurrency: number
  /** Pieces of work held at once, running and waiting. */
  capacity: number
}

interface Piece {
  name: string
  run: () => Promise<unknown>
}

export class BackgroundWork implements Component {
  private readonly waiting: Piece[] = []
  private running = 0
  private stopping = false
  private idle: (() => void) | undefined

  constructor(
    readonly name: string,
    private readonly log: Logger,
    private readonly settings: BackgroundWorkSettings,
  ) {}

  /** Pieces held now, running and waiting. */
  get held(): number {
    return this.running + this.waiting.length
  }

  /** Takes the work, to run after the caller has answered; false when full or stopping (the caller answers busy). */
  submit(name: string, run: () => Promise<unknown>): boolean {
    if (this.stopping || this.held >= this.settings.capacity) return false
    this.waiting.push({ name, run })
    // Not before the caller's answer is on its way: the work's first statement would otherwise run in its turn.
    setImmediate(() => this.next())
    return true
  }

  start(): void {}

  /** Takes nothing new; waits for the work held until the deadline. What is left then is dropped, and logged. */
  async stop(deadline: number): Promise<void> {
    this.stopping = true
    if (this.held > 0) await settledBy(new Promise<void>((resolve) => (this.idle = resolve)), deadline)
    if (this.held > 0) {
      this.log.warn('background work dropped at shutdown', {
        component: this.name,
        running: this.running,
        waiting: this.waiting.length,
      })
      this.waiting.length = 0
    }
  }

  private next(): void {
    while (this.running < this.settings.concurrency) {
      const piece = this.waiting.shift()
      if (piece === undefined) break
      this.running++
      piece
        .run()
        .catch((err: unknown) =>
          this.log.warn('background work failed', { component: this.name, work: piece.name, ...describeError(err) }),
        )
        .finally(() => {
          this.running--
          this.next()
        })
    }
    if (this.held === 0) this.idle?.()
  }
}
