import type { Principal } from './principal.js'
import type { ChangeOrigin } from '../core/resources/change-events.js'

// Who made a change, as its event records it: a user and the kind of
// credential it used, and the request. A change the service makes by itself
// (the first admin at start-up) has the actor `system`; one made anonymously
// (a self sign-up, a failed login) has no user.

/** The kinds of credential an event's actor used (the CHECK of sql/014 lists the same). */
export const actorCredentials = ['jwt', 'token', 'api_key', 'oidc', 'password', 'refresh_token', 'system'] as const
export type ActorCredential = (typeof actorCredentials)[number]

/** Core's origin of a change (src/core/resources/change-events.ts), with the credentials this application knows. */
export interface EventOrigin extends ChangeOrigin {
  credential: ActorCredential | null
}

/** The origin of a change made by an authenticated request, or an anonymous one. */
export function originOf(principal: Principal, requestId: string): EventOrigin {
  if (principal.kind !== 'user') return { actorId: null, credential: null, requestId }
  return { actorId: Number(principal.userId), credential: principal.credential.type, requestId }
}

/** A change the service makes by itself, not for a request. */
export const systemOrigin: EventOrigin = Object.freeze({ actorId: null, credential: 'system', requestId: null })
