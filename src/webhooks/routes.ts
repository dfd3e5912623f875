import type { AnyRoute } from '../core/http/route.js'
import { deliveryRoutes } from './deliveries.js'
import { webhookResourceRoutes } from './resource.js'
import { rotateSecretRoute } from './rotate-secret.js'

/** Every webhook route: the subscriptions, the rotation of their secrets, and their deliveries. */
export const webhookRoutes: AnyRoute[] = [...webhookResourceRoutes, rotateSecretRoute, ...deliveryRoutes]
