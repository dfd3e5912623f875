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
      /**
       * Open to a credential that MFA_REQUIRED holds back until its user has a second factor (GET /auth/me, the
       * routes of /auth/mfa); every other route answers it 403 mfa_enrollment_required.
       */
      enrolment?: true
    }

export const publicAccess: Access = { kind: 'public' }

/** For a person, not a program: an API key is refused (403), whatever its scopes. */
export function requireInteractive(principal: UserPrincipal): void {
  if (principal.credential.type === 'api_key') {
    throw new HttpError('forbidden', 'An API key cannot do this; log in (a JWT or an access token) to do it.')
  }
}

/** Who must have a second factor (MFA_REQUIRED). */
export type MfaPolicy = 'none' | 'admin' | 'all'

/** The `amr` values of a provider token that say its login had a second factor there (RFC 8176). */
const PROVIDER_SECOND_FACTORS: ReadonlySet<string> = new Set(['mfa', 'otp', 'hwk', 'swk'])

/**
 * Whether `policy` covers the caller and its login proved no second factor:
 * its credential is then good only to enrol one. An API key is not a login:
 * it was made with a fresh proof, and is not held back.
 */
export function mustEnrol(principal: UserPrincipal, policy: MfaPolicy): boolean {
  if (policy === 'none' || (policy === 'admin' && principal.role !== 'admin')) return false
  const { credential } = principal
  if (credential.type === 'api_key') return false
  if (credential.type === 'oidc') return !credential.amr.some((m) => PROVIDER_SECOND_FACTORS.has(m))
  return !credential.proof.amr.includes('otp')
}

export function authorize(
  access: Access,
  principal: Principal,
  params: Record<string, string>,
  settings: { allowSignup: boolean; mfaRequired: MfaPolicy },
): void {
  if (access.kind !== 'protected') return
  if (principal.kind === 'anonymous') {
    if (access.signup && settings.allowSignup) return
    throw unauthorized()
  }
  if (!access.enrolment && mustEnrol(principal, settings.mfaRequired)) {
    throw new HttpError(
      'mfa_enrollment_required',
      'This account must have a second factor (MFA_REQUIRED): enrol one with POST /auth/mfa/totp and ' +
        'POST /auth/mfa/totp/confirm, then log in again.',
    )
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
