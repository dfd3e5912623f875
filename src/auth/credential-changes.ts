import { randomBytes } from 'node:crypto'
import type { Sql } from 'postgres'
import { backgroundConnection } from '../core/db/connect.js'
import type { ApiKeyCache } from '../api-keys/key-cache.js'
import { describeError, type Logger } from '../core/log.js'
import { applyRevocation, type RevocationList, type RevocationRow } from './revocations.js'

// Keeps what an instance remembers about credentials right across instances:
// its API key cache (src/api-keys/key-cache.ts) and its list of revocations
// (src/auth/revocations.ts), which is what lets a JWT be checked without a
// database read. Triggers (sql/004, sql/005) notify CHANGES_CHANNEL in the
// transaction of every change that revokes or alters a credential;
// PostgreSQL delivers the notification to every listening session at commit.
// Payloads: `keys 3,4`, `users 7`, `all` (API keys); `sessions 5,6`,
// `epochs 7:2,8:deleted`, `revocations` (revocations); and `sync …`, the
// markers of this module, which change nothing.
//
// What is remembered is trusted only while this instance can prove that it
// hears every change (`trusted`). Otherwise it fails closed: API keys and
// JWT revocation are read from the database on every request, and /readyz
// says why (`status`). Trust needs all of:
// - the listening connection is up: postgres.js `sql.listen` keeps one
//   connection and opens it again after it drops, calling `onlisten`;
//   notifications sent while it was away are lost, so
// - the revocations were loaded from the table after that connection
//   started listening (whatever was missed is in the table), and the API
//   key cache started empty;
// - a marker of ours comes back: a heartbeat notifies one through the pool
//   every HEARTBEAT_MS and must hear it within CATCH_UP_TIMEOUT_MS.
//   Notifications arrive in commit order, so a marker heard proves that every
//   change committed before it was sent has been applied. A connection that
//   is up but delivers nothing (a half-dead socket, a pooler in between, a
//   frozen backend) is caught by this within HEARTBEAT_MS + CATCH_UP_TIMEOUT_MS.
//
// A request that revokes answers only once its instance has heard the change
// (`caughtUp`): that instance refuses the credential from its answer on.
// Other instances were notified at the same commit and follow within their
// delivery delay (milliseconds; at most the heartbeat bound, after which they
// stop trusting what they remember).
//
// The heartbeat's statements go through a connection of their own, so that
// they neither wait behind requests in the pool nor count in
// db_queries_total; the markers of revoking requests go through the pool,
// like the changes they follow.
//
// The listening connection is `listenSql`'s (AppDeps): a session on
// DATABASE_LISTEN_URL when DATABASE_URL goes through a transaction pooler,
// which would lend the LISTEN's server connection to other clients after
// the statement and deliver nothing. The markers and the loads go through
// DATABASE_URL like the changes they follow: a marker heard proves that the
// pooler's server connections and the listener see the same database.
//
// Nothing here throws or leaves a promise rejected: with the database down,
// postgres.js keeps trying, and the failures are logged once per outage.
// `listenSql.end()` (src/shutdown.ts) closes the listening connection;
// `stop()` the heartbeat and its connection.

export const CHANGES_CHANNEL = 'api_key_changes'

/** How long a marker may take to come back before the feed is taken for dead. */
export const CATCH_UP_TIMEOUT_MS = 2000
/** How often a marker is sent when nothing else sends one. */
export const HEARTBEAT_MS = 1000
/** Expired rows of the revocations table are deleted every this many heartbeats, a batch at a time. */
const PURGE_EVERY_BEATS = 10
const PURGE_BATCH = 1000

const KEY_CHANGE = /^(keys|users) ([0-9]{1,19}(?:,[0-9]{1,19})*)$/
const SYNC = /^sync [A-Za-z0-9_-]{1,64}$/

/**
 * Applies one API key change to the cache. A payload this build does not know
 * (`all`, or a newer migration's) empties the cache, which is always safe,
 * and returns false: the caller reloads what else it remembers.
 */
export function applyKeyChange(cache: ApiKeyCache, payload: string): boolean {
  if (SYNC.test(payload)) return true
  const m = KEY_CHANGE.exec(payload)
  if (!m) {
    cache.clear()
    return false
  }
  const ids = m[2]!.split(',').map(Number)
  if (m[1] === 'keys') cache.evictKeys(ids)
  else cache.evictUsers(ids)
  return true
}

export interface CredentialChanges {
  /** True while what this instance remembers about credentials may be used. */
  readonly trusted: boolean
  /** Why it is not trusted, for /readyz; undefined when trusted. */
  readonly distrustReason: string | undefined
  /**
   * Resolves once this instance has applied every credential change
   * committed before the call: it notifies a marker and waits for it to come
   * back. At once when nothing remembered is trusted anyway. Never rejects;
   * if the marker does not come back within CATCH_UP_TIMEOUT_MS the feed is
   * taken for dead until one does.
   */
  caughtUp(): Promise<void>
  /** Stops the heartbeat and closes its connection (the listening connection ends with `listenSql`). */
  stop(timeoutSeconds?: number): Promise<void>
}

export interface CredentialChangesOptions {
  /** True while the service shuts down: the connection closing then is expected, not worth a warning. */
  lifecycle: { shuttingDown: boolean }
  catchUpTimeoutMs?: number
  heartbeatMs?: number
}

/** Starts listening on a connection of `listenSql`'s own, and the heartbeat on one of `sql`'s settings; returns at once. */
export function listenForCredentialChanges(
  sql: Sql,
  listenSql: Sql,
  keys: ApiKeyCache,
  revocations: RevocationList,
  log: Logger,
  options: CredentialChangesOptions,
): CredentialChanges {
  const { lifecycle, catchUpTimeoutMs = CATCH_UP_TIMEOUT_MS, heartbeatMs = HEARTBEAT_MS } = options
  /** Why nothing remembered may be used; undefined while trusted. */
  let distrust: string | undefined = 'not listening yet'
  let listening = false
  /** Counts connections and losses: work started under one must not grant trust under another. */
  let connection = 0
  let loadedFor = -1
  let stalled = false
  let blind = false
  const ownMarkers = `sync ${randomBytes(6).toString('base64url')}-`
  let markers = 0
  const waiting = new Map<string, () => void>()
  let background: Sql | undefined
  let stopped = false
  const own = () => (background ??= backgroundConnection(sql))

  const setTrusted = (reason: string | undefined) => {
    if (reason === distrust) return
    const was = distrust
    distrust = reason
    if (reason === undefined) {
      // Whatever was cached while distrusted may predate a change we missed.
      keys.resume()
      log[was === 'not listening yet' ? 'debug' : 'info']('credential changes heard again; remembered credentials trusted (API key cache emptied and on)')
    } else {
      keys.suspend()
      if (was === undefined && !lifecycle.shuttingDown) log.warn(`not trusting remembered credentials: ${reason}; they are read from the database until this is resolved`)
    }
  }
  const mayTrust = () => listening && !blind && loadedFor === connection && !stalled

  const onNotify = (payload: string) => {
    try {
      if (payload.startsWith(ownMarkers)) {
        waiting.get(payload)?.()
        // A marker of ours, even a late one, proves the connection delivers, in order: whatever came before it has been applied.
        if (stalled) {
          stalled = false
          if (mayTrust()) setTrusted(undefined)
        }
        return
      }
      if (applyRevocation(revocations, payload) || applyKeyChange(keys, payload)) return
      // `all`, `revocations`, or a payload this build does not know: the keys are forgotten; reload the revocations.
      loadedFor = -1
      setTrusted('a change too large to name was announced; reloading revocations')
      void beat()
    } catch (err) {
      // Cannot happen; but a throw here would surface in postgres.js's socket handler.
      keys.clear()
      loadedFor = -1
      setTrusted('applying a credential change failed')
      log.error('applying a credential change failed', describeError(err))
    }
  }
  const onListen = () => {
    if (blind) return
    connection++
    listening = true
    log.debug('listening for credential changes')
    void beat()
  }
  const onAway = (fields?: Record<string, unknown>) => {
    connection++
    const wasListening = listening
    listening = false
    // Nobody need wait for a marker now: nothing is served from memory.
    for (const release of waiting.values()) release()
    if (wasListening && !lifecycle.shuttingDown) log.warn('not listening for credential changes; the connection dropped', fields)
    setTrusted('not listening for credential changes')
  }

  /** Loads every revocation a JWT may still need, for the connection current when it started. */
  async function load(): Promise<void> {
    const forConnection = connection
    const rows = await own()<RevocationRow[]>`
      SELECT kind, user_id, session_id, epoch, (extract(epoch FROM expires_at) * 1000)::float8 AS expires_at
      FROM revocations WHERE expires_at > now()`
    for (const row of rows) revocations.add(row)
    if (forConnection === connection) loadedFor = forConnection
  }

  /** Sends a marker through `db`; true when it came back within the time-out (or nobody needs it any more). */
  async function roundTrip(db: Sql): Promise<boolean> {
    const marker = `${ownMarkers}${++markers}`
    // Waited for from before the statement: the marker may arrive before the statement's own answer.
    const heard = new Promise<boolean>((resolve) => waiting.set(marker, () => resolve(true)))
    let timer: NodeJS.Timeout | undefined
    try {
      await db`SELECT pg_notify(${CHANGES_CHANNEL}, ${marker})`
      const timedOut = new Promise<boolean>((resolve) => (timer = setTimeout(resolve, catchUpTimeoutMs, false)))
      return await Promise.race([heard, timedOut])
    } finally {
      clearTimeout(timer)
      waiting.delete(marker)
    }
  }

  function noteStall(): void {
    if (stalled || !listening) return
    stalled = true
    setTrusted(`a marker of this instance did not come back within ${catchUpTimeoutMs} ms`)
    log.warn('the listener for credential changes did not hear this instance within the time-out', { timeout_ms: catchUpTimeoutMs })
  }

  let beating: Promise<void> | undefined
  let beats = 0
  /**
   * One heartbeat: load what is missing, prove delivery, sweep. Never two at
   * once; never rejects. One that hangs (a statement waiting for a connection
   * that does not come) is given up after BEAT_LIMIT_MS so the next can start.
   */
  function beat(): Promise<void> {
    if (beating) return beating
    let limit: NodeJS.Timeout | undefined
    const gaveUp = new Promise<void>((resolve) => (limit = setTimeout(resolve, catchUpTimeoutMs * 2)))
    beating = Promise.race([beatOnce(), gaveUp]).finally(() => {
      clearTimeout(limit)
      beating = undefined
    })
    return beating
  }
  async function beatOnce(): Promise<void> {
      try {
        if (!listening || blind || stopped) return
        const forConnection = connection
        if (loadedFor !== connection) await load()
        if (loadedFor !== forConnection) return
        if (await roundTrip(own())) {
          if (forConnection === connection) stalled = false
          if (mayTrust()) setTrusted(undefined)
        } else if (forConnection === connection) {
          noteStall()
        }
        revocations.sweep()
        // The first heartbeat purges too: an instance that starts cleans up what stopped ones left.
        if (beats++ % PURGE_EVERY_BEATS === 0) await own()`DELETE FROM revocations WHERE id IN (SELECT id FROM revocations WHERE expires_at < now() LIMIT ${PURGE_BATCH})`
      } catch (err) {
        // The database is unreachable: the heartbeat tries again; requests fail closed meanwhile.
        if (!lifecycle.shuttingDown) log.debug('credential changes heartbeat failed', describeError(err))
        if (listening) noteStall()
      }
  }
  const heartbeat = setInterval(() => void beat(), heartbeatMs)
  heartbeat.unref()

  const listened = listenSql.listen(CHANGES_CHANNEL, onNotify, onListen)
  // sql.listen creates its connection's instance synchronously, before its first await.
  if (!watchClose(listenSql, () => onAway())) {
    blind = true
    setTrusted('cannot tell when the listening connection drops (postgres.js changed?)')
  }
  // A failed first attempt: postgres.js goes on trying, and calls onListen when it succeeds.
  listened.then(() => {}, (err: unknown) => {
    if (!lifecycle.shuttingDown) log.warn('cannot listen for credential changes yet; remembered credentials are not trusted', describeError(err))
    onAway()
  })

  return {
    get trusted() {
      return distrust === undefined
    },
    get distrustReason() {
      return distrust
    },
    async caughtUp() {
      if (distrust !== undefined) return
      const forConnection = connection
      try {
        if (!(await roundTrip(sql)) && forConnection === connection) noteStall()
      } catch (err) {
        // The change is committed and notified all the same; only the wait is lost.
        log.warn('could not check that the listener for credential changes is caught up', describeError(err))
        noteStall()
      }
    },
    async stop(timeoutSeconds = 5) {
      stopped = true
      clearInterval(heartbeat)
      await background?.end({ timeout: timeoutSeconds })
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
