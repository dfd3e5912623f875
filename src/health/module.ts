import type { AppModule } from '../app-module.js'
import { healthRoutes } from './routes.js'

/** /healthz and /readyz, for load balancers and orchestrators. */
export const healthModule: AppModule = { name: 'health', routes: healthRoutes }
