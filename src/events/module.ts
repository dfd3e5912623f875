import type { AppModule } from '../app-module.js'
import { eventRoutes } from './feed.js'
import type { EventHub } from './hub.js'
import type { EventPublisher } from './publisher.js'
import type { EventRetention } from './retention.js'
import { eventStreamRoutes } from './stream-routes.js'

/** The event log: publishing the outbox in commit order, the feed and its streams, and retention. */
export const eventsModule: AppModule<{
  eventPublisher: EventPublisher
  eventHub: EventHub
  retention: EventRetention
}> = {
  name: 'events',
  routes: [...eventRoutes, ...eventStreamRoutes],
  problems: { too_many_streams: { status: 503, title: 'Too many event streams' } },
  scopes: [{ scope: 'events:read', roles: ['admin'] }],
  components: (s) => [s.eventPublisher, s.eventHub.reader],
  streams: (s) => [s.eventHub],
  jobs: (s) => [...s.eventPublisher.jobs, ...s.eventHub.jobs, ...s.retention.jobs],
}
