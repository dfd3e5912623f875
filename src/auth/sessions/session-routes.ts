import Type from 'typebox'
import type { AuthServices } from '../services.js'
import { revokeApiKeysOf } from '../api-keys/declaration.js'
import { notFound } from '../../core/http/problem.js'
import { defineRoute, type Reply } from '../../core/http/route.js'
import { compileValidator } from '../../core/http/validate.js'
import { originOf, type EventOrigin } from '../origin.js'
import { sessionOf as sessionOfCredential, type Principal, type UserPrincipal } from '../principal.js'
import { raiseCredentialEpoch, revokeSession, revokeSessionsOf } from './sessions.js'

// A user's view of where it is logged in, and the way out of each place or
// of all at once. Sessions are the caller's own: even an admin sees and ends
// only its own here (an admin ends another user's access by changing its
// password or role, or deleting it). These are a person's tools: an API key
// (a program's) may not use them (`interactive`), whatever its scopes.

/** The most recent sessions listed; a user with more live sessions than this sees the newest. */
const MAX_LISTED = 200

const Session = Type.Object(
  {
    id: Type.Integer({ minimum: 1 }),
    created_at: Type.String({ format: 'date-time' }),
    last_used_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
      description: 'the last login or refresh',
    }),
    expires_at: Type.String({ format: 'date-time' }),
    user_agent: Type.Union([Type.String(), Type.Null()]),
    client_address: Type.Union([Type.String(), Type.Null()]),
    current: Type.Boolean({ description: 'whether this is the session of the credential used for this request' }),
  },
  { additionalProperties: false },
)

const LogoutAllBody = Type.Object(
  {
    api_keys: Type.Optional(Type.Boolean({ description: 'also revoke every API key of the caller (default false)' })),
  },
  { additionalProperties: false },
)

/** Routes of this module: any login of the caller, never an API key. */
const interactiveAccess = { kind: 'protected', scope: null, who: 'any', interactive: true } as const

interface SessionRow {
  id: number
  created_at: string
  last_used_at: string | null
  expires_at: string
  user_agent: string | null
  client_address: string | null
}

/**
 * The session of the calling credential; undefined for an API key
 * (refused here anyway) or a provider token, which have none.
 */
const sessionOf = (principal: UserPrincipal) => sessionOfCredential(principal.credential)

function asUser(principal: Principal): UserPrincipal {
  if (principal.kind !== 'user') throw new Error('unreachable: a protected route')
  return principal
}

/** Ends a session and answers 204 once this instance refuses its credentials (logout, DELETE /auth/sessions/{id}). */
export async function endSession(
  services: Pick<AuthServices, 'sql' | 'credentialChanges'>,
  sessionId: number,
  origin: EventOrigin,
): Promise<Reply> {
  await services.sql.begin((tx) => revokeSession(tx, sessionId, origin))
  await services.credentialChanges.caughtUp()
  return { status: 204 }
}

export const sessionRoutes = [
  defineRoute({
    method: 'GET',
    path: '/auth/sessions',
    operationId: 'listSessions',
    noStore: true,
    summary: "List the caller's live sessions, newest first",
    responses: {
      200: {
        description: `The caller's live sessions (at most ${MAX_LISTED}, newest first)`,
        schema: Type.Array(Session),
      },
    },
    access: interactiveAccess,
    async handle({ principal, services }) {
      const caller = asUser(principal)
      const rows = await services.sql<SessionRow[]>`
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
    summary: "End one of the caller's sessions: its refresh token, access tokens and JWTs stop at once",
    responses: { 204: { description: 'Ended' } },
    access: interactiveAccess,
    async handle({ params, principal, requestId, services }) {
      const caller = asUser(principal)
      // Another user's session is a 404 like one that does not exist: ids of other users' sessions do not leak.
      const [owned] = await services.sql`SELECT 1 FROM sessions WHERE id = ${params.id!}
        AND user_id = ${caller.userId} AND revoked_at IS NULL`
      if (!owned) throw notFound()
      return endSession(services, Number(params.id), originOf(principal, requestId))
    },
  }),

  defineRoute({
    method: 'POST',
    path: '/auth/logout-all',
    operationId: 'logoutAll',
    noStore: true,
    summary:
      'End every session of the caller and every JWT issued to it so far; with {"api_keys": true}, revoke its API ' +
      'keys too',
    responses: { 204: { description: 'Every session ended (and every API key revoked, when asked)' } },
    access: interactiveAccess,
    body: { kind: 'json', validator: compileValidator(LogoutAllBody), optional: true },
    async handle({ body, principal, requestId, services }) {
      const caller = asUser(principal)
      const userId = Number(caller.userId)
      const origin = originOf(principal, requestId)
      await services.sql.begin(async (tx) => {
        await revokeSessionsOf(tx, userId, origin)
        await raiseCredentialEpoch(tx, userId)
        // Keys made with a stolen session outlive it; the owner taking the account back ends them here.
        if (body?.api_keys) await revokeApiKeysOf(tx, userId, origin)
      })
      await services.credentialChanges.caughtUp()
      return { status: 204 }
    },
  }),
]
