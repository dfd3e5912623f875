import type { AppDeps } from './app-deps.js'
import type { Access } from './auth/access.js'
import type { Principal } from './auth/principal.js'

// What this application adds to core's routes and handler contexts, by
// declaration merging (fastify's way for plugins): the one place where the
// application's types reach core's. Core declares the interfaces empty and
// never reads these members; the application's stages
// (src/auth/request-guard.ts) read and fill them.

declare module './core/http/route.js' {
  interface RouteExtensions {
    /** Who may call the route (src/auth/access.ts), checked before the handler runs. */
    access: Access
    /** Exempt from the rate limit (health probes). */
    unlimited?: boolean
  }

  interface ContextExtensions {
    /** Who calls: the credential's user, or anonymous. */
    principal: Principal
  }

  /** `ctx.services` is everything the service instance holds (src/app-deps.ts). */
  interface ServiceExtensions extends AppDeps {}
}

declare module './core/resources/resource.js' {
  interface ResourceAccess {
    /**
     * Who may list and read it, and who may create and change it: any
     * signed-in user, oneself (the user whose {id} is in the path) or an
     * admin, and an admin only. The role scopes follow (src/auth/scopes.ts).
     */
    read: 'any' | 'admin-or-self' | 'admin'
    write: 'any' | 'admin-or-self' | 'admin'
  }
}
