import type { ResourceModule } from '../resource-module.js'

// The event types a webhook may ask for: the writes of the registered
// resources (each module says which of its own), and the events of sessions
// and logins, which are written by their own statements
// (src/auth/sessions/sessions.ts, src/auth/login/login-throttle.ts).

export const nonResourceEventTypes: readonly string[] = [
  'session.created', 'session.revoked', 'login.failed',
  // Account recovery (src/auth/recovery/recovery.ts): the user's id only, never a token or a link.
  'user.password_reset_requested', 'user.password_reset', 'user.email_verified',
]

export const subscribableEventTypes = (modules: readonly ResourceModule[]): readonly string[] =>
  [...modules.flatMap((m) => m.subscribable), ...nonResourceEventTypes]
