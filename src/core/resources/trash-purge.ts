import type { Sql, TransactionSql } from 'postgres'
import { Job } from '../scheduler.js'
import type { ChangeOrigin } from './change-events.js'
import type { Resource } from './resource.js'
import { lockDueForPurge, purgeRows, type StoredRow } from './store.js'

// What has been in the trash for the retention is purged by the service
// itself, job `trash.purge`, for every resource with a trash: a bounded
// number of small batches per resource and run, each in a transaction of its
// own that locks its rows (SKIP LOCKED: two instances take different rows),
// lets the resource erase what goes with them (a user's personal data
// elsewhere, its purge hook), then removes them with their `purged` events.
// The cut-off is the service's clock, so that a test moves time instead of
// waiting (test/helpers/clock.ts).

export interface TrashTarget {
  resource: Resource
  /** In the purge's transaction, the rows locked, before they go: what the resource erases with them. */
  beforePurge?: (tx: TransactionSql, rows: readonly StoredRow[]) => Promise<void>
}

export interface TrashPurgeSettings {
  /** Time between runs. */
  periodMs: number
  /** Rows per transaction: each is a purge hook's work, so batches are small. */
  batchSize: number
  /** Transactions per resource and run at most; a run that reaches it is followed by another at once. */
  maxBatches: number
}

export const defaultTrashPurgeSettings: TrashPurgeSettings = { periodMs: 60_000, batchSize: 100, maxBatches: 10 }

/** The service purges, as itself: no user, no request. */
const SYSTEM: ChangeOrigin = Object.freeze({ actorId: null, credential: 'system', requestId: null })

export class TrashPurge {
  private readonly job: Job<number>
  /** Its repeating job, which runs once the composition root adds it to the scheduler (src/service.ts). */
  readonly jobs: readonly Job<unknown>[]

  constructor(
    private readonly sql: Sql,
    private readonly targets: readonly TrashTarget[],
    /** TRASH_RETENTION, in seconds. */
    private readonly retentionSeconds: number,
    private readonly now: () => number,
    private readonly onPurged: (resource: Resource, count: number) => void = () => {},
    private readonly settings: TrashPurgeSettings = defaultTrashPurgeSettings,
  ) {
    for (const { resource } of targets)
      if (!resource.trash) throw new Error(`TrashPurge: ${resource.name} has no trash`)
    this.job = new Job({
      name: 'trash.purge',
      periodMs: settings.periodMs,
      firstRunMs: 0,
      run: (signal) => this.run(signal),
    })
    this.jobs = [this.job]
  }

  /** A purge that starts now (or once the one under way ended); how many rows it purged. */
  sweep(): Promise<number> {
    return this.job.runAnew()
  }

  private async run(signal: AbortSignal): Promise<number> {
    const before = new Date(this.now() - this.retentionSeconds * 1000).toISOString()
    const { batchSize, maxBatches } = this.settings
    let total = 0
    let more = false
    for (const target of this.targets) {
      let purged = 0
      for (let batch = 0; batch < maxBatches && !signal.aborted; batch++) {
        const count = await this.sql.begin(async (tx) => {
          const rows = await lockDueForPurge(tx, target.resource, before, batchSize)
          if (rows.length === 0) return 0
          await target.beforePurge?.(tx, rows)
          return (
            await purgeRows(
              tx,
              target.resource,
              rows.map((r) => r.id),
              SYSTEM,
            )
          ).length
        })
        purged += count
        if (count < batchSize) break
        if (batch === maxBatches - 1) more = true
      }
      if (purged) this.onPurged(target.resource, purged)
      total += purged
    }
    if (more) this.job.trigger()
    return total
  }
}
