import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto'

// TOTP (RFC 6238) over HOTP (RFC 4226) with node:crypto only, in the form
// every authenticator app reads: HMAC-SHA-1, 6 digits, 30-second steps, the
// secret as base32 (RFC 4648) in an otpauth:// URI. A code is accepted for
// its step and one step either side (clock drift), and a step at most once:
// the caller keeps the last step accepted and passes it in.

const STEP_SECONDS = 30
const DIGITS = 6
const DRIFT_STEPS = 1
const SECRET_BYTES = 20
const BASE32 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567'

/** Six digits, nothing else: what an app shows, and what the body schemas accept. */
export const TOTP_CODE = /^[0-9]{6}$/

export function base32Encode(bytes: Buffer): string {
  let out = ''
  let bits = 0
  let value = 0
  for (const byte of bytes) {
    value = (value << 8) | byte
    bits += 8
    while (bits >= 5) {
      out += BASE32[(value >>> (bits - 5)) & 31]
      bits -= 5
    }
  }
  if (bits > 0) out += BASE32[(value << (5 - bits)) & 31]
  return out
}

export function base32Decode(text: string): Buffer {
  const bytes: number[] = []
  let bits = 0
  let value = 0
  for (const char of text.replace(/=+$/, '').toUpperCase()) {
    const index = BASE32.indexOf(char)
    if (index === -1) throw new Error('not base32')
    value = (value << 5) | index
    bits += 5
    if (bits >= 8) {
      bytes.push((value >>> (bits - 8)) & 255)
      bits -= 8
    }
  }
  return Buffer.from(bytes)
}

/** A new secret, base32 (160 bits, as RFC 4226 recommends). */
export const newTotpSecret = (): string => base32Encode(randomBytes(SECRET_BYTES))

/** HOTP(K, C) truncated to `digits` (RFC 4226 §5.3). */
export function hotp(key: Buffer, counter: number, digits = DIGITS, algorithm = 'sha1'): string {
  const message = Buffer.alloc(8)
  message.writeBigUInt64BE(BigInt(counter))
  const mac = createHmac(algorithm, key).update(message).digest()
  const offset = mac[mac.length - 1]! & 0x0f
  const binary = mac.readUInt32BE(offset) & 0x7fffffff
  return String(binary % 10 ** digits).padStart(digits, '0')
}

/** The 30-second step of a time in milliseconds. */
export const stepAt = (nowMs: number): number => Math.floor(nowMs / 1000 / STEP_SECONDS)

/**
 * The step `code` belongs to, within one step of `nowMs` and later than
 * `lastStep`; undefined when it matches none. Every candidate is compared,
 * in constant time, so the answer's time says nothing of which one matched.
 */
export function matchTotp(secret: string, code: string, nowMs: number, lastStep: number): number | undefined {
  if (!TOTP_CODE.test(code)) return undefined
  const key = base32Decode(secret)
  const now = stepAt(nowMs)
  let matched: number | undefined
  for (let step = now - DRIFT_STEPS; step <= now + DRIFT_STEPS; step++) {
    const equal = timingSafeEqual(Buffer.from(hotp(key, step)), Buffer.from(code))
    if (equal && step > lastStep && matched === undefined) matched = step
  }
  return matched
}

/** The otpauth:// URI an authenticator app scans (Google Authenticator's key URI format). */
export function otpauthUri(secret: string, issuer: string, account: string): string {
  const label = `${encodeURIComponent(issuer)}:${encodeURIComponent(account)}`
  const query = new URLSearchParams({
    secret,
    issuer,
    algorithm: 'SHA1',
    digits: String(DIGITS),
    period: String(STEP_SECONDS),
  })
  return `otpauth://totp/${label}?${query}`
}
