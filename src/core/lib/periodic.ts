// Work an instance repeats in the background (publishing events, deleting
// old ones): one run at a time, never two at once, whether the timer or a
// caller asks for it; the next run is timed from the end of the last, so a
// slow run never stacks up behind itself; and stop() waits for the run under
// way. The work itself must not reject: it logs its own failures.

export class Periodic<T> {
  private timer: NodeJS.Timeout | undefined
  private running: Promise<T> | undefined
  private queued: Promise<T> | undefined
  private stopped = false

  constructor(
    private readonly work: () => Promise<T>,
    private readonly intervalMs: number,
  ) {}

  /** The first run after `firstDelayMs`, then one every interval after the previous ended. */
  start(firstDelayMs = this.intervalMs): void {
    const schedule = (delay: number) => {
      this.timer = setTimeout(() => void this.runNow().finally(() => this.stopped || schedule(this.intervalMs)), delay)
      this.timer.unref()
    }
    schedule(firstDelayMs)
  }

  /** Runs the work now, or joins the run under way. */
  runNow(): Promise<T> {
    this.running ??= this.work().finally(() => (this.running = undefined))
    return this.running
  }

  /**
   * A run that starts after this call: now, or once the run under way has
   * ended (what that one read may predate the caller's reason to ask).
   * Callers meanwhile share it.
   */
  runAnew(): Promise<T> {
    if (!this.running) return this.runNow()
    this.queued ??= this.running.then(() => {
      this.queued = undefined
      return this.runNow()
    })
    return this.queued
  }

  /** No run starts after this but one asked for already; resolves once the runs under way or asked for have ended. */
  async stop(): Promise<void> {
    this.stopped = true
    clearTimeout(this.timer)
    await this.running
    await this.queued
  }
}
