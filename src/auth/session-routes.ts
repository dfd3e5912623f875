import Type from 'typebox'
import type { AppDeps } from '../app-deps.js'
import { HttpError, notFound } from '../http/problem.js'
import { defineRoute, type Reply } from '../http/route.js'
import { originOf, type EventOrigin } from '../events/origin.js'
import type { Principal, UserPrincipal } from './principal.js'
import { raiseCredentialEpoch, revokeSession, revokeSessionsOf } from './sessions.js'

// A user's view of where it is logged in, and the way out of each place or
// of all at once. Sessions are the caller's own: even an admin sees and ends
// only its own here (an admin ends another user's access by changing its
// password or role, or deleting it).

/** The most recent sessions listed; a user with more live sessions than this sees the newest. */
const MAX_LISTED = 200

const Session = Type.Object({
  id: Type.Integer({ minimum: 1 }),
  created_at: Type.String({ format: 'date-time' }),
  last_used_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], { description: 'the last login or refresh' }),
  expires_at: Type.String({ format: 'date-time' }),
  user_agent: Type.Union([Type.String(), Type.Null()]),
  client_address: Type.Union([Type.String(), Type.Null()]),
  current: Type.Boolean({ description: 'whether this is the session of the credential used for this request' }),
}, { additionalProperties: false })

interface SessionRow {
  id: number
  created_at: string
  last_used_at: string | null
  expires_at: string
  user_agent: string | null
  client_address: string | null
}

/** The session of the calling credential; undefined for an API key, which has none. */
const sessionOf = (principal: UserPrincipal) => (principal.credential.type === 'api_key' ? undefined : principal.credential.sessionId)

function asUser(principal: Principal): UserPrincipal {
  if (principal.kind !== 'user') throw new Error('unreachable: a protected route')
  return principal
}

/** Ends a session and answers 204 once this instance refuses its credentials (logout, DELETE /auth/sessions/{id}). */
export async function endSession(deps: AppDeps, sessionId: number, origin: EventOrigin): Promise<Reply> {
  await revokeSession(deps.sql, sessionId, origin)
  await deps.credentialChanges.caughtUp()
  return { status: 204 }
}

export const sessionRoutes = [
  defineRoute({
    method: 'GET',
    path: '/auth/sessions',
    operationId: 'listSessions',
    noStore: true,
    summary: 'List the caller\'s live sessions, newest first',
    responses: { 200: { description: `The caller's live sessions (at most ${MAX_LISTED}, newest first)`, schema: Type.Array(Session) } },
    access: { kind: 'protected', scope: null, who: 'any' },
    async handle({ principal, deps }) {
      const caller = asUser(principal)
      const rows = await deps.sql<SessionRow[]>`
        SELECT id, created_at, last_used_at, expires_at, user_agent, client_address FROM sessions
        WHERE user_id = ${caller.userId} AND revoked_at IS NULL AND expires_at > now()
        ORDER BY id DESC LIMIT ${MAX_LISTED}`
      const current = sessionOf(caller)
      return { status: 200, body: rows.map((row) => ({ ...row, current: row.id === current })) }
    },
  }),

  defineRoute({
    method: 'DELETE',
    path: '/auth/sessions/{id}',
    operationId: 'endSession',
    noStore: true,
    summary: 'End one of the caller\'s sessions: its refresh token, access tokens and JWTs stop at once',
    responses: { 204: { description: 'Ended' } },
    access: { kind: 'protected', scope: null, who: 'any' },
    async handle({ params, principal, requestId, deps }) {
      const caller = asUser(principal)
      // Another user's session is a 404 like one that does not exist: ids of other users' sessions do not leak.
      const [owned] = await deps.sql`SELECT 1 FROM sessions WHERE id = ${params.id!} AND user_id = ${caller.userId} AND revoked_at IS NULL`
      if (!owned) throw notFound()
      return endSession(deps, Number(params.id), originOf(principal, requestId))
    },
  }),

  defineRoute({
    method: 'POST',
    path: '/auth/logout-all',
    operationId: 'logoutAll',
    noStore: true,
    summary: 'End every session of the caller and every JWT issued to it so far',
    responses: { 204: { description: 'Every session ended' } },
    access: { kind: 'protected', scope: null, who: 'any' },
    async handle({ principal, requestId, deps }) {
      const caller = asUser(principal)
      // A key is for a program: it must not be able to log its owner out everywhere (and it has no session to keep).
      if (caller.credential.type === 'api_key') throw new HttpError('forbidden', 'An API key cannot end sessions; log in to do this.')
      await deps.sql.begin(async (tx) => {
        await revokeSessionsOf(tx, Number(caller.userId), originOf(principal, requestId))
        await raiseCredentialEpoch(tx, Number(caller.userId))
      })
      await deps.credentialChanges.caughtUp()
      return { status: 204 }
    },
  }),
]
