// Who is calling. Authentication turns a credential into a Principal; without
// a credential the caller is anonymous.

import type { Role } from '../accounts/roles.js'

export type { Role }

/** A scope such as `<table>:read`; which ones exist is the registry's (ScopePolicy, src/auth/scopes.ts). */
export type Scope = string

/**
 * How the person behind a login proved itself (RFC 8176 method names: `pwd`,
 * `otp`) and when (seconds since the epoch): a session's, carried by its tokens.
 */
export interface LoginProof {
  amr: readonly string[]
  authTime: number
}

export type Credential =
  | { type: 'jwt'; expiresAt: string; sessionId: number; epoch: number; proof: LoginProof }
  | { type: 'token'; expiresAt: string | null; sessionId: number; proof: LoginProof }
  | { type: 'api_key'; expiresAt: string | null; apiKeyId: number }
  /**
   * An access token of the identity provider (OIDC_ISSUER): no session
   * of ours; `epoch` is its user's when it was checked.
   */
  | {
      type: 'oidc'
      expiresAt: string
      issuer: string
      subject: string
      epoch: number
      authenticatedAt: number | undefined
      /** The provider's `amr` claim: how the person signed in there (`mfa`, `otp`, `hwk`, …); empty without one. */
      amr: readonly string[]
    }

export type Principal =
  | { kind: 'anonymous' }
  | { kind: 'user'; userId: string; role: Role; scopes: ReadonlySet<Scope>; credential: Credential }

export type UserPrincipal = Principal & { kind: 'user' }

export const anonymous: Principal = { kind: 'anonymous' }

/** The session of a login credential; none for an API key or a provider token. */
export const sessionOf = (credential: Credential): number | undefined =>
  'sessionId' in credential ? credential.sessionId : undefined

export const isAdmin = (p: Principal) => p.kind === 'user' && p.role === 'admin'
