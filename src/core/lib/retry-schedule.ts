// When failed work (a webhook delivery, a mail) is tried again: the delay after
// the nth attempt is the schedule's nth entry, scaled by a random factor around 1
// so that work that failed together (a receiver's outage) does not all come back
// in the same second.

export interface RetrySchedule {
  /** Delay after the 1st, 2nd, … failed attempt; after the last, the delivery has failed. */
  delaysMs: readonly number[]
  /** Each delay is scaled by a random factor in [1 - jitter, 1 + jitter]; 0 ≤ jitter < 1. */
  jitter: number
}

/**
 * Milliseconds until the next attempt after attempt number `attempt`
 * (1-based) failed, or undefined when retries are exhausted.
 */
export function retryDelayMs(
  schedule: RetrySchedule,
  attempt: number,
  random: () => number = Math.random,
): number | undefined {
  const base = schedule.delaysMs[attempt - 1]
  if (base === undefined) return undefined
  return Math.round(base * (1 - schedule.jitter + 2 * schedule.jitter * random()))
}
