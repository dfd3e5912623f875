import type { Logger } from '../log.js'
import type { Component } from '../lifecycle.js'

// Database admission (docs/operations.md, "Faults").
//
// postgres.js never refuses work: when every connection is busy it queues
// statements without limit, and a statement sent to a server that stopped
// answering (a frozen host, a cut network) waits until TCP gives up, which can
// be never. Either turns a slow or silent database into a pile of requests
// that grows until memory runs out. So the pipeline runs the database stage
// of each request to the protected API (the credential check when it reads
// the database, and the handler; not the reading of its body) through `run`.
//
// Concurrency alone is no reason to refuse: a thousand clients on ten
// connections queue, and a healthy database works the queue off. What is a
// reason is waiting that the database is not working off, so the bound is on
// time, as CoDel's is, not on a count:
// - a request is refused at once (DatabaseBusy 'refused': a 503 to retry in
//   a second, nothing queued) only when waiting has become the problem: the oldest
//   request in its database stage has waited longer than `targetMs`, and more
//   requests are in their database stage than the database finished in the
//   last `targetMs` (so a newcomer would wait longer than that too). A frozen
//   or stalled database finishes nothing, and is refused at once after
//   `targetMs`; one slow statement among fast ones does not refuse anybody;
// - while fewer requests than the pool has connections are in their database
//   stage, none is refused: none of them waits for another;
// - one not finished after `deadlineMs` (STATEMENT_TIMEOUT + 5 s: the longest
//   a statement may run, plus the connect time-out; looked for every 100 ms)
//   is answered 503 (DatabaseBusy 'overdue'). Its work is abandoned, not cancelled (it may still
//   complete, as a request whose answer was lost would), and still counts as
//   in its database stage until it settles;
// - a batch (src/core/http/batch.ts) is many requests' worth of work under one
//   entry, with a deadline as many times the service's: it counts as late, for
//   the first rule, only once it has run as many times `targetMs`.
// Public routes are outside: /healthz and /openapi.json do not use the
// database, a probe must never be refused for load, and /auth/login has a
// bound of its own (2 password hashes at a time, 64 waiting) whose waits are
// not the database's.

/** How long requests may wait on a database that is not keeping up before newcomers are refused. */
export const WAIT_TARGET_MS = 2000
export const DEADLINE_GRACE_MS = 5000
/** How often overdue work is looked for and the finished count sampled: a deadline fires up to this late. */
export const SWEEP_MS = 100

/**
 * The work was not run ('refused': the database is not keeping up with the
 * work waiting for it) or not waited for past its deadline ('overdue': the
 * database is not answering). Either is worth retrying; the HTTP layer
 * answers it 503 (src/core/http/database-problems.ts).
 */
export class DatabaseBusy extends Error {
  constructor(
    readonly reason: 'refused' | 'overdue',
    readonly deadlineMs: number,
  ) {
    super(
      reason === 'refused'
        ? 'database admission refused the work: the database is not keeping up'
        : `the work passed its deadline of ${deadlineMs} ms`,
    )
    this.name = 'DatabaseBusy'
  }
}

interface Waiting {
  started: number
  /** The performance.now() instant it is answered 503, and how long after its start that is. */
  due: number
  deadlineMs: number
  reject: (err: DatabaseBusy) => void
  /** Answered 503 at its deadline; still unsettled, so still the oldest work if it is. */
  abandoned: boolean
}

export interface DatabaseAdmissionOptions {
  /** Requests never refused for waiting: the pool's connections. */
  floor: number
  targetMs: number
  deadlineMs: number
  onOverdue?: () => void
}

/**
 * A component of the service's lifecycle for its one timer, the sweep: it
 * runs only while requests are admitted, and `stop` (once the HTTP server has
 * stopped) ends it, so nothing of admission outlives `close()`.
 */
export class DatabaseAdmission implements Component {
  readonly name = 'database-admission'
  /** Requests in their database stage now, and the most there ever were. */
  active = 0
  peak = 0
  /** Requests whose database stage ended; answered 503 at once; answered 503 after the deadline. */
  finished = 0
  refused = 0
  overdue = 0
  readonly floor: number
  readonly targetMs: number
  readonly deadlineMs: number
  private readonly onOverdue: () => void
  // Unsettled work (abandoned included) in start order (a Set iterates in
  // insertion order), so the first is the oldest. One shared sweep rather than
  // a timer per request: a setTimeout and a Promise.race per call would weigh
  // on a cheap request (bench/README.md).
  private readonly waiting = new Set<Waiting>()
  // Work with a longer deadline of its own (a batch: many requests' worth),
  // apart: having run longer than a request should wait is no sign that it
  // waits, only having run longer than that many requests should.
  private readonly extended = new Set<Waiting>()
  private sweeper: NodeJS.Timeout | undefined
  private stopped = false
  // `finished` as it was at each of the last sweeps, the oldest at `sampleAt`,
  // taken at least `targetMs` ago: what the database finished in (a little more
  // than) the last `targetMs` is `finished` minus that one.
  private readonly samples: number[]
  private sampleAt = 0

  constructor(options: DatabaseAdmissionOptions) {
    this.floor = options.floor
    this.targetMs = options.targetMs
    this.deadlineMs = options.deadlineMs
    this.onOverdue = options.onOverdue ?? (() => {})
    this.samples = new Array<number>(Math.ceil(this.targetMs / SWEEP_MS) + 1).fill(0)
  }

  /** `deadlineMs`: for work that is many requests' worth (a batch's operations); default the service's. */
  run<T>(work: () => Promise<T>, deadlineMs = this.deadlineMs): Promise<T> {
    if (this.active >= this.floor && this.waitingTooLong()) {
      this.refused++
      return Promise.reject(new DatabaseBusy('refused', deadlineMs))
    }
    this.active++
    if (this.active > this.peak) this.peak = this.active
    if (this.sweeper === undefined && !this.stopped) this.startSweeping()
    return new Promise<T>((resolve, reject) => {
      const started = performance.now()
      const entry: Waiting = { started, due: started + deadlineMs, deadlineMs, reject, abandoned: false }
      const set = deadlineMs > this.deadlineMs ? this.extended : this.waiting
      set.add(entry)
      const settle = () => {
        this.active--
        this.finished++
        set.delete(entry)
      }
      // Abandoned work settles later; resolve/reject after the deadline's reject are no-ops.
      Promise.resolve()
        .then(work)
        .then(
          (value) => (settle(), resolve(value)),
          (err: unknown) => (settle(), reject(err)),
        )
    })
  }

  start(): void {}

  /** No sweep after this; work still admitted settles as its statements end (the pool closes after). */
  stop(): void {
    this.stopped = true
    clearInterval(this.sweeper)
    this.sweeper = undefined
  }

  /**
   * The oldest request has waited past the target (or work of a longer deadline past as many targets as its
   * deadline is the service's), and more wait than the database finished meanwhile.
   */
  private waitingTooLong(): boolean {
    const now = performance.now()
    const oldest = this.waiting.values().next().value
    let late = oldest !== undefined && now - oldest.started >= this.targetMs
    for (const e of this.extended) late ||= (now - e.started) * this.deadlineMs >= this.targetMs * e.deadlineMs
    return late && this.active > this.finished - this.samples[this.sampleAt]!
  }

  private abandon(entry: Waiting): void {
    entry.abandoned = true
    this.overdue++
    this.onOverdue()
    entry.reject(new DatabaseBusy('overdue', entry.deadlineMs))
  }

  private startSweeping(): void {
    // Before the first sweeps, what was finished before counts as finished in
    // the window; the oldest request cannot have waited past the target by then.
    this.samples.fill(this.finished)
    this.sweeper = setInterval(() => this.sweep(), SWEEP_MS)
  }

  private sweep(): void {
    this.samples[this.sampleAt] = this.finished
    this.sampleAt = (this.sampleAt + 1) % this.samples.length
    const now = performance.now()
    // The service's deadline is the same for all, so the first not due ends the look; longer ones differ.
    for (const entry of this.waiting) {
      if (now < entry.due) break
      if (!entry.abandoned) this.abandon(entry)
    }
    for (const entry of this.extended) if (now >= entry.due && !entry.abandoned) this.abandon(entry)
    if (this.active === 0) {
      clearInterval(this.sweeper)
      this.sweeper = undefined
    }
  }
}

/** Database admission for a pool of `poolMax` connections whose statements may run `statementTimeoutMs`. */
export function admissionFor(poolMax: number, statementTimeoutMs: number, log: Logger): DatabaseAdmission {
  const deadlineMs = statementTimeoutMs + DEADLINE_GRACE_MS
  const onOverdue = () => log.warn('database not answering: a request passed its deadline', { deadline_ms: deadlineMs })
  return new DatabaseAdmission({ floor: poolMax, targetMs: WAIT_TARGET_MS, deadlineMs, onOverdue })
}
