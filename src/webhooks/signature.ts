import { createHmac } from 'node:crypto'
import { secretBytes } from './secret.js'

// The Standard Webhooks signature (https://www.standardwebhooks.com, "Signature
// scheme"): HMAC-SHA256 over `${webhook-id}.${webhook-timestamp}.${body}`,
// keyed with the secret's bytes, sent as `v1,<base64>`. Several signatures
// are separated by spaces, and a receiver accepts the message if any one
// verifies: that is how a rotated secret and its predecessor both sign for a while.

export function signatureOf(secret: string, messageId: string, timestamp: number, body: string): string {
  const mac = createHmac('sha256', secretBytes(secret)).update(`${messageId}.${timestamp}.${body}`).digest('base64')
  return `v1,${mac}`
}

/** The `webhook-signature` header: one signature per secret, newest first. */
export const signatureHeader = (secrets: readonly string[], messageId: string, timestamp: number, body: string): string =>
  secrets.map((s) => signatureOf(s, messageId, timestamp, body)).join(' ')

/**
 * Every header of a Standard Webhooks POST of the JSON `body`: the id (the
 * same on every attempt, so a receiver drops a duplicate), the time of this
 * attempt (receivers refuse an old one: a replay), and the signatures.
 */
export function standardWebhookHeaders(secrets: readonly string[], messageId: string, body: string, userAgent: string): Record<string, string> {
  const timestamp = Math.floor(Date.now() / 1000)
  return {
    'content-type': 'application/json',
    'user-agent': userAgent,
    'webhook-id': messageId,
    'webhook-timestamp': String(timestamp),
    'webhook-signature': signatureHeader(secrets, messageId, timestamp, body),
  }
}
