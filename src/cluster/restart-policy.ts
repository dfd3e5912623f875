// When the primary replaces a worker that died: always, after a delay of its
// slot's own. The delay doubles with each death of the slot in a row (100 ms,
// 200 ms, … up to 60 s), so a worker that cannot stay up does not spin the
// machine, and a worker that died once is back at once; the streak ends once
// a worker of the slot has stayed up STABLE_AFTER_MS. Deaths never stop the
// service once it is up: a crash a client can cause (a bug hit by some
// request) would otherwise be one it can turn into an outage, by repeating
// it; the other slots serve on while one is down. A worker that dies before
// the service was ever up (a port in use, a bad certificate) stops it
// (src/cluster/primary.ts): its replacement would meet the same.

export const FIRST_DELAY_MS = 100
export const MAX_DELAY_MS = 60_000
export const STABLE_AFTER_MS = 30_000

export interface Replacement {
  /** How long to wait before forking the slot's next worker. */
  replaceInMs: number
  /** Deaths of the slot in a row, this one included (1 after a worker that had stayed up). */
  deathsInARow: number
}

export class RestartPolicy {
  /** Deaths in a row per slot, each of a worker that lived less than STABLE_AFTER_MS. */
  private readonly streaks = new Map<number, number>()

  /** A worker of `slot`, started at `startedAt`, died at `now` (ms, one clock): when to replace it. */
  onDeath(slot: number, startedAt: number, now: number): Replacement {
    const before = now - startedAt >= STABLE_AFTER_MS ? 0 : (this.streaks.get(slot) ?? 0)
    this.streaks.set(slot, before + 1)
    // The exponent is bounded: past the cap the delay is the cap, however long the streak.
    return { replaceInMs: Math.min(MAX_DELAY_MS, FIRST_DELAY_MS * 2 ** Math.min(before, 20)), deathsInARow: before + 1 }
  }
}
