import type { IncomingHttpHeaders } from 'node:http'
import { HttpError } from '../core/http/problem.js'
import { authorize, type Access, type MfaPolicy } from './access.js'
import {
  checkCredentials,
  classifySecret,
  invalidToken,
  presentedCredential,
  type CredentialDeps,
  type Presented,
} from './credentials.js'
import type { UserPrincipal } from './principal.js'

// Authority that outlives its request. An answer that goes on after its
// request was let in (GET /events/stream) holds a grant: the credential the
// request presented, the access its route declares and the principal it was
// let in as. The grant holds while the checks every request passes still
// pass, made by the same code: authentication (checkCredentials: a JWT
// against the revocations this instance remembers, or the database when it
// cannot trust them; an opaque token and an API key as requests read them)
// and the route's authorization (the user's current role, the credential's
// scopes); and until the credential expires, with no leeway: a request is
// over in an instant, a grant is not.
//
// Grants are checked together: however many, the database is read at most
// once per credential kind.

export interface Grant {
  presented: Presented
  access: Access
  params: Record<string, string>
  /** The principal the request was let in as. */
  principal: UserPrincipal
  /** When the credential expires, in ms since the epoch; null: it does not. */
  expiresAt: number | null
}

/** Why a grant no longer holds. */
export type GrantEnd = 'credential_expired' | 'credential_revoked' | 'access_withdrawn'

/**
 * The grant of a request that was let in as `principal` for `access`; a
 * credential whose expiry has passed (a JWT within its clock leeway) is
 * refused here, as it would end at once.
 */
export function holdGrant(
  headers: IncomingHttpHeaders,
  principal: UserPrincipal,
  access: Access,
  now: number,
  params: Record<string, string> = {},
): Grant {
  const secret = presentedCredential(headers)
  if (secret === undefined) throw new Error('unreachable: a principal without a credential')
  const at = principal.credential.expiresAt
  // The credential was told apart when the request came in: a provider token stays the provider's to check.
  const presented: Presented =
    principal.credential.type === 'oidc' ? { kind: 'provider', token: secret } : classifySecret(secret)
  const grant: Grant = { presented, access, params, principal, expiresAt: at === null ? null : Date.parse(at) }
  if (expired(grant, now)) throw invalidToken()
  return grant
}

const expired = (grant: Grant, now: number) => grant.expiresAt !== null && grant.expiresAt <= now

/** For each grant, why it no longer holds, or undefined while it does. */
export async function checkGrants(
  grants: readonly Grant[],
  deps: CredentialDeps,
  settings: { allowSignup: boolean; mfaRequired: MfaPolicy },
): Promise<Array<GrantEnd | undefined>> {
  const now = deps.clock.now()
  const principals = await checkCredentials(
    grants.map((g) => g.presented),
    deps,
  )
  return grants.map((grant, i): GrantEnd | undefined => {
    if (expired(grant, now)) return 'credential_expired'
    const principal = principals[i]
    if (!principal || principal.userId !== grant.principal.userId) return 'credential_revoked'
    try {
      authorize(grant.access, principal, grant.params, settings)
      return undefined
    } catch (err) {
      if (err instanceof HttpError) return 'access_withdrawn'
      throw err
    }
  })
}
