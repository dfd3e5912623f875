// last_used_at is kept to the minute. The UPDATE that sets it is guarded in
// SQL (it changes nothing within a minute of the last write), but sending it
// on every request would still cost a statement per request. This
// remembers, per key, when this process last sent it, so it is sent at most
// once a minute per key and process (deps.apiKeyUse). Other instances write too; the SQL
// guard keeps them from writing more than once a minute between them.
//
// Bounded like the caches: beyond `max` keys, the one written longest ago is
// forgotten (it is written again at its next
// use, which the SQL guard makes harmless).

import { BoundedMap } from '../../core/lib/bounded-map.js'

export class LastUsedWrites {
  private readonly writtenAt: BoundedMap<number, number>

  constructor(
    readonly max: number,
    readonly intervalMs = 60_000,
  ) {
    this.writtenAt = new BoundedMap(max)
  }

  get size(): number {
    return this.writtenAt.size
  }

  /**
   * Whether to write last_used_at of this key now (`now` in ms). True counts
   * as written, so requests arriving meanwhile do not write it too; call
   * `failed` if the write does not happen.
   */
  claim(apiKeyId: number, now: number): boolean {
    const last = this.writtenAt.get(apiKeyId)
    if (last !== undefined && now - last < this.intervalMs) return false
    // Deleted and set again: the order stays the order of the writes, oldest first.
    this.writtenAt.delete(apiKeyId)
    this.writtenAt.set(apiKeyId, now)
    return true
  }

  /** The write claimed did not happen: the next use tries again. */
  failed(apiKeyId: number): void {
    this.writtenAt.delete(apiKeyId)
  }
}
