import { setTimeout as sleep } from 'node:timers/promises'

/** Waits for `work` to settle, or until `deadline` (performance.now() milliseconds), whichever comes first; never rejects. */
export async function settledBy(work: Promise<unknown>, deadline: number): Promise<void> {
  const overrun = new AbortController()
  await Promise.race([work.then(() => {}, () => {}), sleep(Math.max(0, deadline - performance.now()), undefined, { signal: overrun.signal }).catch(() => {})])
  overrun.abort()
}
