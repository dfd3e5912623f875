// The one bounded map of the service, behind every per-instance cache (JWTs
// verified, API keys read, last_used_at writes, rate-limit windows, compiled
// list statements): a Map that holds at most `max` entries. A Map iterates in
// insertion order, so the oldest entry is the first; `set` of a new key past
// `max` drops it, and `refresh` moves a key last for least-recently-used
// eviction. An evicted entry is handed to `onEvict`, for indexes kept beside it.

export class BoundedMap<K, V> {
  private readonly entries = new Map<K, V>()

  constructor(
    readonly max: number,
    private readonly onEvict?: (key: K, value: V) => void,
  ) {
    if (!Number.isInteger(max) || max < 1)
      throw new RangeError(`BoundedMap: max must be a positive integer, not ${max}`)
  }

  get size(): number {
    return this.entries.size
  }

  get(key: K): V | undefined {
    return this.entries.get(key)
  }

  has(key: K): boolean {
    return this.entries.has(key)
  }

  /** Sets the value; a new key past `max` evicts the oldest first. An existing key keeps its place. */
  set(key: K, value: V): void {
    if (!this.entries.has(key)) {
      while (this.entries.size >= this.max) this.evictOldest()
    }
    this.entries.set(key, value)
  }

  /** Moves the key last, as if set now (least-recently-used order). */
  refresh(key: K): void {
    const value = this.entries.get(key)
    if (value === undefined && !this.entries.has(key)) return
    this.entries.delete(key)
    this.entries.set(key, value as V)
  }

  delete(key: K): boolean {
    return this.entries.delete(key)
  }

  clear(): void {
    this.entries.clear()
  }

  keys(): IterableIterator<K> {
    return this.entries.keys()
  }

  /** Oldest first; deleting the current entry while iterating is safe. */
  [Symbol.iterator](): IterableIterator<[K, V]> {
    return this.entries[Symbol.iterator]()
  }

  private evictOldest(): void {
    const [key, value] = this.entries.entries().next().value as [K, V]
    this.entries.delete(key)
    this.onEvict?.(key, value)
  }
}
