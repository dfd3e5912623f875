import type { ResourceModule } from '../resource-module.js'

// The event types a webhook may ask for: the writes of the registered
// resources (each module says which of its own), and the events of sessions
// and logins, which are written by their own statements
// (src/auth/sessions.ts, src/auth/login-throttle.ts).

export const nonResourceEventTypes: readonly string[] = ['session.created', 'session.revoked', 'login.failed']

export const subscribableEventTypes = (modules: readonly ResourceModule[]): readonly string[] =>
  [...modules.flatMap((m) => m.subscribable), ...nonResourceEventTypes]
