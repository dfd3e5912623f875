import type { Sql } from 'postgres'
import { applyKeyChange } from '../api-keys/key-changes.js'
import type { ApiKeyCache } from '../api-keys/key-cache.js'
import { purgeJob } from '../../core/db/batched-delete.js'
import { backgroundConnection } from '../../core/db/connect.js'
import { watchListenClose } from '../../core/db/listen-close.js'
import type { Component } from '../../core/lifecycle.js'
import { describeError, type Logger } from '../../core/log.js'
import { Job } from '../../core/scheduler.js'
import { ChangeMarkers } from './change-markers.js'
import { CredentialTrust } from './credential-trust.js'
import { applyRevocation, type RevocationList, type RevocationRow } from './revocations.js'
import { withDeadline } from '../../core/lib/settled-by.js'

// Keeps what an instance remembers about credentials right across instances:
// its API key cache (src/auth/api-keys/key-cache.ts) and its list of revocations
// (src/auth/revocation/revocations.ts), which is what lets a JWT be checked without a
// database read. Triggers (sql/004, sql/005) notify CHANGES_CHANNEL in the
// transaction of every change that revokes or alters a credential;
// PostgreSQL delivers the notification to every listening session at commit.
// Payloads: `keys 3,4`, `users 7`, `all` (API keys, src/auth/api-keys/key-changes.ts);
// `sessions 5,6`, `epochs 7:2,8:deleted`, `revocations` (revocations); and
// `sync …`, the markers (src/auth/revocation/change-markers.ts), which change nothing.
//
// What is remembered is trusted only while this instance can prove that it
// hears every change (src/auth/revocation/credential-trust.ts); otherwise it fails
// closed: API keys and JWT revocation are read from the database on every
// request, and /readyz says why. The heartbeat (job `credentials.heartbeat`)
// loads the revocations when a new connection needs them and sends a marker
// through a connection of its own every HEARTBEAT_MS, which must come back
// within CATCH_UP_TIMEOUT_MS: a connection that is up but delivers nothing
// (a half-dead socket, a pooler in between, a frozen backend) is caught
// within HEARTBEAT_MS + CATCH_UP_TIMEOUT_MS.
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
// The listening connection ends with `listenSql` (the pool component);
// `stop` closes the heartbeat's connection.

export const CHANGES_CHANNEL = 'api_key_changes'

/** How long a marker may take to come back before the feed is taken for dead. */
export const CATCH_UP_TIMEOUT_MS = 2000
/** How often a marker is sent when nothing else sends one. */
export const HEARTBEAT_MS = 1000
/** How often expired rows of the revocations table are deleted, a bounded batch at a time (job `revocations.purge`). */
const PURGE_EVERY_MS = 10_000

export interface CredentialChangesOptions {
  /** True while the service shuts down: the connection closing then is expected, not worth a warning. */
  stopping: { draining: boolean }
  catchUpTimeoutMs?: number
  heartbeatMs?: number
}

export class CredentialChanges implements Component {
  readonly name = 'credential-changes'
  private readonly trust: CredentialTrust
  private readonly markers: ChangeMarkers
  private readonly heartbeat: Job<void>
  /** Its repeating jobs, which run once the composition root adds them to the scheduler (src/service.ts). */
  readonly jobs: readonly Job<unknown>[]
  private readonly catchUpTimeoutMs: number
  private readonly quiet: () => boolean
  /** The heartbeat's connection (postgres.js opens it at its first statement). */
  private readonly background: Sql
  private stopped = false

  constructor(
    private readonly sql: Sql,
    private readonly listenSql: Sql,
    private readonly keys: ApiKeyCache,
    private readonly revocations: RevocationList,
    private readonly log: Logger,
    { stopping, catchUpTimeoutMs = CATCH_UP_TIMEOUT_MS, heartbeatMs = HEARTBEAT_MS }: CredentialChangesOptions,
  ) {
    this.catchUpTimeoutMs = catchUpTimeoutMs
    this.quiet = () => stopping.draining
    this.trust = new CredentialTrust(keys, log, this.quiet)
    this.markers = new ChangeMarkers(CHANGES_CHANNEL, catchUpTimeoutMs)
    this.background = backgroundConnection(sql)
    this.heartbeat = new Job({ name: 'credentials.heartbeat', periodMs: heartbeatMs, run: () => this.beat() })
    const purge = purgeJob({
      name: 'revocations.purge',
      periodMs: PURGE_EVERY_MS,
      sql: this.background,
      table: 'revocations',
      where: (db) => db`expires_at < now()`,
    })
    this.jobs = [this.heartbeat, purge]
  }

  /** True while what this instance remembers about credentials may be used. */
  get trusted(): boolean {
    return this.trust.trusted
  }

  /** Why it is not trusted, for /readyz; undefined when trusted. */
  get distrustReason(): string | undefined {
    return this.trust.reason
  }

  /** Listens on CHANGES_CHANNEL; returns at once (postgres.js goes on trying while the database cannot be reached). */
  start(): void {
    const listened = this.listenSql.listen(
      CHANGES_CHANNEL,
      (payload) => this.onNotify(payload),
      () => this.onListen(),
    )
    if (!watchListenClose(this.listenSql, () => this.onAway())) this.trust.cannotWatch()
    // A failed first attempt: postgres.js goes on trying, and calls onListen when it succeeds.
    listened.then(
      () => {},
      (err: unknown) => {
        if (!this.quiet())
          this.log.warn(
            'cannot listen for credential changes yet; remembered credentials are not trusted',
            describeError(err),
          )
        this.onAway()
      },
    )
  }

  /** Closes the heartbeat's connection (the scheduler, stopped before, ran its last beat). */
  async stop(deadline: number): Promise<void> {
    this.stopped = true
    await this.background.end({ timeout: Math.max(0, deadline - performance.now()) / 1000 })
  }

  /**
   * Resolves once this instance has applied every credential change
   * committed before the call: it notifies a marker and waits for it to come
   * back. At once when nothing remembered is trusted anyway. Never rejects;
   * if the marker does not come back within CATCH_UP_TIMEOUT_MS the feed is
   * taken for dead until one does.
   */
  async caughtUp(): Promise<void> {
    if (!this.trust.trusted) return
    const forConnection = this.trust.current
    try {
      if (!(await this.markers.roundTrip(this.sql)) && forConnection === this.trust.current)
        this.trust.stall(this.catchUpTimeoutMs)
    } catch (err) {
      // The change is committed and notified all the same; only the wait is lost.
      this.log.warn('could not check that the listener for credential changes is caught up', describeError(err))
      this.trust.stall(this.catchUpTimeoutMs)
    }
  }

  private onNotify(payload: string): void {
    try {
      if (this.markers.isMarker(payload)) {
        // A marker of ours, even a late one, proves the connection delivers,
        // in order: whatever came before it has been applied.
        if (this.markers.heard(payload)) this.trust.markerHeard()
        return
      }
      if (applyRevocation(this.revocations, payload) || applyKeyChange(this.keys, payload)) return
      // `all`, `revocations`, or a payload this build does not know: the keys are forgotten; reload the revocations.
      this.trust.reload('a change too large to name was announced; reloading revocations')
      this.heartbeat.trigger()
    } catch (err) {
      // Cannot happen; but a throw here would surface in postgres.js's socket handler.
      this.keys.clear()
      this.trust.reload('applying a credential change failed')
      this.log.error('applying a credential change failed', describeError(err))
    }
  }

  private onListen(): void {
    this.trust.listened()
    this.log.debug('listening for credential changes')
    this.heartbeat.trigger()
  }

  private onAway(): void {
    this.trust.away()
    // Nobody need wait for a marker now: nothing is served from memory.
    this.markers.releaseAll()
  }

  /** Loads every revocation a JWT may still need, for the connection current when it started. */
  private async load(): Promise<void> {
    const forConnection = this.trust.current
    const rows = await this.background<RevocationRow[]>`
      SELECT kind, user_id, session_id, epoch, (extract(epoch FROM expires_at) * 1000)::float8 AS expires_at
      FROM revocations WHERE expires_at > now()`
    for (const row of rows) this.revocations.add(row)
    this.trust.loaded(forConnection)
  }

  /**
   * One heartbeat: load what is missing, prove delivery, sweep. Never
   * rejects. One that hangs (a statement waiting for a connection that does
   * not come) is given up after twice the catch-up time-out, so that the
   * next can start.
   */
  private async beat(): Promise<void> {
    await withDeadline(this.beatOnce(), this.catchUpTimeoutMs * 2, () => {})
  }

  private async beatOnce(): Promise<void> {
    try {
      if (!this.trust.hearing || this.stopped) return
      const forConnection = this.trust.current
      if (this.trust.needsLoad) await this.load()
      if (this.trust.current !== forConnection || this.trust.needsLoad) return
      if (await this.markers.roundTrip(this.background)) this.trust.delivered(forConnection)
      else if (forConnection === this.trust.current) this.trust.stall(this.catchUpTimeoutMs)
      this.revocations.sweep()
    } catch (err) {
      // The database is unreachable: the heartbeat tries again; requests fail closed meanwhile.
      if (!this.quiet()) this.log.debug('credential changes heartbeat failed', describeError(err))
      this.trust.stall(this.catchUpTimeoutMs)
    }
  }
}
