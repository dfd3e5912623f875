import type { Sql, TransactionSql } from 'postgres'
import type { Resource } from '../core/resources/resource.js'
import { systemOrigin } from '../auth/origin.js'
import { updateRow } from '../core/resources/store.js'

// The SQL of the delivery worker. A claim takes due deliveries with
// FOR UPDATE SKIP LOCKED and, in the same statement, moves each one's
// next_attempt_at forward by the lease and counts the attempt: instances that
// claim at once take different rows, and a delivery whose worker dies is due
// again when the lease ends. The attempt count is the claim's fencing token:
// an outcome is written to the delivery only if no later claim took it since
// (a worker that outlived its lease) and it is still pending (its webhook was
// not disabled meanwhile).
//
// The claim is the check of the webhook's state at send time: it takes only
// deliveries of active webhooks, in the statement that leases them. A
// webhook disabled (by the worker, or with its owner's demotion or deletion,
// sql/010) fails its pending deliveries in that same transaction, and the
// publisher makes none for a disabled webhook, so an event that commits
// after the disabling is never sent. An attempt claimed just before goes on
// (its event came before); its outcome is dropped, the delivery being failed.
//
// The lock order (sql/015): a user's row, then webhook rows, then delivery
// rows; within a table, lowest id first; a row already held is not locked
// again in a stronger mode. Transactions that follow it never wait on each
// other in a cycle, which PostgreSQL breaks by aborting one of them (a
// client's PATCH /users/{id} answered 503). The paths that take both:
// - an owner's demotion or deletion (sql/010's triggers, sql/015's
//   function): the user, the owner's webhooks, their pending deliveries;
// - recordAttempt: the webhook's row (failing_since), then the delivery's,
//   and disabling the webhook goes on under that same lock;
// - deleting a webhook: its row (lockRow), then its deliveries (the cascade);
// - a PATCH that may re-enable a webhook: the caller's row, which becomes the
//   owner's (resource.ts, before the generic PATCH locks the webhook), then
//   the webhook's.
// The claim locks deliveries only, skipping those locked, and reads their
// webhooks without a lock, so it never waits while holding a delivery.
// recordAttempt for a success with no failing_since, releaseClaim and the
// manual retry lock one delivery and nothing after it; a PATCH, a rotation
// and resealing, the webhook's row alone.

export interface ClaimedDelivery {
  delivery_id: number
  /** This claim's attempt number (1-based): the fencing token. */
  attempts: number
  webhook_id: number
  url: string
  secret_sealed: string
  /** Sealed, and only while it still signs beside the current one. */
  previous_secret_sealed: string | null
  /** The event as GET /events shows it. */
  event: Record<string, unknown>
}

/** Up to `limit` due deliveries of active webhooks, oldest due first, each leased for `leaseMs`. */
export async function claimDue(sql: Sql, limit: number, leaseMs: number): Promise<ClaimedDelivery[]> {
  const rows = await sql<Array<Record<string, unknown>>>`
    WITH due AS (
      SELECT d.id FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
      WHERE d.status = 'pending' AND d.next_attempt_at <= now() AND w.status = 'active'
      ORDER BY d.next_attempt_at, d.id
      LIMIT ${limit}
      FOR UPDATE OF d SKIP LOCKED)
    UPDATE webhook_deliveries d
    SET attempts = d.attempts + 1,
      next_attempt_at = now() + ${leaseMs}::int * interval '1 millisecond',
      leased_until = now() + ${leaseMs}::int * interval '1 millisecond'
    FROM due, webhooks w, event_feed e
    WHERE d.id = due.id AND w.id = d.webhook_id AND e.id = d.event_id
    RETURNING d.id AS delivery_id, d.attempts, d.webhook_id, w.url, w.secret_sealed,
      CASE WHEN w.previous_secret_expires_at > now() THEN w.previous_secret_sealed END AS previous_secret_sealed,
      e.id, e.type, e.occurred_at, e.subject, e.actor, e.request_id, e.data`
  return rows.map(
    ({ delivery_id, attempts, webhook_id, url, secret_sealed, previous_secret_sealed, ...event }) =>
      ({
        delivery_id,
        attempts,
        webhook_id,
        url,
        secret_sealed,
        previous_secret_sealed,
        event,
      }) as ClaimedDelivery,
  )
}

export interface AttemptRecord {
  startedAt: Date
  status: number | undefined
  durationMs: number
  error: string | undefined
  ok: boolean
  /** After a failure: when to try again; undefined: retries are exhausted. */
  retryInMs: number | undefined
}

const MAX_ERROR_LENGTH = 1000

// The attempt is inserted from the delivery's row, so a delivery deleted
// meanwhile (its webhook deleted, its event past retention) takes nothing
// and fails nothing: the outcome of an attempt nobody can look at is dropped.

/**
 * Records an attempt and its consequences in one transaction: the attempt
 * row, the delivery's new state (if this claim still holds it), and the
 * webhook's record of failing. A webhook that has failed without a success
 * for `disableAfterMs` is disabled (webhook.updated, by the system) and its
 * pending deliveries fail. Whether it was disabled now.
 *
 * The lock order above: the webhook's row is written first, then the
 * delivery's; disabling needs no other lock on the webhook's row.
 */
export async function recordAttempt(
  sql: Sql,
  webhooks: Resource,
  claim: ClaimedDelivery,
  attempt: AttemptRecord,
  disableAfterMs: number,
): Promise<boolean> {
  const error = attempt.error?.slice(0, MAX_ERROR_LENGTH) ?? null
  const status = attempt.ok ? 'succeeded' : attempt.retryInMs === undefined ? 'failed' : 'pending'
  return sql.begin(async (tx) => {
    let overdue = false
    if (attempt.ok) {
      await tx`UPDATE webhooks SET failing_since = NULL WHERE id = ${claim.webhook_id} AND failing_since IS NOT NULL`
    } else {
      // An UPDATE even when failing_since is already set: it is what takes the webhook's row first.
      const [webhook] = await tx<Array<{ overdue: boolean }>>`
        UPDATE webhooks SET failing_since = coalesce(failing_since, ${attempt.startedAt}) WHERE id = ${claim.webhook_id}
        RETURNING status = 'active'
          AND failing_since <= now() - ${disableAfterMs}::bigint * interval '1 millisecond' AS overdue`
      overdue = webhook?.overdue ?? false
    }
    await tx`
      WITH attempt AS (
        INSERT INTO webhook_attempts (delivery_id, attempted_at, status, duration_ms, error)
        SELECT id, ${attempt.startedAt}, ${attempt.status ?? null}::int, ${attempt.durationMs}::int,
        ${error}::text FROM webhook_deliveries WHERE id = ${claim.delivery_id})
      UPDATE webhook_deliveries SET
        status = ${status},
        next_attempt_at = CASE
        WHEN ${status} = 'pending' THEN now() + ${attempt.retryInMs ?? 0}::int * interval '1 millisecond'
          ELSE next_attempt_at END,
        leased_until = NULL,
        last_attempt_at = ${attempt.startedAt},
        last_status = ${attempt.status ?? null},
        last_error = ${error}
      WHERE id = ${claim.delivery_id} AND attempts = ${claim.attempts} AND status = 'pending'`
    if (!overdue) return false
    await disable(tx, webhooks, claim.webhook_id, error ?? 'the receiver did not accept the deliveries')
    return true
  })
}

/**
 * Disables a webhook that kept failing, whose row the transaction holds
 * (found active under that lock, so nobody changed its status since); its
 * pending deliveries fail, as when its owner loses the authority (sql/015).
 */
async function disable(tx: TransactionSql, webhooks: Resource, webhookId: number, lastError: string): Promise<void> {
  await updateRow(tx, webhooks, webhookId, { status: 'disabled', last_error: lastError }, systemOrigin)
  await tx`SELECT fail_pending_deliveries(${[webhookId]}::bigint[])`
}

/**
 * Hands a claimed delivery back, due now, because the service is stopping
 * mid-attempt: the attempt is recorded (the receiver may have had it), and
 * another instance sends it at once instead of after the lease.
 */
export async function releaseClaim(
  sql: Sql,
  claim: ClaimedDelivery,
  attempt: Pick<AttemptRecord, 'startedAt' | 'durationMs' | 'error'>,
): Promise<void> {
  await sql`
    WITH attempt AS (
      INSERT INTO webhook_attempts (delivery_id, attempted_at, status, duration_ms, error)
      SELECT id, ${attempt.startedAt}, NULL, ${attempt.durationMs}::int, ${attempt.error ?? null}::text FROM
      webhook_deliveries WHERE id = ${claim.delivery_id})
    UPDATE webhook_deliveries SET next_attempt_at = now(), leased_until = NULL, last_attempt_at
    = ${attempt.startedAt}, last_status = NULL, last_error = ${attempt.error ?? null}
    WHERE id = ${claim.delivery_id} AND attempts = ${claim.attempts} AND status = 'pending'`
}
