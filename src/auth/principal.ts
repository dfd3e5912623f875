// Who is calling. Authentication turns a credential into a Principal; without
// a credential the caller is anonymous.

export type Role = 'admin' | 'user'

/** A scope such as `<table>:read`; which ones exist is the registry's (ScopePolicy, src/auth/scopes.ts). */
export type Scope = string

export type Credential =
  | { type: 'jwt'; expiresAt: string; sessionId: number; epoch: number }
  | { type: 'token'; expiresAt: string | null; sessionId: number }
  | { type: 'api_key'; expiresAt: string | null; apiKeyId: number }

export type Principal =
  | { kind: 'anonymous' }
  | { kind: 'user'; userId: string; role: Role; scopes: ReadonlySet<Scope>; credential: Credential }

export type UserPrincipal = Principal & { kind: 'user' }

export const anonymous: Principal = { kind: 'anonymous' }

export const isAdmin = (p: Principal) => p.kind === 'user' && p.role === 'admin'
