import { applicationProblems } from './app-problems.js'
import { ScopePolicy } from './auth/scopes.js'
import { coreProblems, problemTable, type ProblemTable } from './core/http/problem.js'
import type { AnyRoute } from './core/http/route.js'
import type { Resource } from './core/resources/resource.js'
import type { ResourceModule } from './resource-module.js'
import { subscribableEventTypes } from './webhooks/event-types.js'
import { defineWebhooks } from './webhooks/resource.js'
import { webhookRoutes } from './webhooks/routes.js'

// What a service derives from its resources (src/resources.ts lists the
// application's): their routes, the scopes, the event types a webhook may
// ask for (and so the webhooks declaration), the problem codes. Built once per
// service (src/service.ts), so a test can add a resource to its own service.

export interface Registry {
  /** Every declared resource, webhooks last. */
  readonly resources: readonly Resource[]
  /** The routes of the listed resources, in the order listed. */
  readonly resourceRoutes: readonly AnyRoute[]
  /** The webhooks declaration for these event types, and its routes (subscriptions, secrets, deliveries). */
  readonly webhooks: Resource
  readonly webhookRoutes: readonly AnyRoute[]
  readonly scopes: ScopePolicy
  readonly eventTypes: readonly string[]
  /** Every problem code the service may answer with: core's, the application's, its resources' unique ones. */
  readonly problems: ProblemTable
}

export function buildRegistry(modules: readonly ResourceModule[]): Registry {
  const eventTypes = subscribableEventTypes(modules)
  const webhooks = defineWebhooks(eventTypes)
  const resources = [...modules.map((m) => m.resource), webhooks]
  for (const key of ['name', 'path', 'table'] as const) {
    const seen = resources.map((r) => r[key])
    const twice = seen.find((v, i) => seen.indexOf(v) !== i)
    if (twice) throw new Error(`two resources have the ${key} "${twice}"`)
  }
  // Two sources naming one code with different meanings throw here.
  const problems = problemTable(coreProblems, applicationProblems, ...resources.map((r) => r.problems))
  return {
    resources,
    resourceRoutes: modules.flatMap((m) => m.routes),
    webhooks,
    webhookRoutes: webhookRoutes(webhooks),
    scopes: new ScopePolicy(resources),
    eventTypes,
    problems,
  }
}
