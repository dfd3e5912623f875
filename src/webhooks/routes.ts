import type { AnyRoute } from '../http/route.js'

// PLACEHOLDER, filled in by the webhook work: POST/GET/PATCH/DELETE /webhooks,
// secret rotation, deliveries and manual retry.
export const webhookRoutes: AnyRoute[] = []
