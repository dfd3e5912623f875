import { apiKeyModule } from './api-keys/resource.js'
import { productModule } from './products/resource.js'
import type { ResourceModule } from './resource-module.js'
import { userModule } from './users/module.js'

// The application's resources: a new one is a migration (sql/), a
// declaration file with its module, and a line here. Routes, scopes, event
// types, problem codes and OpenAPI components follow (src/registry.ts);
// webhooks come after these, since what they may subscribe to is derived from them.

export const applicationResources: readonly ResourceModule[] = [
  userModule,
  productModule,
  apiKeyModule,
]
