import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto'

// Secrets the service must read back (a webhook's signing secret, a TOTP
// seed), so unlike passwords and tokens they cannot be stored as hashes:
// they are sealed with AES-256-GCM under a key derived (HKDF-SHA256) from
// the first JWT secret and a purpose of their own, and the sealed text names
// that secret's kid, so any configured kid opens it. While an older kid is
// still configured, each owner re-seals what it holds under the first, so
// that dropping the older kid later breaks nothing. A copy of the database
// alone reveals no secret; GCM's tag makes a tampered text fail to open
// rather than yield a wrong secret.

/** JWT_SECRETS as src/config.ts gives them: the first seals, any opens what its kid sealed. */
export type SealingKeys = ReadonlyArray<{ kid: string; secret: Buffer }>

const FORMAT = 'v1'
const IV_BYTES = 12

/** Opening failed because the kid that sealed the text is no longer configured. */
export class SealingKeyMissing extends Error {
  constructor(
    readonly kid: string,
    what: string,
  ) {
    super(`${what} was sealed under JWT secret kid "${kid}", which is no longer configured (JWT_SECRETS)`)
    this.name = 'SealingKeyMissing'
  }
}

/** The kid a sealed text names (undefined for a text of another form). */
export const kidOf = (sealed: string): string | undefined =>
  sealed.startsWith(`${FORMAT}.`) ? sealed.split('.')[1] : undefined

/**
 * Sealing for one purpose: `info` binds the derived key to it, so a text
 * sealed for one purpose never opens as another's.
 */
export function sealer(info: string, what: string) {
  const keyFor = (secret: Buffer) => Buffer.from(hkdfSync('sha256', secret, Buffer.alloc(0), info, 32))

  /** `v1.<kid>.<iv>.<ciphertext>.<tag>`, base64url parts, sealed under the first (signing) JWT secret. */
  function seal(text: string, keys: SealingKeys): string {
    const signing = keys[0]
    if (!signing) throw new Error('seal: no JWT secret configured')
    const iv = randomBytes(IV_BYTES)
    const cipher = createCipheriv('aes-256-gcm', keyFor(signing.secret), iv)
    // The kid is authenticated too: a sealed text cannot be relabelled to another key.
    cipher.setAAD(Buffer.from(`${FORMAT}.${signing.kid}`))
    const sealed = Buffer.concat([cipher.update(text, 'utf8'), cipher.final()])
    return [
      FORMAT,
      signing.kid,
      iv.toString('base64url'),
      sealed.toString('base64url'),
      cipher.getAuthTag().toString('base64url'),
    ].join('.')
  }

  /** The text, or SealingKeyMissing when its kid is gone; any other failure (tampering, a wrong key) throws too. */
  function open(sealed: string, keys: SealingKeys): string {
    const parts = sealed.split('.')
    if (parts.length !== 5 || parts[0] !== FORMAT) throw new Error(`not a sealed text (${what})`)
    const [, kid, iv, ciphertext, tag] = parts as [string, string, string, string, string]
    const key = keys.find((k) => k.kid === kid)
    if (!key) throw new SealingKeyMissing(kid, what)
    const decipher = createDecipheriv('aes-256-gcm', keyFor(key.secret), Buffer.from(iv, 'base64url'))
    decipher.setAAD(Buffer.from(`${FORMAT}.${kid}`))
    decipher.setAuthTag(Buffer.from(tag, 'base64url'))
    return Buffer.concat([decipher.update(Buffer.from(ciphertext, 'base64url')), decipher.final()]).toString('utf8')
  }

  /** The text sealed under the first kid (itself if it already is), or undefined if it does not open. */
  function reseal(sealed: string, keys: SealingKeys): string | undefined {
    if (kidOf(sealed) === keys[0]!.kid) return sealed
    try {
      return seal(open(sealed, keys), keys)
    } catch {
      return undefined
    }
  }

  return { seal, open, reseal }
}
