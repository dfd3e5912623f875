// A fixed one-minute window per key (a credential and its user, or a client
// address when anonymous), kept in memory, so the limit is per instance (see docs/api.md for a
// global limit at the proxy). Memory is bounded: keys live in a Map in the
// order their window started, expired windows are dropped from the front as
// requests arrive, and past `maxKeys` the oldest window is dropped, so a flood
// of distinct clients costs at most maxKeys small entries.

import { BoundedMap } from '../lib/bounded-map.js'

const WINDOW_MS = 60_000

export interface RateDecision {
  allowed: boolean
  limit: number
  remaining: number
  /** Seconds until the window resets. */
  resetSeconds: number
}

export class RateLimiter {
  private readonly windows: BoundedMap<string, { start: number; count: number }>

  constructor(
    private readonly limit: number,
    maxKeys = 100_000,
    private readonly now: () => number = Date.now,
  ) {
    this.windows = new BoundedMap(maxKeys)
  }

  get size(): number {
    return this.windows.size
  }

  /**
   * Counts a request against `key`'s window; `limit` for a bucket
   * with a ceiling of its own (a user's, across its credentials).
   */
  hit(key: string, limit = this.limit): RateDecision {
    const now = this.now()
    this.dropExpired(now)
    let window = this.windows.get(key)
    if (!window) {
      window = { start: now, count: 0 }
      this.windows.set(key, window)
    }
    window.count++
    return {
      allowed: window.count <= limit,
      limit,
      remaining: Math.max(0, limit - window.count),
      resetSeconds: Math.max(1, Math.ceil((window.start + WINDOW_MS - now) / 1000)),
    }
  }

  /** Whether `key` has used up its window, without counting a request. */
  exhausted(key: string): boolean {
    const window = this.windows.get(key)
    return window !== undefined && window.start + WINDOW_MS > this.now() && window.count >= this.limit
  }

  private dropExpired(now: number): void {
    for (const [key, window] of this.windows) {
      if (window.start + WINDOW_MS > now) return
      this.windows.delete(key)
    }
  }
}
