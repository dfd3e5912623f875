import type { AppModule } from '../app-module.js'
import { defineWebhooks } from './resource.js'
import { webhookRoutes } from './routes.js'
import type { WebhookWorker } from './worker.js'

/**
 * Webhooks: subscriptions to the event types every other module defines (so
 * the declaration is made of them), their secrets and deliveries, and the
 * worker that sends them.
 */
export const webhooksModule: AppModule<{ webhooks: WebhookWorker }> = {
  name: 'webhooks',
  resources: (eventTypes) => {
    const resource = defineWebhooks(eventTypes)
    return [{ resource, routes: webhookRoutes(resource), subscribable: [] }]
  },
  components: (s) => [s.webhooks],
  jobs: (s) => s.webhooks.jobs,
}
