import type { AppModule } from '../app-module.js'
import { batchRoute } from '../core/http/batch.js'

/**
 * POST /batch (src/core/http/batch.ts): any authenticated caller; each operation is then authorized as it would be
 * alone, so an API key needs the scopes of every operation, and the batch itself asks for none.
 */
export const batchModule: AppModule = {
  name: 'batch',
  routes: [batchRoute({ access: { kind: 'protected', scope: null, who: 'any' } })],
}
