import type { AppDeps } from './app-deps.js'
import type { AppModule } from './app-module.js'
import { apiKeysModule } from './api-keys/resource.js'
import { authModule } from './auth/module.js'
import { batchModule } from './batch/module.js'
import { eventsModule } from './events/module.js'
import { healthModule } from './health/module.js'
import { mailModule } from './mail/module.js'
import { metricsModule } from './metrics/module.js'
import { productsModule } from './products/module.js'
import { usersModule } from './users/module.js'
import { webhooksModule } from './webhooks/module.js'

// The application, module by module (src/app-module.ts says what a module
// may add). A new resource is a migration (sql/), a declaration with its
// module, and a line here; its routes, scopes, event types, problem codes and
// OpenAPI components follow (src/registry.ts).
//
// The order is the order components start (each may use what starts before
// it, and stops after it) and routes are listed: mail before auth, whose
// password resets queue mail while they stop; events before webhooks, whose
// deliveries the publisher wakes.

export const applicationModules = [
  healthModule,
  mailModule,
  authModule,
  usersModule,
  productsModule,
  apiKeysModule,
  batchModule,
  eventsModule,
  webhooksModule,
  metricsModule,
] as const satisfies ReadonlyArray<AppModule<AppDeps>>
