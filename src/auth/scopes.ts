import type { Role } from './principal.js'

export const allScopes = [
  'users:read', 'users:write', 'products:read', 'products:write', 'api_keys:read', 'api_keys:write', 'events:read', 'webhooks:read', 'webhooks:write',
  'metrics:read',
] as const
export type Scope = (typeof allScopes)[number]

/** What each role may do at most; a credential's scopes narrow this further. */
export const roleScopes: Record<Role, readonly Scope[]> = {
  admin: allScopes,
  // A user manages itself and its keys, and reads the catalogue; events, webhooks and metrics are an admin's.
  user: ['users:read', 'users:write', 'products:read', 'api_keys:read', 'api_keys:write'],
}

export const isScope = (s: string): s is Scope => (allScopes as readonly string[]).includes(s)

/** A credential's effective scopes: its own, narrowed by what its user's role allows now. */
export function effectiveScopes(role: Role, granted: readonly string[]): Set<Scope> {
  const allowed = roleScopes[role]
  return new Set(granted.filter((s): s is Scope => isScope(s) && allowed.includes(s)))
}
