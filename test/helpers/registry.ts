import { buildRegistry } from '../../src/registry.js'
import { applicationResources } from '../../src/resources.js'

/** The application's registry, as createService builds it, for tests that need its routes or scopes without a server. */
export const applicationRegistry = buildRegistry(applicationResources)
