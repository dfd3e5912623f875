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
    /** Everything the service instance holds (src/app-deps.ts). */
    deps: AppDeps
  }
}
