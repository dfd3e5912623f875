import Type from 'typebox'
import { defineCollection, type ListQuery } from '../core/collections/declaration.js'
import { listCollection } from '../core/collections/list-query.js'
import { defineRoute } from '../core/http/route.js'
import { compileSerializer } from '../core/resources/serializer.js'
import { actorCredentials } from '../auth/origin.js'

// GET /events: the audit log and change feed in one, a collection like any
// other (filters, keyset cursor, count, fields). Its only order is the id,
// which is commit order (sql/007): a cursor taken at the end of the feed
// picks up exactly the events that commit after it.

const BIGINT = { minimum: 1, maximum: 9223372036854775807 }
const nullable = <T extends Parameters<typeof Type.Union>[0][number]>(schema: T) => Type.Union([schema, Type.Null()])

export const Event = Type.Object(
  {
    id: Type.Integer({ minimum: 1, description: "the event's place in commit order" }),
    type: Type.String({ description: 'subject.verb, e.g. session.created' }),
    occurred_at: Type.String({ format: 'date-time' }),
    subject: Type.Object({ type: Type.String(), id: nullable(Type.Integer()) }, { additionalProperties: false }),
    actor: Type.Object(
      {
        user_id: nullable(
          Type.Integer({
            description: 'the user who made the change; null for the service itself or an anonymous caller',
          }),
        ),
        credential: nullable(Type.Union(actorCredentials.map((k) => Type.Literal(k)))),
      },
      { additionalProperties: false },
    ),
    request_id: nullable(Type.String()),
    data: Type.Object(
      {},
      {
        additionalProperties: true,
        description: 'the subject after the change (before it, for a deletion); never a secret',
      },
    ),
  },
  { additionalProperties: false },
)

const outputMembers = Object.keys(Event.properties)
/** An event's JSON as GET /events writes it; GET /events/stream writes the same text. */
export const eventSerializer = compileSerializer(Event)

export const events = defineCollection({
  table: 'event_feed',
  path: '/events',
  members: { id: { type: 'integer', ...BIGINT } },
  filterOnly: {
    type: { type: 'text' },
    subject_type: { type: 'text' },
    subject_id: { type: 'integer', ...BIGINT },
    actor_id: { type: 'integer', ...BIGINT },
    occurred_at: { type: 'timestamp' },
  },
  searchColumns: [],
  outputMembers,
  serializePage: eventSerializer.page,
})

export const eventRoutes = [
  defineRoute<ListQuery, undefined>({
    method: 'GET',
    path: '/events',
    operationId: 'listEvents',
    summary: 'The audit log and change feed: events in commit order, filtered by type, subject, actor and time',
    responses: {
      200: {
        description: 'A page of events',
        schema: Type.Array(Type.Partial(Event)),
        headers: ['link', 'x-total-count'],
      },
    },
    access: { kind: 'protected', scope: 'events:read', who: 'admin' },
    query: events.queryValidator,
    components: { Event },
    handle: ({ query, services }) => listCollection(events, query, { services }),
  }),
]
