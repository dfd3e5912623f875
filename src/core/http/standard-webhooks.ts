import { createHmac, randomBytes } from 'node:crypto'

// Standard Webhooks (https://www.standardwebhooks.com): the form of a signing
// secret (`whsec_` and the base64 of its bytes), the signature (HMAC-SHA256
// over `${webhook-id}.${webhook-timestamp}.${body}`, keyed with the secret's
// bytes, sent as `v1,<base64>`) and the headers of a signed POST. Several
// signatures are separated by spaces, and a receiver accepts the message if
// any one verifies: that is how a rotated secret and its predecessor both
// sign for a while. The webhooks (src/webhooks/) and the mail hook
// (src/mail/hook.ts) both send this way.

const PREFIX = 'whsec_'
/** Standard Webhooks asks for 24 to 64 bytes; 32 is HMAC-SHA256's block-size sweet spot. */
const SECRET_BYTES = 32

/** A new secret in the Standard Webhooks form: `whsec_` and the base64 of its bytes. */
export const newSigningSecret = (): string => PREFIX + randomBytes(SECRET_BYTES).toString('base64')

/** Standard Webhooks' bounds for a secret someone else made (the mail hook's MAIL_HOOK_SECRET). */
const MIN_SECRET_BYTES = 24
const MAX_SECRET_BYTES = 64

/** What is wrong with `secret` as a Standard Webhooks secret, or undefined; never quotes the secret. */
export function signingSecretProblem(secret: string): string | undefined {
  if (!secret.startsWith(PREFIX))
    return (
      `must start with ${PREFIX} (the Standard Webhooks ` +
      `form: ${PREFIX} and the base64 of ${MIN_SECRET_BYTES} to ${MAX_SECRET_BYTES} random bytes)`
    )
  const encoded = secret.slice(PREFIX.length)
  // Buffer.from(…, 'base64') skips what is not base64, so a typo
  // would silently sign with other bytes than the receiver's.
  if (!/^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/.test(encoded))
    return `must be ${PREFIX} and standard base64 (A-Z a-z 0-9 + /, padded with =)`
  const bytes = Buffer.from(encoded, 'base64').length
  if (bytes < MIN_SECRET_BYTES || bytes > MAX_SECRET_BYTES)
    return (
      `must hold ${MIN_SECRET_BYTES} ` +
      `to ${MAX_SECRET_BYTES} bytes ` +
      `after ${PREFIX} (it holds ${bytes}); make one with: echo ${PREFIX}$(openssl rand -base64 32)`
    )
  return undefined
}

/** The bytes a signature is keyed with: the base64 after `whsec_`. */
export function secretBytes(secret: string): Buffer {
  if (!secret.startsWith(PREFIX)) throw new Error('not a webhook secret')
  return Buffer.from(secret.slice(PREFIX.length), 'base64')
}

export function signatureOf(secret: string, messageId: string, timestamp: number, body: string): string {
  const mac = createHmac('sha256', secretBytes(secret)).update(`${messageId}.${timestamp}.${body}`).digest('base64')
  return `v1,${mac}`
}

/** The `webhook-signature` header: one signature per secret, newest first. */
export const signatureHeader = (
  secrets: readonly string[],
  messageId: string,
  timestamp: number,
  body: string,
): string => secrets.map((s) => signatureOf(s, messageId, timestamp, body)).join(' ')

/**
 * Every header of a Standard Webhooks POST of the JSON `body`: the id (the
 * same on every attempt, so a receiver drops a duplicate), the time of this
 * attempt (receivers refuse an old one: a replay), and the signatures.
 */
export function standardWebhookHeaders(
  secrets: readonly string[],
  messageId: string,
  body: string,
  userAgent: string,
): Record<string, string> {
  const timestamp = Math.floor(Date.now() / 1000)
  return {
    'content-type': 'application/json',
    'user-agent': userAgent,
    'webhook-id': messageId,
    'webhook-timestamp': String(timestamp),
    'webhook-signature': signatureHeader(secrets, messageId, timestamp, body),
  }
}
