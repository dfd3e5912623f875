import type { AppModule } from '../app-module.js'
import { metricsRoutes } from './routes.js'

/** GET /metrics in Prometheus' text format, for admins and credentials with metrics:read. */
export const metricsModule: AppModule = {
  name: 'metrics',
  routes: metricsRoutes,
  scopes: [{ scope: 'metrics:read', roles: ['admin'] }],
}
