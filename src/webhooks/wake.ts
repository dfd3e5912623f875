import type { Sql, TransactionSql } from 'postgres'

// The webhook workers' wake-up (src/webhooks/worker.ts): a notification on a
// channel of their own, sent by sql/007 in a commit that created deliveries,
// and by what makes waiting deliveries due (a resume, a manual retry). It
// reaches every instance at commit; the table is the truth, so a wake-up
// lost is only a delay until the next poll.

export const DELIVERIES_CHANNEL = 'webhook_deliveries'

/** Wakes every instance's worker when the transaction of `db` commits. */
export async function wakeWorkers(db: Sql | TransactionSql): Promise<void> {
  await db`SELECT pg_notify(${DELIVERIES_CHANNEL}, '')`
}
