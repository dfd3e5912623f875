import { createHmac, timingSafeEqual } from 'node:crypto'

// A cursor is `base64url(JSON payload).base64url(HMAC-SHA256)`: opaque to
// clients (they must not build one) and tamper-evident (an edited cursor fails
// the MAC, compared in constant time). The payload names the sort and a
// digest of the filter it was made for, so it cannot be replayed elsewhere.

export interface CursorPayload {
  /** The normalized sort, e.g. `-price,id`. */
  sort: string
  /** Digest of the filter parameters the cursor belongs to. */
  filter: string
  /** The last row's values of each sort key, in order, id last. */
  after: Array<string | number>
}

const MAC_BYTES = 16 // 128 bits: forging one is out of reach, and URLs stay short

const mac = (key: Buffer, data: string) => createHmac('sha256', key).update(data).digest().subarray(0, MAC_BYTES)

export function encodeCursor(payload: CursorPayload, key: Buffer): string {
  const data = Buffer.from(JSON.stringify([payload.sort, payload.filter, payload.after])).toString('base64url')
  return `${data}.${mac(key, data).toString('base64url')}`
}

/** The payload, or undefined when the cursor is malformed or its MAC fails under every key. */
export function decodeCursor(cursor: string, keys: readonly Buffer[]): CursorPayload | undefined {
  const m = /^([A-Za-z0-9_-]{1,4096})\.([A-Za-z0-9_-]{22})$/.exec(cursor)
  if (!m) return undefined
  const [, data, tag] = m as unknown as [string, string, string]
  const given = Buffer.from(tag, 'base64url')
  // 22 base64url characters carry 132 bits for a 128-bit tag: the last one has
  // 4 spare bits that decoding ignores, so without this check 16 spellings of
  // the same tag would verify. Only the canonical spelling is accepted.
  if (given.toString('base64url') !== tag) return undefined
  if (!keys.some((key) => timingSafeEqual(mac(key, data), given))) return undefined
  try {
    const [sort, filter, after] = JSON.parse(Buffer.from(data, 'base64url').toString('utf8')) as unknown[]
    if (typeof sort !== 'string' || typeof filter !== 'string' || !Array.isArray(after)) return undefined
    if (!after.every((v) => typeof v === 'string' || typeof v === 'number')) return undefined
    return { sort, filter, after }
  } catch {
    return undefined
  }
}
