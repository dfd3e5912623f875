import type { AppModule, ResourceModule } from './app-module.js'
import { ScopePolicy } from './auth/scopes.js'
import { coreProblems, problemTable, type ProblemTable } from './core/http/problem.js'
import type { AnyRoute } from './core/http/route.js'
import type { Resource } from './core/resources/resource.js'
import type { TrashTarget } from './core/resources/trash-purge.js'

// What a service derives from its modules (src/modules.ts lists the
// application's): their resources and routes, the scopes, the event types a
// webhook may ask for, the problem codes. Built once per service
// (src/service.ts), so a test can give its own service a module more.

export interface Registry {
  /** The modules, in the order their components start and their routes are listed. */
  readonly modules: ReadonlyArray<AppModule<unknown>>
  /** Every declared resource, in module order. */
  readonly resources: readonly Resource[]
  /** The resources with a trash, and what their purge takes (src/core/resources/trash-purge.ts). */
  readonly trash: readonly TrashTarget[]
  /** Every route of the modules: their resources' and their own, in module order. */
  readonly routes: readonly AnyRoute[]
  readonly scopes: ScopePolicy
  /** What a webhook may subscribe to: the resources' writes (but those a module excludes) and the modules' own. */
  readonly eventTypes: readonly string[]
  /** Every problem code the service may answer with: core's, the modules', their resources' unique ones. */
  readonly problems: ProblemTable
  /** The resource stored in `table`; throws when no module declares it (a wiring mistake). */
  resourceOf(table: string): Resource
}

export function buildRegistry(modules: ReadonlyArray<AppModule<never>>): Registry {
  const fixed = modules.flatMap((m) => (Array.isArray(m.resources) ? m.resources : []) as readonly ResourceModule[])
  const eventTypes = [...fixed.flatMap((r) => r.subscribable), ...modules.flatMap((m) => m.eventTypes ?? [])]
  const resourcesOf = (m: AppModule<never>): readonly ResourceModule[] =>
    typeof m.resources === 'function' ? m.resources(eventTypes) : (m.resources ?? [])
  const parts = modules.map((m) => ({ module: m, resources: resourcesOf(m) }))
  const resources = parts.flatMap((p) => p.resources.map((r) => r.resource))
  for (const key of ['name', 'path', 'table'] as const) {
    const seen = resources.map((r) => r[key])
    const twice = seen.find((v, i) => seen.indexOf(v) !== i)
    if (twice) throw new Error(`two resources have the ${key} "${twice}"`)
  }
  const names = modules.map((m) => m.name)
  const twice = names.find((v, i) => names.indexOf(v) !== i)
  if (twice) throw new Error(`two modules are named "${twice}"`)
  // Two sources naming one code with different meanings throw here.
  const problems = problemTable(
    coreProblems,
    ...modules.map((m) => m.problems ?? {}),
    ...resources.map((r) => r.problems),
  )
  return {
    modules: modules as ReadonlyArray<AppModule<unknown>>,
    resources,
    trash: parts.flatMap((p) => p.resources.flatMap((r) => (r.trash ? [r.trash] : []))),
    routes: parts.flatMap((p) => [...p.resources.flatMap((r) => r.routes), ...(p.module.routes ?? [])]),
    scopes: new ScopePolicy(
      resources,
      modules.flatMap((m) => m.scopes ?? []),
    ),
    eventTypes,
    problems,
    resourceOf(table) {
      const found = resources.find((r) => r.table === table)
      if (!found) throw new Error(`no module declares a resource stored in ${table}`)
      return found
    },
  }
}
