import type { Sql } from 'postgres'
import { purgeJob, type BatchLimits } from '../core/db/batched-delete.js'
import type { Logger } from '../core/log.js'
import type { Job } from '../core/scheduler.js'

// Events older than EVENTS_RETENTION_DAYS are deleted by the service itself,
// job `events.retention`, a batch per statement (src/core/db/batched-delete.ts):
// each statement locks one batch of rows (`batchSize`) briefly, never the
// table, and writers never wait on it. Their webhook deliveries and attempts
// go with them (ON DELETE CASCADE, sql/007). Every instance sweeps.

export interface RetentionSettings extends BatchLimits {
  /** Time between sweeps. */
  intervalMs: number
}

export const defaultRetentionSettings: RetentionSettings = {
  intervalMs: 10 * 60_000,
  batchSize: 500,
  maxBatches: 200,
  pauseMs: 50,
}

export class EventRetention {
  private readonly job: Job<number>
  /** Its repeating jobs, which run once the composition root adds them to the scheduler (src/service.ts). */
  readonly jobs: readonly Job<unknown>[]

  constructor(sql: Sql, log: Logger, days: number, settings: RetentionSettings = defaultRetentionSettings) {
    this.job = purgeJob({
      name: 'events.retention',
      periodMs: settings.intervalMs,
      // At a random point of the first interval, so that instances started together spread out.
      firstRunMs: Math.floor(Math.random() * Math.min(settings.intervalMs, 60_000)),
      sql,
      table: 'events',
      where: (sql) => sql`occurred_at < now() - ${days}::int * interval '1 day'`,
      limits: settings,
      onDeleted: (events) => events && log.info('old events deleted', { events, retention_days: days }),
    })
    this.jobs = [this.job]
  }

  /** A sweep that starts now (or once the one under way ended); how many events it deleted. */
  sweep(): Promise<number> {
    return this.job.runAnew()
  }
}
