import type { Clock } from '../../src/core/lib/clock.js'

/**
 * The service's clock in a test: the real time plus an offset the test moves
 * forward, so that an expiry the service checks itself (a JWT's exp, a
 * stream's grant, a cached API key's expires_at) comes without waiting it
 * out. What the database stores it compares with its own now(): a test moves
 * such rows back in time instead (docs/architecture.md, "Time").
 */
export class TestClock implements Clock {
  private offsetMs = 0

  now(): number {
    return Date.now() + this.offsetMs
  }

  advance(ms: number): void {
    if (ms < 0) throw new RangeError('a clock only moves forward')
    this.offsetMs += ms
  }
}
