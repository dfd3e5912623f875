import type { Sql } from 'postgres'
import type { Config } from '../config.js'
import { backgroundConnection } from '../core/db/connect.js'
import { listenForWork } from '../core/db/wakeups.js'
import { settledBy } from '../core/lib/settled-by.js'
import { eventSerializer } from '../events/feed.js'
import type { Component } from '../core/lifecycle.js'
import type { Resource } from '../core/resources/resource.js'
import { describeError, type Logger } from '../core/log.js'
import { Job } from '../core/scheduler.js'
import { systemResolver, type Resolver } from './address-policy.js'
import { claimDue, recordAttempt, releaseClaim, type ClaimedDelivery } from './delivery-queries.js'
import { resealSecrets } from './reseal.js'
import { retryDelayMs } from '../core/lib/retry-schedule.js'
import { standardWebhookHeaders } from '../core/http/standard-webhooks.js'
import { openSecret, SealingKeyMissing } from './secret.js'
import { sendWebhook, type SendOutcome } from './send.js'
import { DELIVERIES_CHANNEL } from './wake.js'
import { HOUR, MINUTE, SECOND } from '../core/lib/durations.js'

// Every instance runs one worker; together they share the deliveries through
// the database (delivery-queries.ts): at least once, each delivery sent by one
// instance at a time. A worker wakes on NOTIFY `webhook_deliveries` and polls
// (job `webhooks.deliver`) for retries that come due; it keeps at most
// `concurrency` attempts in flight. Job `webhooks.reseal` seals secrets again
// under the first JWT secret (reseal.ts).
//
// The channel is its own, not `events`: sql/007 notifies it only in a commit
// that created deliveries (and a resume or a manual retry does), so the
// writes no webhook wants cost the workers nothing; on `events` every
// instance would run a claim for every committed write. The worker's
// statements go through connections of its own, outside the request pool,
// database admission and its statement count, as the credential listener's
// heartbeat does (src/auth/revocation/credential-changes.ts).
/** Connections of the worker's own: claims are one statement, records one short transaction each. */
const WORKER_CONNECTIONS = 2

export interface WebhookSettings {
  /** How often the worker looks for due deliveries when no notification woke it. */
  pollMs: number
  /** Attempts in flight per instance at most. */
  concurrency: number
  /** From connect to the end of the answer's body. */
  timeoutMs: number
  /** How long a claim holds a delivery; longer than timeoutMs, so a live attempt is never claimed twice. */
  leaseMs: number
  /** Bytes of a receiver's answer read at most. */
  maxResponseBytes: number
  /** The delay after each failed attempt; after the last one the delivery has failed. */
  retryDelaysMs: readonly number[]
  /** Each delay is scaled by a random factor in [1 - jitter, 1 + jitter]. */
  retryJitter: number
  /** A webhook whose attempts have all failed for this long is disabled. */
  disableAfterMs: number
  /** How host names are resolved, at registration and for every attempt (tests inject one). */
  resolve: Resolver
  /**
   * How long stop() called on its own (not by the service's lifecycle, which gives its deadline) waits for the claims
   * of aborted attempts to be handed back.
   */
  stopTimeoutMs: number
  /**
   * How often secrets sealed under an older JWT secret are sealed
   * again under the first (reseal.ts); also once at start.
   */
  resealIntervalMs: number
}

export const defaultWebhookSettings: WebhookSettings = {
  pollMs: SECOND,
  concurrency: 16,
  timeoutMs: 10 * SECOND,
  leaseMs: MINUTE,
  maxResponseBytes: 64 * 1024,
  // Eight attempts over about 33 hours (Standard Webhooks' suggested schedule, the last repeated).
  retryDelaysMs: [5 * SECOND, 5 * MINUTE, 30 * MINUTE, 2 * HOUR, 5 * HOUR, 10 * HOUR, 10 * HOUR],
  retryJitter: 0.2,
  disableAfterMs: 24 * HOUR,
  resolve: systemResolver,
  stopTimeoutMs: 2 * SECOND,
  resealIntervalMs: MINUTE,
}

const USER_AGENT = 'users-products-api-webhooks/1 (Standard Webhooks)'

export class WebhookWorker implements Component {
  readonly name = 'webhook-worker'
  private stopped = true
  private inFlight = new Set<Promise<void>>()
  private abort = new AbortController()
  private db: Sql | undefined
  private wakeups: Sql | undefined
  private readonly claims: Job<void>
  /** Its repeating jobs, which run once the composition root adds them to the scheduler (src/service.ts). */
  readonly jobs: readonly Job<unknown>[]
  /**
   * Attempts recorded by this instance: accepted by the receiver, failed and due again, failed for the last time (the
   * delivery has failed). /metrics reads them (src/service.ts).
   */
  readonly counts = { delivered: 0, retried: 0, failed: 0 }

  constructor(
    readonly sql: Sql,
    /** Where it listens: a session (AppDeps.listenSql), not a transaction pooler's connection. */
    readonly listenSql: Sql,
    /** The registry's webhook declaration: disabling a webhook that keeps failing writes it as the API would. */
    readonly webhooks: Resource,
    readonly config: Config,
    readonly log: Logger,
    readonly settings: WebhookSettings,
  ) {
    if (settings.leaseMs <= settings.timeoutMs)
      throw new Error('webhook settings: leaseMs must be longer than timeoutMs')
    if (settings.concurrency < 1) throw new Error('webhook settings: concurrency must be at least 1')
    this.claims = new Job({
      name: 'webhooks.deliver',
      periodMs: settings.pollMs,
      firstRunMs: 0,
      run: () => this.claimAndSend(),
    })
    const reseal = new Job({
      name: 'webhooks.reseal',
      periodMs: settings.resealIntervalMs,
      firstRunMs: 0,
      run: (signal) => this.reseal(signal),
    })
    this.jobs = [this.claims, reseal]
  }

  /** Opens its connections and listens for new deliveries; again after a stop (tests pause an instance's worker so). */
  start(): void {
    if (!this.stopped) return
    this.stopped = false
    this.abort = new AbortController()
    this.db = backgroundConnection(this.sql, WORKER_CONNECTIONS)
    this.wakeups = listenForWork(
      this.listenSql,
      DELIVERIES_CHANNEL,
      () => this.wake(),
      (err) => {
        if (!this.stopped)
          this.log.warn('webhook worker: cannot listen for new deliveries; polling only', describeError(err))
      },
    )
    this.wake()
  }

  /** Looks for due deliveries now, or once the look under way has ended. */
  wake(): void {
    if (!this.stopped) this.claims.trigger()
  }

  /**
   * Claims what is due, in a claim that starts after this call, and waits
   * until those attempts are recorded and a claim finds nothing more: once it
   * resolves, every delivery due at the call that no other instance holds has
   * been attempted here (tests wait for this rather than for time to pass).
   */
  async drain(): Promise<void> {
    for (;;) {
      await this.claims.runAnew()
      if (this.stopped || this.inFlight.size === 0) return
      await Promise.allSettled([...this.inFlight])
    }
  }

  /**
   * Stops claiming and ends the attempts in flight; their claims are handed
   * back (due now, the cut attempt recorded) so another instance sends them at
   * once. A claim that cannot be handed back by `deadline` (default:
   * `stopTimeoutMs` from now) is left to its lease.
   */
  async stop(deadline = performance.now() + this.settings.stopTimeoutMs): Promise<void> {
    if (this.stopped) return
    this.stopped = true
    this.abort.abort()
    const left = () => Math.max(0, deadline - performance.now())
    await settledBy(Promise.allSettled([this.claims.settled(), ...this.inFlight]), deadline)
    const { db, wakeups } = this
    this.db = this.wakeups = undefined
    await Promise.all([db?.end({ timeout: left() / 1000 }), wakeups?.end({ timeout: left() / 1000 })])
  }

  /** Seals again, under the first JWT secret, what an older one sealed (reseal.ts). */
  private async reseal(signal: AbortSignal): Promise<void> {
    if (!this.db) return
    const count = await resealSecrets(this.db, this.config.jwtSecrets, signal)
    if (count)
      this.log.info('webhook secrets sealed again under the first JWT secret', {
        count,
        kid: this.config.jwtSecrets[0]!.kid,
      })
  }

  /** One claim of as many due deliveries as there are free slots; an attempt that ends wakes the next. */
  private async claimAndSend(): Promise<void> {
    const db = this.db
    const free = this.settings.concurrency - this.inFlight.size
    if (this.stopped || !db || free <= 0) return
    const claimed = await claimDue(db, free, this.settings.leaseMs)
    for (const claim of claimed) this.launch(db, claim)
  }

  private launch(db: Sql, claim: ClaimedDelivery): void {
    const attempt: Promise<void> = this.attempt(db, claim)
      .catch((err: unknown) =>
        this.log.error('webhook worker: recording an attempt failed; the delivery is due again after its lease', {
          delivery_id: claim.delivery_id,
          ...describeError(err),
        }),
      )
      .finally(() => {
        this.inFlight.delete(attempt)
        this.wake()
      })
    this.inFlight.add(attempt)
  }

  private async attempt(db: Sql, claim: ClaimedDelivery): Promise<void> {
    const startedAt = new Date()
    const outcome = this.stopped
      ? { status: undefined, durationMs: 0, error: 'the service stopped before the attempt', ok: false, aborted: true }
      : await this.send(claim)
    if (outcome.aborted) return releaseClaim(db, claim, { startedAt, ...outcome })
    const retryInMs = outcome.ok
      ? undefined
      : retryDelayMs({ delaysMs: this.settings.retryDelaysMs, jitter: this.settings.retryJitter }, claim.attempts)
    const disabled = await recordAttempt(
      db,
      this.webhooks,
      claim,
      { startedAt, ...outcome, retryInMs },
      this.settings.disableAfterMs,
    )
    this.counts[outcome.ok ? 'delivered' : retryInMs === undefined ? 'failed' : 'retried']++
    // Never the URL: its path or query may be a credential of the receiver's.
    const fields = {
      webhook_id: claim.webhook_id,
      delivery_id: claim.delivery_id,
      event_id: claim.event.id,
      attempt: claim.attempts,
      status: outcome.status,
      duration_ms: outcome.durationMs,
    }
    if (outcome.ok) this.log.debug('webhook delivered', fields)
    else this.log.info('webhook attempt failed', { ...fields, error: outcome.error, retry_in_ms: retryInMs ?? null })
    if (disabled)
      this.log.warn('webhook disabled after failing continuously', {
        webhook_id: claim.webhook_id,
        failing_for_ms: this.settings.disableAfterMs,
      })
  }

  private async send(claim: ClaimedDelivery): Promise<SendOutcome> {
    let secrets: string[]
    try {
      secrets = [openSecret(claim.secret_sealed, this.config.jwtSecrets)]
    } catch (err) {
      const error =
        err instanceof SealingKeyMissing
          ? `${err.message}; rotate the webhook's secret`
          : "the signing secret could not be opened (JWT_SECRETS changed?); rotate the webhook's secret"
      return { status: undefined, durationMs: 0, error, ok: false }
    }
    if (claim.previous_secret_sealed) {
      // The previous secret only adds a signature; losing it costs
      // a receiver nothing that the current one does not give.
      try {
        secrets.push(openSecret(claim.previous_secret_sealed, this.config.jwtSecrets))
      } catch {
        this.log.warn(
          'webhook worker: the previous signing secret could not be opened; signing with the current one only',
          { webhook_id: claim.webhook_id },
        )
      }
    }
    const body = eventSerializer.one(claim.event)
    return sendWebhook({
      url: claim.url,
      body,
      headers: standardWebhookHeaders(secrets, String(claim.event.id), body, USER_AGENT),
      policy: this.config,
      resolve: this.settings.resolve,
      timeoutMs: this.settings.timeoutMs,
      maxResponseBytes: this.settings.maxResponseBytes,
      signal: this.abort.signal,
    })
  }
}
