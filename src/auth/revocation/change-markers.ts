import { randomBytes } from 'node:crypto'
import type { Sql } from 'postgres'
import { withDeadline } from '../../core/lib/settled-by.js'

// The proof that a listening connection delivers: a marker notified on the
// channel through some connection must come back through the listening one.
// Notifications arrive in commit order, so a marker heard proves that every
// change committed before it was sent has been applied. Markers are
// `sync <this instance's prefix><n>`; every instance ignores the others'.

const MARKER = /^sync [A-Za-z0-9_-]{1,64}$/

export class ChangeMarkers {
  private readonly prefix = `sync ${randomBytes(6).toString('base64url')}-`
  private sent = 0
  private readonly waiting = new Map<string, () => void>()

  constructor(
    private readonly channel: string,
    private readonly timeoutMs: number,
  ) {}

  /** Whether the payload is a marker, of any instance. */
  isMarker(payload: string): boolean {
    return MARKER.test(payload)
  }

  /** A payload heard on the channel: true when it was one of ours (its sender, if still waiting, is told). */
  heard(payload: string): boolean {
    if (!payload.startsWith(this.prefix)) return false
    this.waiting.get(payload)?.()
    return true
  }

  /** Nobody need wait for a marker any more (the listening connection dropped): every wait ends as if heard. */
  releaseAll(): void {
    for (const release of this.waiting.values()) release()
  }

  /** Sends a marker through `db`; true when it came back within the time-out (or was released). */
  async roundTrip(db: Sql): Promise<boolean> {
    const marker = `${this.prefix}${++this.sent}`
    // Waited for from before the statement: the marker may arrive before the statement's own answer.
    const heard = new Promise<boolean>((resolve) => this.waiting.set(marker, () => resolve(true)))
    try {
      await db`SELECT pg_notify(${this.channel}, ${marker})`
      return await withDeadline(heard, this.timeoutMs, () => false)
    } finally {
      this.waiting.delete(marker)
    }
  }
}
