import { setTimeout as sleep } from 'node:timers/promises'

// The one race against a deadline. Its timer ends with the race, whichever
// side wins, so nothing is left to hold the process open or fire later.

/** `work`'s value, or what `late()` returns (or throws) once `ms` milliseconds have passed first. */
export async function withDeadline<T, L>(work: Promise<T>, ms: number, late: () => L): Promise<T | L> {
  const timer = new AbortController()
  const expired = sleep(Math.max(0, ms), undefined, { signal: timer.signal }).then(late, () => undefined as never)
  try {
    return await Promise.race([work, expired])
  } finally {
    timer.abort()
  }
}

/**
 * Waits for `work` to settle, or until `deadline` (performance.now()
 * milliseconds), whichever comes first; never rejects.
 */
export async function settledBy(work: Promise<unknown>, deadline: number): Promise<void> {
  await withDeadline(
    work.then(
      () => {},
      () => {},
    ),
    deadline - performance.now(),
    () => {},
  )
}
