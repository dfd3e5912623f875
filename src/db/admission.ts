import { HttpError } from '../http/problem.js'
import type { Logger } from '../log.js'

// The bound on waiting for the database (docs/operations.md, "Faults").
//
// postgres.js never refuses work: when every connection is busy it queues
// statements without limit, and a statement sent to a server that stopped
// answering (a frozen host, a cut network) waits until TCP gives up, which can
// be never. Either turns a slow or silent database into a pile of requests
// that grows until memory runs out. So the pipeline runs the database stage
// of each request to the protected API (the credential check when it reads
// the database, and the handler; not the reading of its body) through `run`:
// - at most `limit` of them (DATABASE_POOL_MAX × 10) at once; the next one is
//   answered 503 database_unavailable at once, with Retry-After, without
//   queueing anything;
// - one not finished after `deadlineMs` (STATEMENT_TIMEOUT + 5 s: the longest
//   a statement may run, plus the connect time-out; looked for every 100 ms)
//   is answered 503. Its work is abandoned, not cancelled (it may still
//   complete, as a request whose answer was lost would), and keeps its place
//   in `limit` until it settles, so abandoned work still counts against the
//   bound.
// Public routes are outside: /healthz and /openapi.json do not use the
// database, a probe must never be refused for load, and /auth/login has a
// bound of its own (2 password hashes at a time, 64 waiting) whose waits are
// not the database's.

export const POOL_FACTOR = 10
export const DEADLINE_GRACE_MS = 5000

const unavailable = (detail: string, retryAfter: string) =>
  new HttpError('database_unavailable', detail, { headers: { 'retry-after': retryAfter } })

/** How often overdue work is looked for: a deadline fires up to this late. */
export const SWEEP_MS = 100

interface Waiting {
  due: number
  reject: (err: HttpError) => void
}

export class DatabaseWork {
  /** Requests in their database stage now, and the most there ever were. */
  active = 0
  peak = 0
  /** Answered 503 at once (bound reached), and after the deadline. */
  refused = 0
  overdue = 0
  // One shared sweep rather than a timer per request: a setTimeout and a
  // Promise.race per call were a measurable part of a cheap request's cost.
  private readonly waiting = new Set<Waiting>()
  private sweeper: NodeJS.Timeout | undefined

  constructor(readonly limit: number, readonly deadlineMs: number, private readonly onOverdue: () => void = () => {}) {}

  run<T>(work: () => Promise<T>): Promise<T> {
    if (this.active >= this.limit) {
      this.refused++
      return Promise.reject(unavailable('The service is at its limit of requests waiting for the database; retry shortly.', '1'))
    }
    this.active++
    if (this.active > this.peak) this.peak = this.active
    return new Promise<T>((resolve, reject) => {
      const entry: Waiting = { due: performance.now() + this.deadlineMs, reject }
      this.waiting.add(entry)
      this.sweeper ??= setInterval(() => this.sweep(), SWEEP_MS)
      const settle = () => {
        this.active--
        this.forget(entry)
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

  private sweep(): void {
    const now = performance.now()
    for (const entry of this.waiting) {
      if (entry.due > now) continue
      this.forget(entry)
      this.overdue++
      this.onOverdue()
      entry.reject(unavailable(`The request could not be completed within ${this.deadlineMs / 1000} s: the database is not answering; retry shortly.`, '5'))
    }
  }

  private forget(entry: Waiting): void {
    this.waiting.delete(entry)
    if (this.waiting.size === 0 && this.sweeper) {
      clearInterval(this.sweeper)
      this.sweeper = undefined
    }
  }
}

/** The bound for a pool of `poolMax` connections whose statements may run `statementTimeoutMs`. */
export function databaseBound(poolMax: number, statementTimeoutMs: number, log: Logger): DatabaseWork {
  const deadlineMs = statementTimeoutMs + DEADLINE_GRACE_MS
  const onOverdue = () => log.warn('database not answering: a request passed its deadline', { deadline_ms: deadlineMs })
  return new DatabaseWork(poolMax * POOL_FACTOR, deadlineMs, onOverdue)
}
