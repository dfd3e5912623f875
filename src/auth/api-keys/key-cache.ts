import type { Principal } from '../principal.js'
import { BoundedMap } from '../../core/lib/bounded-map.js'

// API keys this instance has read, by the SHA-256 of the key, so that a
// request with a known key costs no database read (deps.apiKeyCache).
//
// It is only as good as what tells it about changes: PostgreSQL notifies
// every change that alters or revokes a key (sql/004_api_key_changes.sql),
// and src/auth/revocation/credential-changes.ts applies the notifications here. While that
// listener is not connected, notifications are lost, so the cache is
// suspended: it serves nothing and takes nothing, and every key is read from
// the database. When the listener is back, the cache starts empty.
//
// A read races with the notifications: a read that started before a key was
// revoked may return after the revocation's notification was applied, and
// must not put the revoked key back. Every eviction, clearing, suspension or
// resumption moves `generation` on; a key read from the database is kept only
// if the generation is the one seen before the read began (`remember`).
// Revocations are rare, so this seldom leaves a key out.
//
// `expiresAt` is checked on every hit (an expired key stays in, refused
// without a database read, until it is evicted). Bounded: beyond `max`
// entries the oldest is dropped; and an entry is read again from the
// database once it is MAX_AGE_MS old, so that even a change no notification
// announced (a bug, a hand-made edit with triggers off) holds within a bound.

export interface CachedApiKey {
  /** The Principal every request with this key gets: shared, never changed. */
  principal: Principal & { kind: 'user' }
  userId: number
  apiKeyId: number
  /** ms since the epoch; null: the key does not expire. */
  expiresAt: number | null
}

/** How long a key is served from memory before it is read again. */
export const MAX_AGE_MS = 60_000

export class ApiKeyCache {
  private readonly byHash: BoundedMap<string, CachedApiKey>
  private readonly rememberedAt = new Map<string, number>()
  private readonly byKeyId = new Map<number, string>()
  private readonly byUserId = new Map<number, Set<string>>()
  private serving = false
  private generationCount = 0

  constructor(
    readonly max: number,
    private readonly clock: () => number = Date.now,
  ) {
    this.byHash = new BoundedMap(max, (hash, entry) => this.forgetIndexes(hash, entry))
  }

  get size(): number {
    return this.byHash.size
  }

  /** Whether the cache serves: the listener for key changes is connected. */
  get active(): boolean {
    return this.serving
  }

  /** Read before a database lookup, handed back to `remember` after it. */
  get generation(): number {
    return this.generationCount
  }

  /**
   * The key with this hash (`hash` as text, e.g. base64): its entry;
   * 'expired' when the entry's expiry has passed at `now` (ms); undefined
   * when it is not known or the cache is suspended (read the database).
   */
  lookup(hash: string, now: number): CachedApiKey | 'expired' | undefined {
    if (!this.serving) return undefined
    const entry = this.byHash.get(hash)
    if (!entry) return undefined
    if (now - this.rememberedAt.get(hash)! >= MAX_AGE_MS) {
      this.remove(hash)
      return undefined
    }
    if (entry.expiresAt !== null && entry.expiresAt <= now) return 'expired'
    return entry
  }

  /**
   * Keeps a key read from the database, unless something changed
   * since `generation` was read (or the cache is suspended).
   */
  remember(hash: string, entry: CachedApiKey, generation: number): void {
    if (!this.serving || generation !== this.generationCount) return
    this.remove(hash)
    this.byHash.set(hash, entry)
    this.rememberedAt.set(hash, this.clock())
    this.byKeyId.set(entry.apiKeyId, hash)
    let hashes = this.byUserId.get(entry.userId)
    if (!hashes) this.byUserId.set(entry.userId, (hashes = new Set()))
    hashes.add(hash)
  }

  /** These keys were deleted or changed. */
  evictKeys(apiKeyIds: readonly number[]): void {
    this.generationCount++
    for (const id of apiKeyIds) {
      const hash = this.byKeyId.get(id)
      if (hash !== undefined) this.remove(hash)
    }
  }

  /** These users were deleted, or their role changed: all their keys go. */
  evictUsers(userIds: readonly number[]): void {
    this.generationCount++
    for (const id of userIds) {
      for (const hash of [...(this.byUserId.get(id) ?? [])]) this.remove(hash)
    }
  }

  /** Forgets every key (a change too large to name keys, or one this build does not understand). */
  clear(): void {
    this.generationCount++
    this.byHash.clear()
    this.rememberedAt.clear()
    this.byKeyId.clear()
    this.byUserId.clear()
  }

  /** The listener is disconnected: changes may go unnoticed from now on. */
  suspend(): void {
    this.serving = false
    this.clear()
  }

  /** The listener is connected (again): start empty, since changes made while it was away were not heard. */
  resume(): void {
    this.clear()
    this.serving = true
  }

  private remove(hash: string): void {
    const entry = this.byHash.get(hash)
    if (!entry) return
    this.byHash.delete(hash)
    this.forgetIndexes(hash, entry)
  }

  private forgetIndexes(hash: string, entry: CachedApiKey): void {
    this.rememberedAt.delete(hash)
    if (this.byKeyId.get(entry.apiKeyId) === hash) this.byKeyId.delete(entry.apiKeyId)
    const hashes = this.byUserId.get(entry.userId)
    hashes?.delete(hash)
    if (hashes?.size === 0) this.byUserId.delete(entry.userId)
  }
}
