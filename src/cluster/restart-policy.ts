// When the primary replaces a worker that died, and when it gives up.
//
// A worker that died is replaced after a delay that doubles with each death
// of its slot in a row (100 ms, 200 ms, … 10 s), so a worker that cannot
// start does not spin the machine; the streak ends once a worker of the slot
// has stayed up STABLE_AFTER_MS. But replacing is only worth it while deaths
// are rare: LOOP_DEATHS deaths, any slots, within LOOP_WINDOW_MS is a crash
// loop (a bug hit by every request of some kind, a database that refuses the
// workers), and the whole service stops, for its supervisor to see and
// report, rather than serve on in a state nobody watches. A worker that dies
// before the service was ever up (a port in use, a bad certificate) stops it
// at once: its replacement would meet the same.

export const FIRST_DELAY_MS = 100
export const MAX_DELAY_MS = 10_000
export const STABLE_AFTER_MS = 30_000
export const LOOP_DEATHS = 5
export const LOOP_WINDOW_MS = 60_000

export type Verdict = { replaceInMs: number } | { stop: string }

export class RestartPolicy {
  private readonly deaths: number[] = []
  /** Deaths in a row per slot, each of a worker that lived less than STABLE_AFTER_MS. */
  private readonly streaks = new Map<number, number>()

  /** A worker of `slot`, started at `startedAt`, died at `now` (ms, one clock): replace it after a delay, or stop. */
  onDeath(slot: number, startedAt: number, now: number): Verdict {
    this.deaths.push(now)
    while (this.deaths[0]! <= now - LOOP_WINDOW_MS) this.deaths.shift()
    if (this.deaths.length >= LOOP_DEATHS)
      return { stop: `${this.deaths.length} workers died within ${LOOP_WINDOW_MS / 1000} s: a crash loop` }
    const streak = now - startedAt >= STABLE_AFTER_MS ? 0 : (this.streaks.get(slot) ?? 0)
    this.streaks.set(slot, streak + 1)
    return { replaceInMs: Math.min(MAX_DELAY_MS, FIRST_DELAY_MS * 2 ** streak) }
  }
}
