import { randomBytes } from 'node:crypto'
import { hashSecret } from '../tokens.js'

// The secrets of recovery links (a password reset, an address to verify, an old address to put back):
// 32 random bytes behind a prefix of their own, sent only in the message and
// stored only as their SHA-256 (sql/012, one_time_tokens). A full-entropy
// secret needs no slow hash: a guess costs the service one hash and one
// index lookup, and the guesser 2^256 tries.

const PREFIX = 'upa_ot_'
const SHAPE = /^upa_ot_[A-Za-z0-9_-]{43}$/

export function newOneTimeToken(): { token: string; hash: Buffer } {
  const token = PREFIX + randomBytes(32).toString('base64url')
  return { token, hash: hashSecret(token) }
}

/** The hash to look a presented token up by, or undefined when it cannot be one of ours (no database read for that). */
export const oneTimeTokenHash = (presented: string): Buffer | undefined =>
  SHAPE.test(presented) ? hashSecret(presented) : undefined

/**
 * A link from its template (PASSWORD_RESET_URL, VERIFY_EMAIL_URL, EMAIL_RESTORE_URL):
 * configuration and the token, nothing from the request.
 */
export const linkFor = (template: string, token: string): string =>
  template.replaceAll('{token}', encodeURIComponent(token))
