import type { Sql } from 'postgres'
import { backgroundConnection } from '../core/db/connect.js'
import { listenForWork } from '../core/db/wakeups.js'
import { settledBy, withDeadline } from '../core/lib/settled-by.js'
import type { Component } from '../core/lifecycle.js'
import { describeError, type Logger } from '../core/log.js'
import type { Metrics } from '../core/metrics.js'
import { Job } from '../core/scheduler.js'
import { retryDelayMs } from '../core/lib/retry-schedule.js'
import { MailSendError, type MailTransport } from './message.js'
import { claimMail, mailFailed, mailRetry, mailSent, type ClaimedMail } from './outbox.js'
import { HOUR, MINUTE, SECOND } from '../core/lib/durations.js'

// Sends what the mail outbox holds (src/mail/outbox.ts), on every instance:
// the instances share the messages through their claims, as the webhook
// workers share deliveries (src/webhooks/worker.ts), and wake on NOTIFY
// `mail_outbox` (sql/012) at the commit that queued a message, polling
// (job `mail.send`) for retries that come due.
//
// A message is sent once in the ordinary case: its row is deleted when the
// transport has taken it. An instance that dies between the two leaves the
// row claimed until its lease runs out; then another sends it again (at
// least once). A failure the transport calls permanent, or the last of the
// retries, gives up: the row stays without its text and link, with the
// transport's reason, and mail_failed_total counts it.
//
// Nothing here logs a message's text, link or address: the link is a
// one-time token. Its id and type are enough to find the row.

/** The LISTEN channel sql/012's trigger notifies. */
export const MAIL_CHANNEL = 'mail_outbox'

export interface MailSettings {
  /** How often the worker looks for due messages when no notification woke it. */
  pollMs: number
  /** Messages claimed, and sent at once, per look. */
  batch: number
  /** An attempt that has not ended by then counts as failed (and is retried); shorter than leaseMs. */
  sendTimeoutMs: number
  /** How long a claim holds a message; after it another instance may send it. */
  leaseMs: number
  /** The delay after each failed attempt; after the last one the message has failed. */
  retryDelaysMs: readonly number[]
  retryJitter: number
  /** The transport, instead of the configuration's (tests: one that fails and then recovers, at the unit boundary). */
  transport?: MailTransport
}

export const defaultMailSettings: MailSettings = {
  pollMs: SECOND,
  batch: 8,
  sendTimeoutMs: 30 * SECOND,
  leaseMs: 2 * MINUTE,
  // Eight attempts over about a day: a reset link is useless after PASSWORD_RESET_TTL, but a verification link is not.
  retryDelaysMs: [10 * SECOND, MINUTE, 5 * MINUTE, 30 * MINUTE, 2 * HOUR, 6 * HOUR, 12 * HOUR],
  retryJitter: 0.2,
}

const ERROR_CHARACTERS = 500

export class MailWorker implements Component {
  readonly name = 'mail-worker'
  private stopped = true
  private db: Sql | undefined
  private wakeups: Sql | undefined
  private readonly job: Job<void>
  /** Its repeating jobs, which run once the composition root adds them to the scheduler (src/service.ts). */
  readonly jobs: readonly Job<unknown>[]
  private readonly counts: { sent: { inc(): void }; retried: { inc(): void }; failed: { inc(): void } }

  constructor(
    private readonly sql: Sql,
    /** Where it listens: a session (AppDeps.listenSql), not a transaction pooler's connection. */
    private readonly listenSql: Sql,
    /** undefined: nothing can be sent (production without SMTP_URL or MAIL_HOOK_URL); the worker does nothing. */
    readonly transport: MailTransport | undefined,
    private readonly log: Logger,
    metrics: Metrics,
    private readonly settings: MailSettings,
  ) {
    if (settings.leaseMs <= settings.sendTimeoutMs)
      throw new Error('mail settings: leaseMs must be longer than sendTimeoutMs')
    this.counts = {
      sent: metrics.counter('mail_sent_total', 'Messages the mail transport took.'),
      retried: metrics.counter('mail_retried_total', 'Attempts to send a message that failed and will be tried again.'),
      failed: metrics.counter('mail_failed_total', 'Messages given up on: refused for good, or every retry failed.'),
    }
    this.job = new Job({ name: 'mail.send', periodMs: settings.pollMs, firstRunMs: 0, run: () => this.sendDue() })
    this.jobs = [this.job]
  }

  start(): void {
    if (!this.stopped || !this.transport) return
    this.stopped = false
    this.db = backgroundConnection(this.sql, 1)
    this.wakeups = listenForWork(
      this.listenSql,
      MAIL_CHANNEL,
      () => this.wake(),
      (err) => {
        if (!this.stopped)
          this.log.warn('mail worker: cannot listen for new messages; polling only', describeError(err))
      },
    )
    this.wake()
  }

  /** Looks for due messages now, or once the look under way has ended. */
  wake(): void {
    if (!this.stopped) this.job.trigger()
  }

  /** Stops after the batch under way (its claims run out by themselves if the deadline cuts it). */
  async stop(deadline: number): Promise<void> {
    if (this.stopped) return
    this.stopped = true
    const left = () => Math.max(0, deadline - performance.now())
    await settledBy(this.job.settled(), deadline)
    const { db, wakeups } = this
    this.db = this.wakeups = undefined
    await Promise.all([
      db?.end({ timeout: left() / 1000 }),
      wakeups?.end({ timeout: left() / 1000 }),
      this.transport?.close?.(deadline),
    ])
  }

  /** Claims a batch and sends it; a full batch looks again at once. */
  private async sendDue(): Promise<void> {
    const { db, transport } = this
    if (this.stopped || !db || !transport) return
    const claimed = await claimMail(db, this.settings.batch, this.settings.leaseMs)
    await Promise.all(
      claimed.map((claim) =>
        this.attempt(db, transport, claim).catch((err: unknown) => {
          this.log.error('mail worker: recording an attempt failed; the message is due again after its lease', {
            mail_id: claim.message.id,
            ...describeError(err),
          })
        }),
      ),
    )
    if (claimed.length === this.settings.batch) this.wake()
  }

  private async attempt(db: Sql, transport: MailTransport, { message, attempts }: ClaimedMail): Promise<void> {
    const fields = { mail_id: message.id, type: message.type, transport: transport.name, attempt: attempts }
    const failure = await this.send(transport, message)
    if (failure === undefined) {
      await mailSent(db, message.id)
      this.counts.sent.inc()
      this.log.info('mail sent', fields)
      return
    }
    const retryInMs = failure.permanent
      ? undefined
      : retryDelayMs({ delaysMs: this.settings.retryDelaysMs, jitter: this.settings.retryJitter }, attempts)
    const error = failure.message.slice(0, ERROR_CHARACTERS)
    if (retryInMs === undefined) {
      await mailFailed(db, message.id, error)
      this.counts.failed.inc()
      this.log.warn('mail failed; given up', { ...fields, error, permanent: failure.permanent })
    } else {
      await mailRetry(db, message.id, error, retryInMs)
      this.counts.retried.inc()
      this.log.info('mail attempt failed; will retry', { ...fields, error, retry_in_ms: retryInMs })
    }
  }

  /** undefined when the transport took the message; else why not. Never the message in the reason. */
  private async send(transport: MailTransport, message: ClaimedMail['message']): Promise<MailSendError | undefined> {
    // Told to the transport when the time is out: an attempt left running could take the message after its retry has.
    const giveUp = new AbortController()
    try {
      await withDeadline(transport.send(message, giveUp.signal), this.settings.sendTimeoutMs, () => {
        giveUp.abort()
        throw new MailSendError(`no answer within ${this.settings.sendTimeoutMs} ms`, false)
      })
      return undefined
    } catch (err) {
      if (err instanceof MailSendError) return err
      // Not the transport's own word: its message could hold anything, the message's text included.
      this.log.error('mail transport failed unexpectedly', {
        mail_id: message.id,
        error_name: err instanceof Error ? err.name : typeof err,
      })
      return new MailSendError(
        `the ${transport.name} transport failed unexpectedly (${err instanceof Error ? err.name : typeof err})`,
        false,
      )
    }
  }
}
