import { latencies, type Outcome } from '../../test/fault-kit.js'

// The cells of the fault benchmark's tables: times in whole milliseconds,
// counts as they are, and what a set of answers took.

/** Milliseconds, rounded; a dash for nothing measured. */
export const ms = (x: number | undefined): string =>
  x === undefined || !Number.isFinite(x) ? '–' : String(Math.round(x))

/** Answers per second over `spanMs`. */
export const perSecond = (count: number, spanMs: number): string =>
  spanMs > 0 ? String(Math.round((count * 1000) / spanMs)) : '–'

/** How many, p50, p99 and max (ms) of the time each of `outcomes` took. */
export function latencyCells(outcomes: ReadonlyArray<Pick<Outcome, 'started' | 'ended'>>): string[] {
  const l = latencies(outcomes)
  return [String(l.count), ms(l.p50), ms(l.p99), ms(l.max)]
}
