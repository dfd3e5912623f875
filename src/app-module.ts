import type { Role } from './accounts/roles.js'
import type { ProblemType } from './core/http/problem.js'
import type { AnyRoute } from './core/http/route.js'
import type { Component } from './core/lifecycle.js'
import type { Resource } from './core/resources/resource.js'
import type { TrashTarget } from './core/resources/trash-purge.js'
import type { Job } from './core/scheduler.js'

// One part of the application, and everything it adds to a service: what
// clients see (resources, routes, problem codes, scopes, event types) and
// what runs beside the requests (components, jobs). src/modules.ts lists
// them; the registry (src/registry.ts) derives the service's tables from the
// list, and createService (src/service.ts) registers the components and jobs
// in list order. A module names the few services it needs (`Services`);
// only the composition root knows them all.

/** A scope that belongs to no resource (the event feed, metrics), and the roles that may hold it. */
export interface ScopeGrant {
  scope: string
  roles: readonly Role[]
}

/**
 * A resource of a module: its declaration, its routes (src/resource-module.ts makes them), what webhooks may ask for.
 */
export interface ResourceModule {
  readonly resource: Resource
  readonly routes: readonly AnyRoute[]
  /** The event types of its writes a webhook may subscribe to. */
  readonly subscribable: readonly string[]
  /** For a resource with a trash: what the purge of its trash takes (src/core/resources/trash-purge.ts). */
  readonly trash?: TrashTarget
}

export interface AppModule<Services = never> {
  /** In log lines and docs/architecture.md's module list. */
  readonly name: string
  /**
   * Its resources, each with its routes. A function when they depend on what
   * the other modules define: the webhooks declaration lists every event type
   * a webhook may ask for.
   */
  readonly resources?: readonly ResourceModule[] | ((eventTypes: readonly string[]) => readonly ResourceModule[])
  /** Routes beyond its resources'. */
  readonly routes?: readonly AnyRoute[]
  /** Problem codes of its own rules (its resources' unique constraints bring theirs). */
  readonly problems?: Readonly<Record<string, ProblemType>>
  /** Scopes beyond its resources' `<table>:read` and `<table>:write`. */
  readonly scopes?: readonly ScopeGrant[]
  /** Event types its own statements record, beyond its resources' writes, that a webhook may ask for. */
  readonly eventTypes?: readonly string[]
  /** Its components: started in list order before the HTTP server, stopped after it has drained. */
  components?(services: Services): ReadonlyArray<Component | undefined>
  /**
   * Components whose clients never finish by themselves (event streams): started after the HTTP server, stopped before
   * it drains.
   */
  streams?(services: Services): readonly Component[]
  /** Its repeating jobs, each a bounded batch of work (src/core/scheduler.ts). */
  jobs?(services: Services): ReadonlyArray<Job<unknown>>
}
