/** How long one answer of the database serves /readyz. */
export const READINESS_TTL_MS = 1000

/**
 * The database check behind /readyz, shared for a second: /readyz is public
 * and exempt from the rate limit (load balancers and orchestrators poll it),
 * so a flood of it must not become a flood of queries. Calls while a query
 * is in flight wait for that one; its outcome, success or failure, answers
 * every call for the second after it settled, so an instance costs the
 * database at most one query a second however often it is asked.
 */
export class ReadinessCheck {
  private last: { outcome: Promise<void>; settledAt: number | undefined } | undefined

  /** `now`: the instance's clock in milliseconds (its Clock's `now`, which a test moves). */
  constructor(
    private readonly probe: () => Promise<unknown>,
    private readonly now: () => number,
    private readonly ttlMs = READINESS_TTL_MS,
  ) {}

  /** Resolves when the database answered within the last second (or now); rejects with its error otherwise. */
  database(): Promise<void> {
    const last = this.last
    if (last && (last.settledAt === undefined || this.now() - last.settledAt < this.ttlMs)) return last.outcome
    const entry: { outcome: Promise<void>; settledAt: number | undefined } = {
      outcome: this.probe().then(() => undefined),
      settledAt: undefined,
    }
    // Also marks a failure handled: a rejection nobody asks for again
    // must not count as unhandled (src/main.ts exits on those).
    const settled = () => void (entry.settledAt = this.now())
    entry.outcome.then(settled, settled)
    this.last = entry
    return entry.outcome
  }
}
