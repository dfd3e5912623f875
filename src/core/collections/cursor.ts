import { createCipheriv, createDecipheriv, createHmac, timingSafeEqual } from 'node:crypto'

// A cursor is base64url(nonce ‖ AES-256-GCM ciphertext ‖ tag) of a JSON
// payload: opaque to clients (they must not build one), tamper-evident (an
// edited cursor fails the tag) and unreadable. It carries the last row's sort
// values, an e-mail address when sorting by e-mail, and URLs land in access
// logs and browser histories, so the values must not be readable there. The
// payload names the sort and a digest of the filter it was made for, so it
// cannot be replayed elsewhere.
//
// The nonce is synthetic (SIV-style): an HMAC of the payload under a key of
// its own. The same payload gives the same cursor, and no two payloads share
// a nonce short of a 96-bit collision, which random nonces would make likely
// after 2^32 cursors under one key; a nonce repeated with another payload is
// what breaks GCM.

export interface CursorPayload {
  /** The normalized sort, e.g. `-price,id`. */
  sort: string
  /** Digest of the filter parameters the cursor belongs to. */
  filter: string
  /** The last row's values of each sort key, in order, id last. */
  after: Array<string | number>
}

const NONCE_BYTES = 12
const TAG_BYTES = 16
/** Nonce and tag in base64url: no cursor is shorter. */
const MIN_LENGTH = Math.ceil(((NONCE_BYTES + TAG_BYTES) * 4) / 3)
const MAX_LENGTH = 6000

/**
 * The two subkeys of one secret: the same key must not both encrypt and make
 * nonces. Derived once, when the service is made (CoreServices.cursorKeys),
 * rather than twice per page.
 */
export interface CursorKey {
  readonly encryption: Buffer
  readonly nonce: Buffer
}

export function cursorKey(secret: Buffer): CursorKey {
  return {
    encryption: createHmac('sha256', secret).update('cursor encryption').digest(),
    nonce: createHmac('sha256', secret).update('cursor nonce').digest(),
  }
}
const nonceOf = (keys: CursorKey, plaintext: Buffer) =>
  createHmac('sha256', keys.nonce).update(plaintext).digest().subarray(0, NONCE_BYTES)

/** Seals any plaintext as a cursor (for tests of what decodeCursor does with well-sealed nonsense). */
export function sealCursor(plaintext: Buffer, key: CursorKey): string {
  const nonce = nonceOf(key, plaintext)
  const cipher = createCipheriv('aes-256-gcm', key.encryption, nonce)
  // One copy of the parts (evaluated left to right: update, final, then the tag final made).
  return Buffer.concat([nonce, cipher.update(plaintext), cipher.final(), cipher.getAuthTag()]).toString('base64url')
}

export function encodeCursor(payload: CursorPayload, key: CursorKey): string {
  return sealCursor(Buffer.from(JSON.stringify([payload.sort, payload.filter, payload.after])), key)
}

/** The payload, or undefined when the cursor is malformed or does not open under any key. */
export function decodeCursor(cursor: string, keys: readonly CursorKey[]): CursorPayload | undefined {
  if (cursor.length < MIN_LENGTH || cursor.length > MAX_LENGTH || !/^[A-Za-z0-9_-]+$/.test(cursor)) return undefined
  const bytes = Buffer.from(cursor, 'base64url')
  // Spare bits of the last character are ignored by decoding: only the canonical spelling is accepted.
  if (bytes.toString('base64url') !== cursor || bytes.length < NONCE_BYTES + TAG_BYTES) return undefined
  for (const key of keys) {
    const plaintext = open(bytes, key)
    if (plaintext) return parse(plaintext)
  }
  return undefined
}

function open(bytes: Buffer, keys: CursorKey): Buffer | undefined {
  const nonce = bytes.subarray(0, NONCE_BYTES)
  const decipher = createDecipheriv('aes-256-gcm', keys.encryption, nonce)
  decipher.setAuthTag(bytes.subarray(bytes.length - TAG_BYTES))
  let plaintext: Buffer
  try {
    plaintext = Buffer.concat([
      decipher.update(bytes.subarray(NONCE_BYTES, bytes.length - TAG_BYTES)),
      decipher.final(),
    ])
  } catch {
    return undefined
  }
  // One cursor per payload: the nonce must be the one this payload makes.
  return timingSafeEqual(nonceOf(keys, plaintext), nonce) ? plaintext : undefined
}

function parse(plaintext: Buffer): CursorPayload | undefined {
  try {
    const [sort, filter, after] = JSON.parse(plaintext.toString('utf8')) as unknown[]
    if (typeof sort !== 'string' || typeof filter !== 'string' || !Array.isArray(after)) return undefined
    if (!after.every((v) => typeof v === 'string' || typeof v === 'number')) return undefined
    return { sort, filter, after }
  } catch {
    return undefined
  }
}
