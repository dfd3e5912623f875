import { apiKeys } from '../api-keys/resource.js'
import { products } from '../products/resource.js'
import { users } from '../users/resource.js'

// The event types a webhook may ask for: the writes of the declared
// resources (from their declarations, so a new resource's events are one line
// here), and the events of sessions and logins, which are written by their
// own statements (src/auth/sessions.ts, src/auth/login-throttle.ts).

const ofResource = (r: { events: { created: string; updated: string; deleted: string } }) => [r.events.created, r.events.updated, r.events.deleted]

export const subscribableEventTypes: readonly string[] = [
  ...ofResource(users),
  ...ofResource(products),
  ...ofResource(apiKeys).filter((t) => t !== apiKeys.events.updated), // keys are never changed, only revoked
  'session.created',
  'session.revoked',
  'login.failed',
]
