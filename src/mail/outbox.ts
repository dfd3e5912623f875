import type { Sql, TransactionSql } from 'postgres'
import type { MailMessage, MailType } from './message.js'

// The mail outbox (sql/012): a message is queued in the transaction of the
// change that makes it (a token issued, an address changed), so that both
// commit or neither does; the worker (src/mail/worker.ts) sends it from
// there. Claims follow the webhook deliveries' (src/webhooks/delivery-queries.ts):
// FOR UPDATE SKIP LOCKED, and a lease that hands a message to another
// instance when the one sending it dies (at least once).

/** A message before it has an id. */
export interface MailDraft {
  type: MailType
  subject: string
  text: string
  link: string | null
}

type Db = Sql | TransactionSql

/**
 * The INSERT that queues a message, as a statement part: one message for
 * each row of the relation `recipients` (columns `id` and `email`, a
 * user's), for a statement that decides in SQL whether there is anyone to
 * write to.
 */
export const queueMailTo = (db: Db, recipients: ReturnType<Sql>, draft: MailDraft) => db`
  INSERT INTO mail_outbox (type, user_id, recipient, subject, body, link)
  SELECT ${draft.type}, r.id, r.email, ${draft.subject}, ${draft.text}, ${draft.link} FROM ${recipients} r`

/** Queues one message to `to`; run it on the transaction of the change it tells about. */
export async function queueMail(db: Db, userId: number, to: string, draft: MailDraft): Promise<void> {
  await queueMailTo(db, db`(SELECT ${userId}::bigint AS id, ${to}::text AS email)`, draft)
}

export interface ClaimedMail {
  message: MailMessage
  /** This attempt's number, from 1. */
  attempts: number
}

/** Claims up to `limit` due messages for `leaseMs`: no other instance takes them before it runs out. */
export async function claimMail(db: Sql, limit: number, leaseMs: number): Promise<ClaimedMail[]> {
  const rows = await db<
    Array<{
      id: string
      type: MailType
      recipient: string
      subject: string
      body: string
      link: string | null
      attempts: number
    }>
  >`
    UPDATE mail_outbox m SET attempts = m.attempts + 1, next_attempt_at = now()
    + ${leaseMs}::int * interval '1 millisecond'
    WHERE m.id IN (
      SELECT id FROM mail_outbox WHERE failed_at IS NULL AND next_attempt_at <= now()
      ORDER BY next_attempt_at, id LIMIT ${limit} FOR UPDATE SKIP LOCKED)
    RETURNING m.id::text, m.type, m.recipient, m.subject, m.body, m.link, m.attempts`
  return rows.map((r) => ({
    message: { id: r.id, type: r.type, to: r.recipient, subject: r.subject, text: r.body, link: r.link },
    attempts: r.attempts,
  }))
}

/** Sent: the row and its secret go. */
export async function mailSent(db: Sql, id: string): Promise<void> {
  await db`DELETE FROM mail_outbox WHERE id = ${id}`
}

/** Failed, to be tried again in `retryInMs`. */
export async function mailRetry(db: Sql, id: string, error: string, retryInMs: number): Promise<void> {
  await db`
    UPDATE mail_outbox SET last_error
    = ${error}, next_attempt_at = now() + ${Math.round(retryInMs)}::int * interval '1 millisecond'
    WHERE id = ${id}`
}

/** Given up: the row stays for the operator, without its text and link (the token). */
export async function mailFailed(db: Sql, id: string, error: string): Promise<void> {
  await db`UPDATE mail_outbox SET last_error = ${error}, failed_at = now(), body = '', link = NULL WHERE id = ${id}`
}

/** Rows of messages given up on more than a week ago (job `mail.purge-failed`). */
export const oldFailedMail = (db: Sql) => db`failed_at < now() - interval '7 days'`
