import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { dirname } from 'node:path'

// The order files start in. With a few lanes the run lasts at least as long as its longest file, and
// longer when that file starts late: so the longest start first, by the seconds each took last time
// (kept in an ignored file). A file never timed may be long, so those start before all others.

export type Timings = Record<string, number>

export function readTimings(path: string): Timings {
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as Timings
  } catch {
    return {}
  }
}

/** Keeps what `path` held for files not run this time. */
export function saveTimings(path: string, measured: Timings): void {
  const timings = { ...readTimings(path), ...measured }
  const sorted = Object.fromEntries(Object.entries(timings).sort(([a], [b]) => a.localeCompare(b)))
  mkdirSync(dirname(path), { recursive: true })
  writeFileSync(path, JSON.stringify(sorted, null, 2) + '\n')
}

export function longestFirst(files: string[], timings: Timings): string[] {
  const unknown = files.filter((f) => timings[f] === undefined).sort()
  const known = files.filter((f) => timings[f] !== undefined)
  known.sort((a, b) => timings[b]! - timings[a]! || a.localeCompare(b))
  return [...unknown, ...known]
}

/** Calls `work` on every item, `lanes` at a time, in order; once `signal` aborts, no further item starts. */
export async function inLanes<T, R>(
  items: T[],
  lanes: number,
  signal: AbortSignal,
  /** `index`: the item's place in `items`. */
  work: (item: T, index: number) => Promise<R>,
): Promise<R[]> {
  const results: R[] = []
  let next = 0
  const lane = async () => {
    while (next < items.length && !signal.aborted) {
      const index = next++
      results.push(await work(items[index]!, index))
    }
  }
  await Promise.all(Array.from({ length: Math.min(lanes, items.length) }, lane))
  return results
}
