import type { AnyRoute } from '../core/http/route.js'
import type { Resource } from '../core/resources/resource.js'
import { deliveryRoutes } from './deliveries.js'
import { webhookResourceRoutes, webhookWithSecret } from './resource.js'
import { rotateSecretRoute } from './rotate-secret.js'

/**
 * Every webhook route of a webhooks declaration (src/registry.ts): the subscriptions, the rotation of their secrets,
 * and their deliveries.
 */
export function webhookRoutes(webhooks: Resource): AnyRoute[] {
  const withSecret = webhookWithSecret(webhooks)
  return [
    ...webhookResourceRoutes(webhooks, withSecret),
    rotateSecretRoute(webhooks, withSecret),
    ...deliveryRoutes(webhooks),
  ]
}
