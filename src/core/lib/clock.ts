/**
 * The time the service reads when it decides, in its own code, whether
 * something has expired: a JWT's `exp`, a credential's grant on a stream, a
 * cached API key's `expires_at`, a provider's `auth_time`. One per service
 * (ServiceOptions.clock); tests hand it a clock they move forward instead of
 * waiting out an expiry (test/helpers/clock.ts). What the database stores
 * and compares, it compares with its own `now()`
 * (docs/architecture.md, "Time").
 */
export interface Clock {
  /** Milliseconds since the epoch, as Date.now(). */
  now(): number
}

export const systemClock: Clock = { now: () => Date.now() }
