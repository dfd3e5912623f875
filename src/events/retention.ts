import type { Sql } from 'postgres'
import { setTimeout as sleep } from 'node:timers/promises'
import { Periodic } from '../core/lib/periodic.js'
import { describeError, type Logger } from '../core/log.js'

// Events older than EVENTS_RETENTION_DAYS are deleted by the service itself,
// oldest first, a batch per statement: each statement locks a few hundred
// rows for a few milliseconds, never the table, and writers never wait on
// it. Their webhook deliveries and attempts go with them (ON DELETE
// CASCADE, sql/007). Every instance sweeps; SKIP LOCKED lets two sweeps that
// meet take different rows instead of queueing.

export interface RetentionSettings {
  /** Time between sweeps. */
  intervalMs: number
  /** Events per statement. */
  batchSize: number
  /** Pause between two batches of one sweep, so a backlog does not monopolize a connection. */
  pauseMs: number
}

export const defaultRetentionSettings: RetentionSettings = { intervalMs: 10 * 60_000, batchSize: 500, pauseMs: 50 }

export class EventRetention {
  private readonly task: Periodic<number>
  private stopped = false

  constructor(
    private readonly sql: Sql,
    private readonly log: Logger,
    private readonly days: number,
    private readonly settings: RetentionSettings = defaultRetentionSettings,
  ) {
    this.task = new Periodic(() => this.deleteExpired(), settings.intervalMs)
  }

  /** Sweeps soon after start (at a random point of the first interval, so instances started together spread out), then every interval. */
  start(): void {
    this.task.start(Math.floor(Math.random() * Math.min(this.settings.intervalMs, 60_000)))
  }

  /** Deletes what is past retention, a batch at a time; how many events went. Never rejects: a failure is logged and the next sweep tries again. */
  sweep(): Promise<number> {
    return this.task.runNow()
  }

  /** Stops sweeping; a sweep under way ends after its current batch. */
  async stop(): Promise<void> {
    this.stopped = true
    await this.task.stop()
  }

  private async deleteExpired(): Promise<number> {
    const { batchSize, pauseMs } = this.settings
    let deleted = 0
    try {
      while (!this.stopped) {
        const rows = await this.sql`
          DELETE FROM events WHERE id IN (
            SELECT id FROM events WHERE occurred_at < now() - ${this.days}::int * interval '1 day'
            ORDER BY id LIMIT ${batchSize} FOR UPDATE SKIP LOCKED)
          RETURNING id`
        deleted += rows.length
        if (rows.length < batchSize) break
        await sleep(pauseMs)
      }
      if (deleted) this.log.info('old events deleted', { events: deleted, retention_days: this.days })
    } catch (err) {
      this.log.warn('deleting old events failed; the next sweep tries again', describeError(err))
    }
    return deleted
  }
}
