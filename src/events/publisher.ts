import type { Sql, TransactionSql } from 'postgres'
import { backgroundConnection } from '../core/db/connect.js'
import type { Component } from '../core/lifecycle.js'
import { Job } from '../core/scheduler.js'
import { EVENTS_CHANNEL } from './event-reader.js'

// Moves committed events from the outbox to the event log, numbering them
// (sql/007 explains why numbering happens here and not in the writes), and
// makes their webhook deliveries in the same transaction. Every instance
// runs one, job `events.publish` (a look at the outbox every `intervalMs`),
// on a connection of its own, which neither waits behind requests nor counts
// as their statements;
// a batch runs under a transaction-level advisory lock, so batches
// follow one another whichever instance runs them, and an instance that
// finds the lock taken leaves the batch to its holder.
//
// After a batch it notifies `events`, the wake-up of every instance's stream
// reader (src/events/event-reader.ts), and, when the batch made webhook deliveries,
// calls `wakeDeliveryWorkers` in its transaction (the composition root passes
// src/webhooks/wake.ts's, which notifies at commit).

// An arbitrary constant of this service, like the migrations' lock.
const PUBLISH_LOCK = 4_711_000_007

export interface PublisherSettings {
  /** How often the outbox is looked at; an event waits at most about this long to be published. */
  intervalMs: number
  /** Events per batch (one statement). */
  batchSize: number
  /** Batches per run at most; a run that took them all is followed by another at once. */
  batchesPerRun: number
}

export const defaultPublisherSettings: PublisherSettings = { intervalMs: 50, batchSize: 500, batchesPerRun: 20 }

/** The publisher's connection is the component; its runs are the scheduler's job `events.publish`. */
export class EventPublisher implements Component {
  readonly name = 'event-publisher'
  private readonly sql: Sql
  private readonly job: Job<number>
  /** Its repeating jobs, which run once the composition root adds them to the scheduler (src/service.ts). */
  readonly jobs: readonly Job<unknown>[]

  constructor(
    pool: Sql,
    private readonly wakeDeliveryWorkers: (tx: TransactionSql) => Promise<void>,
    private readonly settings: PublisherSettings = defaultPublisherSettings,
  ) {
    // postgres.js connects on the first statement, so an instance that never starts opens nothing.
    this.sql = backgroundConnection(pool)
    this.job = new Job({ name: 'events.publish', periodMs: settings.intervalMs, run: (signal) => this.publish(signal) })
    this.jobs = [this.job]
  }

  start(): void {}

  /**
   * One run now, or the one under way: how many events it published. Rejects
   * when publishing failed (the scheduler logs it; the next run tries again).
   */
  drain(): Promise<number> {
    return this.job.runNow()
  }

  /** Closes its connection; the scheduler, stopped before, has waited for the run under way. */
  async stop(deadline: number): Promise<void> {
    await this.sql.end({ timeout: Math.max(0, deadline - performance.now()) / 1000 })
  }

  private async publish(signal: AbortSignal): Promise<number> {
    // One cheap look first: an idle outbox costs one index probe per tick, not a transaction.
    const [waiting] = await this.sql`SELECT seq FROM event_outbox ORDER BY seq LIMIT 1`
    if (!waiting) return 0
    let published = 0
    for (let batches = 0; batches < this.settings.batchesPerRun && !signal.aborted; batches++) {
      const batch = await this.publishBatch()
      published += batch
      if (batch < this.settings.batchSize) return published
    }
    this.job.trigger()
    return published
  }

  /** One batch: the oldest committed rows of the outbox, numbered in the order they were written. */
  private publishBatch(): Promise<number> {
    return this.sql.begin(async (tx) => {
      const [{ locked }] = await tx<[{ locked: boolean }]>`SELECT pg_try_advisory_xact_lock(${PUBLISH_LOCK}) AS locked`
      // Another instance is publishing: what it leaves, a later tick takes.
      if (!locked) return 0
      // nextval is called as the outer query reads the sorted rows: ids follow the outbox's order.
      const [{ published, head, deliveries }] = await tx<
        [{ published: number; head: number | null; deliveries: number }]
      >`
        WITH moved AS (
          DELETE FROM event_outbox WHERE seq IN (SELECT seq FROM event_outbox ORDER BY seq
          LIMIT ${this.settings.batchSize})
          RETURNING *),
        published AS (
          INSERT INTO events (id, type, occurred_at, subject_type, subject_id, actor_id, actor_credential,
          request_id, data)
          SELECT nextval('events_id_seq'), type, occurred_at, subject_type, subject_id, actor_id, actor_credential,
          request_id, data
          FROM (SELECT * FROM moved ORDER BY seq) AS written
          RETURNING id, type),
        deliveries AS (
          INSERT INTO webhook_deliveries (webhook_id, event_id)
          SELECT w.id, p.id FROM published p JOIN webhooks w ON w.status <> 'disabled' AND p.type = ANY (w.event_types)
          RETURNING 1)
        SELECT count(*)::int AS published, max(id) AS head, (SELECT count(*)::int FROM deliveries) AS deliveries
        FROM published`
      if (published) await tx`SELECT pg_notify(${EVENTS_CHANNEL}, ${String(head)})`
      // A paused webhook's delivery waits all the same: the worker skips it until it is resumed.
      if (deliveries) await this.wakeDeliveryWorkers(tx)
      return published
    })
  }
}
