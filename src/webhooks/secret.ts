import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto'

// A webhook's signing secret. HMAC needs the secret itself, so unlike an API
// key it cannot be stored as a hash: it is stored sealed with AES-256-GCM
// under a key derived (HKDF-SHA256) from the first JWT secret, and the sealed
// text names that secret's kid, so any configured kid opens it; while an
// older kid is still configured, reseal.ts moves the secrets it sealed to the
// first, so that dropping it later breaks nothing. A copy of the database
// alone reveals no secret; GCM's tag means a tampered sealed text fails to
// open rather than yielding a wrong secret.

/** JWT_SECRETS as src/config.ts gives them: the first seals, any opens what its kid sealed. */
type Keys = ReadonlyArray<{ kid: string; secret: Buffer }>

const FORMAT = 'v1'
/** Binds the derived key to this use: it can never double as a cursor or token key. */
const HKDF_INFO = 'users-products-api webhook secret v1'
const IV_BYTES = 12

/** Opening failed because the kid that sealed the secret is no longer configured. */
export class SealingKeyMissing extends Error {
  constructor(readonly kid: string) {
    super(
      `the signing secret was sealed under JWT secret kid ` +
        `"${kid}", which is no longer configured (JWT_SECRETS); rotate the webhook's secret`,
    )
    this.name = 'SealingKeyMissing'
  }
}

const keyFor = (secret: Buffer): Buffer => Buffer.from(hkdfSync('sha256', secret, Buffer.alloc(0), HKDF_INFO, 32))

/** The kid a sealed text names (undefined for a text of another form). */
export const kidOf = (sealed: string): string | undefined =>
  sealed.startsWith(`${FORMAT}.`) ? sealed.split('.')[1] : undefined

/** `v1.<kid>.<iv>.<ciphertext>.<tag>`, base64url parts, sealed under the first (signing) JWT secret. */
export function sealSecret(secret: string, keys: Keys): string {
  const signing = keys[0]
  if (!signing) throw new Error('sealSecret: no JWT secret configured')
  const iv = randomBytes(IV_BYTES)
  const cipher = createCipheriv('aes-256-gcm', keyFor(signing.secret), iv)
  // The kid is authenticated too: a sealed text cannot be relabelled to another key.
  cipher.setAAD(Buffer.from(`${FORMAT}.${signing.kid}`))
  const sealed = Buffer.concat([cipher.update(secret, 'utf8'), cipher.final()])
  return [
    FORMAT,
    signing.kid,
    iv.toString('base64url'),
    sealed.toString('base64url'),
    cipher.getAuthTag().toString('base64url'),
  ].join('.')
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
