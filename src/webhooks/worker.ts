import type { Sql } from 'postgres'
import type { Config } from '../config.js'
import type { Logger } from '../log.js'

// PLACEHOLDER, filled in by the webhook work: claims due deliveries with
// FOR UPDATE SKIP LOCKED and sends them (Standard Webhooks).

export interface WebhookSettings {
  /** How often the worker looks for due deliveries when no notification woke it. */
  pollMs: number
}

export const defaultWebhookSettings: WebhookSettings = { pollMs: 1000 }

export class WebhookWorker {
  constructor(
    readonly sql: Sql,
    readonly config: Config,
    readonly log: Logger,
    readonly settings: WebhookSettings,
  ) {}

  start(): void {}

  /** Stops claiming; attempts in flight are abandoned to their lease (another instance sends them later). */
  async stop(): Promise<void> {}
}
