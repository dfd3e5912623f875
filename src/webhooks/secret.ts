import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto'
import type { Config } from '../config.js'

// A webhook's signing secret. HMAC needs the secret itself, so unlike an API
// key it cannot be stored as a hash: it is stored sealed with AES-256-GCM
// under a key derived (HKDF-SHA256) from the first JWT secret, and the sealed
// text names that secret's kid, so any configured kid opens it; while an
// older kid is still configured, reseal.ts moves the secrets it sealed to the
// first, so that dropping it later breaks nothing. A copy of the database
// alone reveals no secret; GCM's tag means a tampered sealed text fails to
// open rather than yielding a wrong secret.

type Keys = Config['jwtSecrets']

const PREFIX = 'whsec_'
/** Standard Webhooks asks for 24 to 64 bytes; 32 is HMAC-SHA256's block-size sweet spot. */
const SECRET_BYTES = 32
const FORMAT = 'v1'
/** Binds the derived key to this use: it can never double as a cursor or token key. */
const HKDF_INFO = 'users-products-api webhook secret v1'
const IV_BYTES = 12

/** A new secret in the Standard Webhooks form: `whsec_` and the base64 of its bytes. */
export const newSigningSecret = (): string => PREFIX + randomBytes(SECRET_BYTES).toString('base64')

/** Standard Webhooks' bounds for a secret someone else made (the mail hook's MAIL_HOOK_SECRET). */
const MIN_SECRET_BYTES = 24
const MAX_SECRET_BYTES = 64

/** What is wrong with `secret` as a Standard Webhooks secret, or undefined; never quotes the secret. */
export function signingSecretProblem(secret: string): string | undefined {
  if (!secret.startsWith(PREFIX)) return `must start with ${PREFIX} (the Standard Webhooks form: ${PREFIX} and the base64 of ${MIN_SECRET_BYTES} to ${MAX_SECRET_BYTES} random bytes)`
  const encoded = secret.slice(PREFIX.length)
  // Buffer.from(…, 'base64') skips what is not base64, so a typo would silently sign with other bytes than the receiver's.
  if (!/^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/.test(encoded)) return `must be ${PREFIX} and standard base64 (A-Z a-z 0-9 + /, padded with =)`
  const bytes = Buffer.from(encoded, 'base64').length
  if (bytes < MIN_SECRET_BYTES || bytes > MAX_SECRET_BYTES) return `must hold ${MIN_SECRET_BYTES} to ${MAX_SECRET_BYTES} bytes after ${PREFIX} (it holds ${bytes}); make one with: echo ${PREFIX}$(openssl rand -base64 32)`
  return undefined
}

/** The bytes a signature is keyed with: the base64 after `whsec_`. */
export function secretBytes(secret: string): Buffer {
  if (!secret.startsWith(PREFIX)) throw new Error('not a webhook secret')
  return Buffer.from(secret.slice(PREFIX.length), 'base64')
}

/** Opening failed because the kid that sealed the secret is no longer configured. */
export class SealingKeyMissing extends Error {
  constructor(readonly kid: string) {
    super(`the signing secret was sealed under JWT secret kid "${kid}", which is no longer configured (JWT_SECRETS); rotate the webhook's secret`)
    this.name = 'SealingKeyMissing'
  }
}

const keyFor = (secret: Buffer): Buffer => Buffer.from(hkdfSync('sha256', secret, Buffer.alloc(0), HKDF_INFO, 32))

/** The kid a sealed text names (undefined for a text of another form). */
export const kidOf = (sealed: string): string | undefined => (sealed.startsWith(`${FORMAT}.`) ? sealed.split('.')[1] : undefined)

/** `v1.<kid>.<iv>.<ciphertext>.<tag>`, base64url parts, sealed under the first (signing) JWT secret. */
export function sealSecret(secret: string, keys: Keys): string {
  const signing = keys[0]
  if (!signing) throw new Error('sealSecret: no JWT secret configured')
  const iv = randomBytes(IV_BYTES)
  const cipher = createCipheriv('aes-256-gcm', keyFor(signing.secret), iv)
  // The kid is authenticated too: a sealed text cannot be relabelled to another key.
  cipher.setAAD(Buffer.from(`${FORMAT}.${signing.kid}`))
  const sealed = Buffer.concat([cipher.update(secret, 'utf8'), cipher.final()])
  return [FORMAT, signing.kid, iv.toString('base64url'), sealed.toString('base64url'), cipher.getAuthTag().toString('base64url')].join('.')
}

/** The secret, or SealingKeyMissing when its kid is gone; any other failure (tampering, a wrong key) throws too. */
export function openSecret(sealed: string, keys: Keys): string {
  const parts = sealed.split('.')
  if (parts.length !== 5 || parts[0] !== FORMAT) throw new Error('not a sealed webhook secret')
  const [, kid, iv, ciphertext, tag] = parts as [string, string, string, string, string]
  const key = keys.find((k) => k.kid === kid)
  if (!key) throw new SealingKeyMissing(kid)
  const decipher = createDecipheriv('aes-256-gcm', keyFor(key.secret), Buffer.from(iv, 'base64url'))
  decipher.setAAD(Buffer.from(`${FORMAT}.${kid}`))
  decipher.setAuthTag(Buffer.from(tag, 'base64url'))
  return Buffer.concat([decipher.update(Buffer.from(ciphertext, 'base64url')), decipher.final()]).toString('utf8')
}
