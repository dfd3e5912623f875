import { setTimeout as sleep } from 'node:timers/promises'
import type { PendingQuery, Row, Sql } from 'postgres'
import { Job } from '../scheduler.js'

// Purges of old rows, every one of them (each a job on the scheduler,
// src/core/scheduler.ts): a bounded number of bounded DELETEs, so that a
// purge never holds many row locks at once nor runs for long, whatever piled
// up; what is left, the next run takes. SKIP LOCKED lets two instances'
// purges that meet take different rows instead of queueing.

export interface BatchLimits {
  /** Rows per statement. */
  batchSize: number
  /** Statements per call at most. */
  maxBatches: number
  /** Pause between two statements, so a backlog does not monopolize a connection. */
  pauseMs: number
}

export const defaultBatchLimits: BatchLimits = { batchSize: 1000, maxBatches: 10, pauseMs: 0 }

/**
 * Deletes the rows of `table` (a name from the code, never from input) that
 * `where` selects, a batch at a time, until a batch comes back short, the
 * limit of batches is reached or `signal` aborts; returns how many.
 */
export async function deleteInBatches(
  sql: Sql,
  table: string,
  where: PendingQuery<Row[]>,
  limits: Partial<BatchLimits> = {},
  signal?: AbortSignal,
): Promise<number> {
  const { batchSize, maxBatches, pauseMs } = { ...defaultBatchLimits, ...limits }
  let deleted = 0
  for (let batch = 0; batch < maxBatches && !signal?.aborted; batch++) {
    if (batch > 0 && pauseMs > 0) await sleep(pauseMs, undefined, { signal }).catch(() => {})
    const { count } = await sql`
      DELETE FROM ${sql(table)} WHERE ctid IN (SELECT ctid
        FROM ${sql(table)} WHERE ${where} LIMIT ${batchSize} FOR UPDATE SKIP LOCKED)`
    deleted += count
    if (count < batchSize) break
  }
  return deleted
}

/** How often the purges of old rows run, unless one says otherwise; each deletes a bounded batch. */
export const PURGE_PERIOD_MS = 60_000

export interface PurgeJob {
  /** The job's name on the scheduler. */
  name: string
  /** Default PURGE_PERIOD_MS. */
  periodMs?: number
  /** Default 0: an instance that starts cleans up what stopped ones left. */
  firstRunMs?: number
  sql: Sql
  /** A name from the code, never from input. */
  table: string
  /** The rows to delete, as a condition on `table`. */
  where: (sql: Sql) => PendingQuery<Row[]>
  limits?: Partial<BatchLimits>
  /** Told how many rows a run deleted (0 included). */
  onDeleted?: (count: number) => void
}

/** A purge for the scheduler: deleteInBatches every period, and again at once after a run that reached its bound. */
export function purgeJob(spec: PurgeJob): Job<number> {
  const { batchSize, maxBatches } = { ...defaultBatchLimits, ...spec.limits }
  const job: Job<number> = new Job({
    name: spec.name,
    periodMs: spec.periodMs ?? PURGE_PERIOD_MS,
    firstRunMs: spec.firstRunMs ?? 0,
    async run(signal) {
      const deleted = await deleteInBatches(spec.sql, spec.table, spec.where(spec.sql), spec.limits, signal)
      spec.onDeleted?.(deleted)
      if (deleted >= batchSize * maxBatches) job.trigger()
      return deleted
    },
  })
  return job
}
