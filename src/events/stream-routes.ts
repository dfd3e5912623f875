import type { IncomingHttpHeaders } from 'node:http'
import Type, { type Static } from 'typebox'
import type { Access } from '../auth/access.js'
import { holdGrant } from '../auth/grants.js'
import { defineRoute } from '../core/http/route.js'
import { HttpError } from '../core/http/problem.js'
import { compileValidator } from '../core/http/validate.js'

// GET /events/stream: the feed of GET /events as Server-Sent Events, for as
// long as the client stays (src/events/hub.ts). The handler only checks the
// request and takes a place among the instance's streams; the stream itself
// reads the database through database admission, statement by statement,
// so an open stream holds no place in it.
//
// Where to resume: the Last-Event-ID header, which EventSource sends when it
// reconnects, or `last_event_id` for a first connection from a client that
// cannot set headers. EventSource reconnects to the same URL, so a query's
// id is the older one when both are given: the header wins.
//
// A stream lives no longer than the authority that opened it: it ends when
// the credential expires or is revoked, or when the route's access check
// would now refuse it (src/auth/grants.ts, src/events/stream-authority.ts).
// The client's reconnection is then refused (401, or 403 for a user who lost
// the role), so EventSource stops instead of reconnecting for ever.

const MAX_TYPES = 20
/** 2^63: event ids are PostgreSQL bigints. */
const ID_LIMIT = 2n ** 63n
const ID_RULE = `an event id: an integer from 0 to ${ID_LIMIT - 1n}`
const DIGITS = /^[0-9]{1,20}$/

const streamAccess: Access = { kind: 'protected', scope: 'events:read', who: 'admin' }

const StreamQuery = Type.Object(
  {
    type: Type.Optional(
      Type.Array(
        Type.String({ pattern: '^[a-z_]{1,40}\\.[a-z_]{1,40}$', description: 'an event type such as session.created' }),
        {
          minItems: 1,
          maxItems: MAX_TYPES,
          description: `at most ${MAX_TYPES} comma-separated event types; only events of these types are sent`,
        },
      ),
    ),
    last_event_id: Type.Optional(
      Type.BigInt({
        minimum: 0n,
        exclusiveMaximum: ID_LIMIT,
        description: `${ID_RULE}; events after it are sent first (Last-Event-ID wins when both are given)`,
      }),
    ),
  },
  { additionalProperties: false },
)
type StreamQuery = Static<typeof StreamQuery>

const streamQuery = compileValidator(StreamQuery, {
  fromWire: (raw) => {
    const { type, last_event_id, ...rest } = raw as Record<string, string>
    return {
      ...rest,
      ...(type === undefined ? {} : { type: type.split(',') }),
      ...(last_event_id === undefined
        ? {}
        : { last_event_id: DIGITS.test(last_event_id) ? BigInt(last_event_id) : last_event_id }),
    }
  },
})

/** The id to resume after, from the header or the query; undefined: start with what commits from now on. */
export function resumePoint(headers: IncomingHttpHeaders, query: StreamQuery): number | undefined {
  const raw = headers['last-event-id']
  // Node joins a repeated header into one value, which no id matches; a list is refused the same way.
  const header = Array.isArray(raw) ? raw.join(', ') : raw
  let id = query.last_event_id
  if (header !== undefined) {
    if (!DIGITS.test(header) || BigInt(header) >= ID_LIMIT) {
      throw new HttpError('invalid_request', `Last-Event-ID: must be ${ID_RULE}.`, {
        errors: [{ path: 'Last-Event-ID', message: `must be ${ID_RULE}` }],
      })
    }
    id = BigInt(header)
  }
  // Ids are read as numbers everywhere (src/core/db/connect.ts); past 2^53 - 1 none exists, so such a point is after
  // every event.
  return id === undefined ? undefined : Number(id > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : id)
}

export const eventStreamRoutes = [
  defineRoute<StreamQuery, undefined>({
    method: 'GET',
    path: '/events/stream',
    operationId: 'streamEvents',
    summary:
      'The change feed as Server-Sent Events: resumes after Last-Event-ID with no gap and no duplicate, then follows ' +
      'new events live',
    responses: {
      200: {
        description:
          'A stream that does not end by itself: `retry:` first, then each event as `id:` (its id), `event:` (its ' +
          'type) and `data:` (the event as GET /events shows it), ' +
          'and a `: keep-alive` comment when idle. Send the last id received as Last-Event-ID to resume. A client ' +
          'too slow to read is disconnected; it resumes the same way. ' +
          'The stream ends, within a second on every instance, when its credential expires or is revoked (logout, ' +
          'logout-all, a password change, the key deleted), ' +
          'or when its user is deleted or loses the role or scope it needs; no event committed after that is sent, ' +
          'and reconnecting with that credential is refused.',
        schema: Type.String(),
        contentType: 'text/event-stream',
      },
    },
    access: streamAccess,
    query: streamQuery,
    database: 'statements',
    async handle({ query, headers, principal, requestId, bounded, services }) {
      const after = resumePoint(headers, query)
      if (principal.kind !== 'user') throw new Error('unreachable: a protected route without a user')
      const grant = holdGrant(headers, principal, streamAccess, services.clock.now())
      const stream = services.eventHub.reserve({
        after,
        types: query.type && new Set(query.type),
        requestId,
        bounded,
        grant,
      })
      // no-store: a cache must never hold a stream; X-Accel-Buffering: nginx must pass each event on at once.
      return { status: 200, headers: { 'cache-control': 'no-store', 'x-accel-buffering': 'no' }, stream }
    },
  }),
]
