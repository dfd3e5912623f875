import type { ResourceModule } from './app-module.js'
import { authorize, type Access } from './auth/access.js'
import { scopesOfResource } from './auth/scopes.js'
import type { Resource } from './core/resources/resource.js'
import { resourceRoutes, type ResourceRouteOptions } from './core/resources/routes.js'

// What a module (src/app-module.ts) lists for each of its resources: its
// declaration and its routes, whose access is derived from the declaration
// (the scope of each operation and who may call it), refined where an
// operation needs more (sign-up, a login only).

type ProtectedAccess = Access & { kind: 'protected' }
type AccessGroup = 'list' | 'create' | 'read' | 'write'

export interface ResourceModuleOptions<State> extends Omit<ResourceRouteOptions<State>, 'routes'> {
  /** What an operation adds to, or changes in, the access its declaration gives it. */
  access?: Partial<Record<AccessGroup, Partial<Omit<ProtectedAccess, 'kind' | 'scope'>>>>
  /** Event types no webhook may ask for (an API key is never updated). Default none. */
  unsubscribable?: readonly string[]
}

/**
 * The access of each operation: `<table>:read` for list and read, `<table>:write` for the rest, for whom the
 * declaration names.
 */
export function accessOf(
  resource: Resource,
  refine: ResourceModuleOptions<unknown>['access'] = {},
): Record<AccessGroup, ProtectedAccess> {
  const { read, write } = scopesOfResource(resource)
  const of = (group: AccessGroup, scope: string, who: ProtectedAccess['who']): ProtectedAccess => ({
    kind: 'protected',
    scope,
    who,
    ...refine[group],
  })
  return {
    list: of('list', read, resource.access.read),
    read: of('read', read, resource.access.read),
    create: of('create', write, resource.access.write),
    write: of('write', write, resource.access.write),
  }
}

/** What resourceRoutes passes through to each operation's route: its access. */
export function routeExtensionsOf(
  resource: Resource,
  refine?: ResourceModuleOptions<unknown>['access'],
): ResourceRouteOptions<unknown>['routes'] {
  const access = accessOf(resource, refine)
  return {
    list: { access: access.list },
    create: { access: access.create },
    read: { access: access.read },
    write: { access: access.write },
  }
}

/** Who may list a resource's trash, and who may restore and purge: an admin, with the read or the write scope. */
export function trashAccessOf(resource: Resource): { list: ProtectedAccess; write: ProtectedAccess } {
  const { read, write } = scopesOfResource(resource)
  return {
    list: { kind: 'protected', scope: read, who: 'admin' },
    write: { kind: 'protected', scope: write, who: 'admin' },
  }
}

export function resourceModule<State = undefined>(
  resource: Resource,
  options: ResourceModuleOptions<State> = {},
): ResourceModule {
  const { access, unsubscribable = [], ...routeOptions } = options
  const { created, updated, deleted, restored, purged } = resource.events
  const trashAccess = trashAccessOf(resource)
  const trash: ResourceRouteOptions<State>['trash'] = {
    route: { access: trashAccess.write },
    authorize: (ctx, door) =>
      authorize(door === 'list' ? trashAccess.list : trashAccess.write, ctx.principal, ctx.params, ctx.services.config),
  }
  const { beforePurge } = options.hooks ?? {}
  return {
    resource,
    routes: resourceRoutes(resource, { ...routeOptions, routes: routeExtensionsOf(resource, access), trash }),
    subscribable: [created, updated, deleted, ...(resource.trash ? [restored, purged] : [])].filter(
      (t) => !unsubscribable.includes(t),
    ),
    ...(resource.trash
      ? { trash: { resource, ...(beforePurge ? { beforePurge: beforePurge.bind(options.hooks) } : {}) } }
      : {}),
  }
}
