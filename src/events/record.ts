import type { Sql, TransactionSql } from 'postgres'
import { originValues, type EventOrigin } from './origin.js'

// Events that are not a declared resource's create, update or delete (those
// are written in the statement of the change, src/core/resources/store.ts):
// sessions, failed logins. Run it on the transaction of the change, or alone
// when the event is the change (a failed login).

export interface EventRecord {
  type: string
  subject: { type: string; id: number | null }
  /** The subject as the API would show it; never a secret. */
  data: Record<string, unknown>
}

export async function recordEvents(db: Sql | TransactionSql, events: readonly EventRecord[], origin: EventOrigin): Promise<void> {
  if (events.length === 0) return
  const [actorId, credential, requestId] = originValues(origin)
  await db`
    INSERT INTO event_outbox (type, subject_type, subject_id, actor_id, actor_credential, request_id, data)
    SELECT e.type, e.subject_type, e.subject_id, ${actorId}::bigint, ${credential}::text, ${requestId}::text, e.data
    FROM json_to_recordset(${JSON.stringify(events.map((e) => ({ type: e.type, subject_type: e.subject.type, subject_id: e.subject.id, data: e.data })))}::text::json)
      AS e(type text, subject_type text, subject_id bigint, data json)`
}
