import { settledBy } from './lib/settled-by.js'
import type { Component } from './lifecycle.js'
import { describeError, type Logger } from './log.js'

// Every repeating job of a service runs on its one scheduler, by name, as
// PocketBase registers its cron jobs (core/base.go). A job is a bounded batch
// of work run every period:
// - one run at a time, whether its timer or a caller asks for it: a caller
//   joins the run under way (`runNow`) or gets the next one (`runAnew`);
// - the next run is timed from the end of the last, so a slow run never
//   stacks up behind itself;
// - a run that rejects is logged with the job's name, once per run of
//   failures, and the job goes on at its period;
// - the timers start with the scheduler, and stop with it: `stop` waits, up
//   to its deadline, for the runs under way, and aborts their signal so that
//   a run between two batches ends there.
//
// A job is made by what it works for (a component makes its own) and added
// to the scheduler by the composition root (src/service.ts), so what runs
// is listed in one place; it runs only once added.

export interface JobSpec<T> {
  /** Names the job in log lines (`job`) and in docs/architecture.md. */
  name: string
  /** From the end of one run to the start of the next. */
  periodMs: number
  /** From the scheduler's start to the first run; default periodMs. */
  firstRunMs?: number
  /** One run: a bounded batch of work. `signal` aborts when the scheduler stops. */
  run: (signal: AbortSignal) => Promise<T>
}

/** The promise of a run asked for after the scheduler stopped. */
export class SchedulerStopped extends Error {
  constructor(job: string) {
    super(`the scheduler has stopped; ${job} does not run any more`)
  }
}

interface JobHost {
  readonly log: Logger
  readonly signal: AbortSignal
}

export class Job<T> {
  private running: Promise<T> | undefined
  private queued: Promise<T> | undefined
  private timer: NodeJS.Timeout | undefined
  private failing = false
  private host: JobHost | undefined

  constructor(readonly spec: JobSpec<T>) {}

  get name(): string {
    return this.spec.name
  }

  /** @internal the scheduler's, when the job is added. */
  attach(host: JobHost): void {
    if (this.host) throw new Error(`Scheduler: ${this.name} is on a scheduler already`)
    this.host = host
  }

  /** The scheduler it was added to: a job on none is a wiring mistake, not a state to wait out. */
  private get scheduler(): JobHost {
    if (!this.host) throw new Error(`Scheduler: ${this.name} runs only once added to a scheduler (src/service.ts)`)
    return this.host
  }

  /** Runs now, or joins the run under way; rejects with the run's error. */
  runNow(): Promise<T> {
    if (this.scheduler.signal.aborted) return Promise.reject(new SchedulerStopped(this.name))
    this.running ??= this.runOnce().finally(() => (this.running = undefined))
    return this.running
  }

  /**
   * A run that starts after this call: now, or once the run under way has
   * ended (what that one read may predate the caller's reason to ask).
   * Callers meanwhile share it.
   */
  runAnew(): Promise<T> {
    if (!this.running) return this.runNow()
    this.queued ??= this.running
      .catch(() => {})
      .then(() => {
        this.queued = undefined
        return this.runNow()
      })
    return this.queued
  }

  /** runAnew for a caller that does not wait: its failure is the scheduler's to log. */
  trigger(): void {
    this.runAnew().catch(() => {})
  }

  /** Runs under way or asked for, settled. */
  async settled(): Promise<void> {
    await this.running?.catch(() => {})
    await this.queued?.catch(() => {})
  }

  /** @internal the scheduler's: times the first run, and each next from the end of the last. */
  schedule(delayMs: number): void {
    this.timer = setTimeout(() => {
      this.runNow()
        .catch(() => {})
        .finally(() => {
          if (!this.scheduler.signal.aborted) this.schedule(this.spec.periodMs)
        })
    }, delayMs)
    // The service's own handles (its server, its pool) keep the process alive, not a job's timer.
    this.timer.unref()
  }

  /** @internal */
  cancel(): void {
    clearTimeout(this.timer)
  }

  private async runOnce(): Promise<T> {
    const { log, signal } = this.scheduler
    try {
      const value = await this.spec.run(signal)
      if (this.failing) log.info('background job works again', { job: this.name })
      this.failing = false
      return value
    } catch (err) {
      // Failures while stopping are the connections closing under the run, not news.
      if (!this.failing && !signal.aborted)
        log.warn('background job failed; it runs again every period', {
          job: this.name,
          period_ms: this.spec.periodMs,
          ...describeError(err),
        })
      this.failing = true
      throw err
    }
  }
}

export class Scheduler implements Component {
  readonly name = 'scheduler'
  private readonly jobs = new Map<string, Job<unknown>>()
  private readonly stopping = new AbortController()
  private started = false

  constructor(readonly log: Logger) {}

  /** Aborted once the scheduler stops. */
  get signal(): AbortSignal {
    return this.stopping.signal
  }

  /** Registers a job (or makes one of a spec); its timer starts with the scheduler (at once when it runs already). */
  add<T>(jobOrSpec: Job<T> | JobSpec<T>): Job<T> {
    const job = jobOrSpec instanceof Job ? jobOrSpec : new Job(jobOrSpec)
    const { spec } = job
    if (this.jobs.has(spec.name)) throw new Error(`Scheduler: two jobs are named ${spec.name}`)
    if (!(spec.periodMs > 0)) throw new Error(`Scheduler: ${spec.name} needs a positive period, not ${spec.periodMs}`)
    job.attach(this)
    this.jobs.set(spec.name, job as Job<unknown>)
    if (this.started && !this.signal.aborted) job.schedule(spec.firstRunMs ?? spec.periodMs)
    return job
  }

  /** The jobs, in the order they were added: name and period, for the docs. */
  get specs(): Array<Pick<JobSpec<unknown>, 'name' | 'periodMs'>> {
    return [...this.jobs.values()].map(({ spec }) => ({ name: spec.name, periodMs: spec.periodMs }))
  }

  start(): void {
    if (this.started) return
    this.started = true
    for (const job of this.jobs.values()) job.schedule(job.spec.firstRunMs ?? job.spec.periodMs)
  }

  /** No run starts from now on; the runs under way are waited for until `deadline`. */
  async stop(deadline: number): Promise<void> {
    this.stopping.abort()
    for (const job of this.jobs.values()) job.cancel()
    await settledBy(Promise.all([...this.jobs.values()].map((job) => job.settled())), deadline)
  }
}
