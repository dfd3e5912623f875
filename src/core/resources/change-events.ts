import type { Sql, TransactionSql } from 'postgres'
import { quoteIdentifier } from '../db/identifier.js'
import type { HandlerContext } from '../http/route.js'
import type { Resource } from './resource.js'

// Every change of a resource records an event in the outbox (event_outbox,
// sql/007) in the change's own statement or transaction, so that a change and
// its event commit together or not at all. Who made the change is the
// application's to say (it knows the caller): core asks `changeOrigin`.

/**
 * Who made a change, as its event records it: a user and the kind
 * of credential it used (null: anonymous), and the request.
 */
export interface ChangeOrigin {
  actorId: number | null
  credential: string | null
  requestId: string | null
}

declare module '../http/services.js' {
  interface CoreServices {
    /** The origin of the changes a request makes (the application's caller, src/auth/origin.ts). */
    changeOrigin(ctx: HandlerContext<unknown, unknown>): ChangeOrigin
  }
}

/** The three statement parameters every event insert takes after its own, in this order. */
export const originValues = (o: ChangeOrigin): [number | null, string | null, string | null] => [
  o.actorId,
  o.credential,
  o.requestId,
]

export interface EventRecord {
  type: string
  subject: { type: string; id: number | null }
  /** The subject as the API would show it; never a secret. */
  data: Record<string, unknown>
}

/**
 * Events that are not a declared resource's create, update or delete (those
 * are written in the statement of the change, src/core/resources/store.ts):
 * sessions, failed logins. Run it on the transaction of the change, or alone
 * when the event is the change (a failed login).
 */
export async function recordEvents(
  db: Sql | TransactionSql,
  events: readonly EventRecord[],
  origin: ChangeOrigin,
): Promise<void> {
  if (events.length === 0) return
  const [actorId, credential, requestId] = originValues(origin)
  const rows = events.map((e) => ({
    type: e.type,
    subject_type: e.subject.type,
    subject_id: e.subject.id,
    data: e.data,
  }))
  await db`
    INSERT INTO event_outbox (type, subject_type, subject_id, actor_id, actor_credential, request_id, data)
    SELECT e.type, e.subject_type, e.subject_id, ${actorId}::bigint, ${credential}::text, ${requestId}::text, e.data
    FROM json_to_recordset(${JSON.stringify(rows)}::text::json)
      AS e(type text, subject_type text, subject_id bigint, data json)`
}

/**
 * `json_build_object(...)` of the representation of the row named `row` in
 * the statement, for the event written with the change: the same members in
 * the same order as the API shows them, timestamps in the API's text
 * (api_time, sql/007). Made from the declaration only; test/events.test.ts
 * holds it to what GET answers.
 */
export function representationSql(resource: Resource): string {
  const parts = resource.outputMembers.map((m) => {
    const column = `row.${quoteIdentifier(m)}`
    return `'${m}', ${resource.timestampMembers.has(m) ? `api_time(${column})` : column}`
  })
  return `json_build_object(${parts.join(', ')})`
}
