import type { Sql } from 'postgres'

// The statements behind GET /events/stream. They rely on the commit order of
// event ids (sql/007): once an event is visible, every event with a smaller
// id that will ever exist is visible too, so a read that returns events up
// to some id has seen every event up to it, and a position ("every event up
// to here has been considered") never has to be revisited.

export interface FeedRow {
  id: number
  type: string
  occurred_at: string
  subject: unknown
  actor: unknown
  request_id: string | null
  data: unknown
}

export interface CatchUpPage {
  events: FeedRow[]
  /**
   * Every event up to this id has been considered: the last one read when the page is full, else the newest committed
   * (or `after`, if later).
   */
  position: number
  /** The newest committed event's id when the page was read. */
  newest: number
}

/** The newest committed event's id (0 when there is none): where a stream without Last-Event-ID starts. */
export async function newestEventId(sql: Sql): Promise<number> {
  const [row] = await sql<[{ id: number }]>`SELECT coalesce(max(id), 0)::bigint AS id FROM events`
  return row.id
}

/** Events after `after`, all of them, in commit order: what the hub fans out. */
export function eventsAfter(sql: Sql, after: number, limit: number): Promise<FeedRow[]> {
  return sql<FeedRow[]>`
    SELECT id, type, occurred_at, subject, actor, request_id, data FROM event_feed
    WHERE id > ${after} ORDER BY id LIMIT ${limit}`
}

/**
 * A page of one client's catch-up: the events after `after` of the given
 * types (all types when none), and how far the read has seen. The newest
 * committed id is read in the same statement, hence the same snapshot, so
 * a page that is not full has considered every event up to it.
 */
export async function catchUpPage(
  sql: Sql,
  after: number,
  limit: number,
  types: readonly string[] | undefined,
): Promise<CatchUpPage> {
  const rows = await sql<Array<FeedRow & { newest: number }>>`
    SELECT newest.id AS newest, page.* FROM (SELECT coalesce(max(id), 0)::bigint AS id FROM events) AS newest
    LEFT JOIN LATERAL (
      SELECT id, type, occurred_at, subject, actor, request_id, data FROM event_feed
      WHERE id > ${after} ${types ? sql`AND type IN ${sql(types)}` : sql``}
      ORDER BY id LIMIT ${limit}
    ) AS page ON true`
  const { newest } = rows[0]!
  const events = rows[0]!.id === null ? [] : rows
  const position = events.length === limit ? events[events.length - 1]!.id : Math.max(after, newest)
  return { events, position, newest }
}
