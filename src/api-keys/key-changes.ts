import { randomBytes } from 'node:crypto'
import type { Sql } from 'postgres'
import { describeError, type Logger } from '../log.js'
import type { ApiKeyCache } from './key-cache.js'

// Keeps an instance's API key cache right across instances. Triggers
// (sql/004_api_key_changes.sql) notify KEY_CHANGES_CHANNEL in the transaction
// of every change that revokes or alters a key; PostgreSQL delivers the
// notification to every listening session at commit (a rolled-back change
// notifies nobody). Payloads: `keys 3,4`, `users 7`, or `all`; and `sync …`,
// the markers of `caughtUp` below, which change nothing.
//
// The listening uses postgres.js `sql.listen`: one dedicated connection,
// opened again with backoff after it drops, each time calling `onlisten`.
// Notifications sent while it was away are lost, so:
// - on every (re)connection (onlisten) the cache starts empty and serves;
// - from the moment the connection drops, the cache is suspended (every key
//   is read from the database). postgres.js has no callback for the drop
//   itself, so `watchClose` wraps the close hook of the instance `sql.listen`
//   keeps (see there). If that is not possible (a postgres.js whose insides
//   differ), the cache is never turned on: slower, never wrong.
// A drop the operating system has not noticed (a silent network partition)
// is seen when `caughtUp` waits in vain, or when TCP keep-alive gives up on
// the connection (postgres.js sets keep_alive to 60 s); meanwhile that
// instance cannot reach the database through its pool either.
//
// A notification arrives a moment after the commit, not with it: on a busy
// 2-core machine, a request sent right after a DELETE's 204 still found the
// key cached in 1 case out of 8, on the very instance that deleted it. So a
// request that revokes answers only once its instance has heard the change
// (`caughtUp`): that instance refuses the key from its answer on. The other
// instances were notified at the same commit and act on it after their own
// delivery delay (in the same measurement, 1 request in 100 sent to another
// instance right after the 204 still got in). Making that strict would need
// every instance to acknowledge every change; this does not.
//
// Nothing here throws or leaves a promise rejected: with the database down,
// postgres.js keeps trying, and the failures are logged once per outage.
// `sql.end()` (src/shutdown.ts) also closes this connection, at once.

export const KEY_CHANGES_CHANNEL = 'api_key_changes'

/** How long `caughtUp` waits for its marker before it gives up on the listener. */
export const CATCH_UP_TIMEOUT_MS = 2000

const CHANGE = /^(keys|users) ([0-9]{1,19}(?:,[0-9]{1,19})*)$/
const SYNC = /^sync [A-Za-z0-9_-]{1,64}$/

/** Applies one change notification to the cache. */
export function applyKeyChange(cache: ApiKeyCache, payload: string): void {
  if (SYNC.test(payload)) return
  const m = CHANGE.exec(payload)
  // `all`, or a payload this build does not know (a newer migration): forgetting everything is always safe.
  if (!m) return cache.clear()
  const ids = m[2]!.split(',').map(Number)
  if (m[1] === 'keys') cache.evictKeys(ids)
  else cache.evictUsers(ids)
}

export interface KeyChanges {
  /**
   * Resolves once this instance has applied every key change committed
   * before the call: it notifies a marker and waits for it to come back
   * (notifications arrive in commit order). At once when the cache is off.
   * Never rejects; if the marker does not come back within
   * CATCH_UP_TIMEOUT_MS, the listener is taken for dead and the cache is
   * suspended until a marker of ours arrives or the listener reconnects.
   */
  caughtUp(): Promise<void>
}

export interface KeyChangesOptions {
  /** True while the service shuts down: the connection closing then is expected, not worth a warning. */
  lifecycle: { shuttingDown: boolean }
  catchUpTimeoutMs?: number
}

/** Starts listening for key changes on a connection of its own; returns at once. */
export function listenForKeyChanges(sql: Sql, cache: ApiKeyCache, log: Logger, options: KeyChangesOptions): KeyChanges {
  const { lifecycle, catchUpTimeoutMs = CATCH_UP_TIMEOUT_MS } = options
  let away = false
  let blind = false
  /** Suspended by a marker that did not come back, on a connection that may still be up. */
  let stalled = false
  const ownMarkers = `sync ${randomBytes(6).toString('base64url')}-`
  let markers = 0
  const waiting = new Map<string, () => void>()

  const onNotify = (payload: string) => {
    try {
      if (payload.startsWith(ownMarkers)) {
        waiting.get(payload)?.()
        // A marker of ours, even a late one, proves the connection delivers, in order: whatever came before it has been applied.
        if (stalled && !away && !blind) {
          cache.resume()
          log.info('the listener for API key changes caught up; API key cache emptied and on')
        }
        stalled = false
        return
      }
      applyKeyChange(cache, payload)
    } catch (err) {
      // Cannot happen; but a throw here would surface in postgres.js's socket handler.
      cache.clear()
      log.error('applying an API key change failed; cache emptied', describeError(err))
    }
  }
  const onListen = () => {
    if (blind) return
    cache.resume()
    if (away || stalled) log.info('listening for API key changes again; API key cache emptied and on')
    else log.debug('listening for API key changes; API key cache on')
    away = stalled = false
  }
  const onAway = (fields?: Record<string, unknown>) => {
    cache.suspend()
    // Nobody need wait for a marker now: nothing is served from the cache.
    for (const release of waiting.values()) release()
    if (!away && !lifecycle.shuttingDown) log.warn('not listening for API key changes; API keys are read from the database until it is back', fields)
    away = true
  }

  const listening = sql.listen(KEY_CHANGES_CHANNEL, onNotify, onListen)
  // sql.listen creates its connection's instance synchronously, before its first await.
  if (!watchClose(sql, () => onAway())) {
    blind = true
    cache.suspend()
    log.warn('cannot tell when the connection listening for API key changes drops (postgres.js changed?); the API key cache stays off')
  }
  // A failed first attempt: postgres.js goes on trying, and calls onListen when it succeeds.
  listening.then(() => {}, (err: unknown) => onAway(describeError(err)))

  return {
    async caughtUp() {
      if (!cache.active) return
      const marker = `${ownMarkers}${++markers}`
      // Waited for from before the statement: the marker may arrive before the statement's own answer.
      const heard = new Promise<boolean>((resolve) => waiting.set(marker, () => resolve(true)))
      let timer: NodeJS.Timeout | undefined
      try {
        await sql`SELECT pg_notify(${KEY_CHANGES_CHANNEL}, ${marker})`
        const timedOut = new Promise<boolean>((resolve) => (timer = setTimeout(resolve, catchUpTimeoutMs, false)))
        if (await Promise.race([heard, timedOut])) return
        if (!cache.active) return
        stalled = true
        cache.suspend()
        log.warn('the listener for API key changes did not hear this instance within the time-out; API keys are read from the database until it does', { timeout_ms: catchUpTimeoutMs })
      } catch (err) {
        // The change is committed and notified all the same; only the wait is lost.
        log.warn('could not check that the listener for API key changes is caught up', describeError(err))
      } finally {
        clearTimeout(timer)
        waiting.delete(marker)
      }
    },
  }
}

/**
 * Calls `onClose` whenever the connection of `sql.listen` closes. postgres.js
 * 3.4 keeps that connection in a postgres instance of its own, `listen.sql`
 * (a property of the `sql.listen` function), whose `options.onclose` it calls
 * on every close and then listens again. Undocumented, hence the checks: false
 * when the shape is not the one expected.
 */
function watchClose(sql: Sql, onClose: () => void): boolean {
  const instance = (sql.listen as unknown as { sql?: { options?: { onclose?: unknown } } }).sql
  const options = instance?.options
  const original = options?.onclose
  if (!options || typeof original !== 'function') return false
  options.onclose = (...args: unknown[]) => {
    onClose()
    return (original as (...a: unknown[]) => unknown)(...args)
  }
  return true
}
