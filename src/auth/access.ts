import { HttpError } from '../core/http/problem.js'
import { challenge, unauthorized } from './credentials.js'
import type { Principal, Scope, UserPrincipal } from './principal.js'

// Who may call a route is declared on the route and checked here, once, by
// the pipeline before the handler runs. Handlers only add what depends on the
// resource itself (a non-admin changing a role, another user's API key).

export type Access =
  /** Anyone; a credential, if sent, is not even looked at. */
  | { kind: 'public' }
  /** Anyone; a credential, if sent, must be valid and is available to the handler. */
  | { kind: 'optional' }
  | {
      kind: 'protected'
      /** The scope the credential needs; null for endpoints every credential may call. */
      scope: Scope | null
      /** 'admin-or-self': an admin, or the user whose {id} is in the path. */
      who: 'any' | 'admin' | 'admin-or-self'
      /** Anonymous callers are admitted when ALLOW_SIGNUP=true (POST /users). */
      signup?: boolean
      /**
       * For a person, not a program: only the credentials of a login (a JWT,
       * an opaque token); an API key is refused (403), whatever its scopes.
       */
      interactive?: true
    }

export const publicAccess: Access = { kind: 'public' }

/** For a person, not a program: an API key is refused (403), whatever its scopes. */
export function requireInteractive(principal: UserPrincipal): void {
  if (principal.credential.type === 'api_key') {
    throw new HttpError('forbidden', 'An API key cannot do this; log in (a JWT or an access token) to do it.')
  }
}

export function authorize(
  access: Access,
  principal: Principal,
  params: Record<string, string>,
  allowSignup: boolean,
): void {
  if (access.kind !== 'protected') return
  if (principal.kind === 'anonymous') {
    if (access.signup && allowSignup) return
    throw unauthorized()
  }
  if (access.scope && !principal.scopes.has(access.scope)) {
    throw new HttpError('insufficient_scope', `This credential lacks the scope ${access.scope}.`, {
      headers: { 'www-authenticate': challenge.scope(access.scope) },
    })
  }
  if (access.interactive) requireInteractive(principal)
  // Checked before the resource is read: a non-admin asking for another
  // user's id gets 403 whether or not that id exists, so existence does not leak.
  const allowed =
    principal.role === 'admin' ||
    access.who === 'any' ||
    (access.who === 'admin-or-self' && params.id === principal.userId)
  if (!allowed) throw new HttpError('forbidden', 'This credential may not do this.')
}
