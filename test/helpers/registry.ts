import { buildRegistry } from '../../src/registry.js'
import { applicationModules } from '../../src/modules.js'

/**
 * The application's registry, as createService builds it, for tests that need its routes or scopes without a server.
 */
export const applicationRegistry = buildRegistry(applicationModules)
