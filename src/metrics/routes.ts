import Type from 'typebox'
import { defineRoute } from '../core/http/route.js'

// Prometheus scrapes this; admin only (the figures describe the whole service), with the
// metrics:read scope: an admin's key made for something else (read access to a resource) cannot read them.
export const metricsRoutes = [
  defineRoute({
    method: 'GET',
    path: '/metrics',
    operationId: 'getMetrics',
    access: { kind: 'protected', scope: 'metrics:read', who: 'admin' },
    summary: 'Request, database and process figures in Prometheus text format',
    responses: {
      200: { description: 'Prometheus text format 0.0.4', schema: Type.String(), contentType: 'text/plain' },
    },
    async handle({ services }) {
      return {
        status: 200,
        headers: { 'cache-control': 'no-store' },
        text: { contentType: 'text/plain; version=0.0.4; charset=utf-8', content: await services.metricsReport() },
      }
    },
  }),
]
