import type { Resource } from '../core/resources/resource.js'
import type { ScopeGrant } from '../app-module.js'
import type { Role, Scope } from './principal.js'

// Scopes come from the registry (src/registry.ts): each declared resource
// has `<table>:read` and `<table>:write`, held by the roles its access names;
// beside them the scopes modules grant of what is no resource (the event
// feed, metrics).

/** The two scopes of a resource, named after its table. */
export const scopesOfResource = (resource: Pick<Resource, 'table'>) => ({
  read: `${resource.table}:read`,
  write: `${resource.table}:write`,
})

/** Every role may hold the scope of an operation open to 'any' user (or to oneself); only admins the rest. */
const rolesFor = (who: string): readonly Role[] => (who === 'admin' ? ['admin'] : ['admin', 'user'])

/**
 * The scopes of one service: which exist, and what each role may
 * hold at most; a credential's scopes narrow this further.
 */
export class ScopePolicy {
  readonly all: readonly Scope[]
  readonly byRole: Readonly<Record<Role, readonly Scope[]>>

  constructor(resources: readonly Resource[], others: readonly ScopeGrant[]) {
    const entries = [
      ...resources.flatMap((r) => {
        const { read, write } = scopesOfResource(r)
        return [
          { scope: read, roles: rolesFor(r.access.read) },
          { scope: write, roles: rolesFor(r.access.write) },
        ]
      }),
      ...others,
    ]
    this.all = entries.map((e) => e.scope)
    if (new Set(this.all).size !== this.all.length)
      throw new Error(`two resources share a scope: ${this.all.join(' ')}`)
    const of = (role: Role) => entries.filter((e) => e.roles.includes(role)).map((e) => e.scope)
    this.byRole = { admin: of('admin'), user: of('user') }
  }

  isScope(s: string): boolean {
    return this.all.includes(s)
  }

  /** A credential's effective scopes: its own, narrowed by what its user's role allows now. */
  effective(role: Role, granted: readonly string[]): Set<Scope> {
    const allowed = this.byRole[role]
    return new Set(granted.filter((s) => allowed.includes(s)))
  }
}
