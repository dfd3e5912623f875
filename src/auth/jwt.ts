import { createHmac, timingSafeEqual } from 'node:crypto'

// HS256 JSON Web Tokens with node:crypto only, verified in the order RFC 8725
// asks for: the algorithm before anything else, then the signature over the
// exact text received, and only then the claims. Every failure is the same
// InvalidTokenError; callers answer 401 invalid_token whatever went wrong, so
// a token's shape never turns into a 500 or an oracle.

export class InvalidTokenError extends Error {}

export interface SigningKey {
  kid: string
  secret: Buffer
}

export interface JwtClaims {
  sub: string
  iss: string
  aud: string | string[]
  exp: number
  iat: number
  nbf?: number
  role: string
  scope: string
  /** The session the token belongs to: ending the session voids it. */
  sid: string
  /** The user's credential epoch when the token was issued: raising the epoch voids it. */
  gen: number
  /**
   * How its session's login proved the user (RFC 8176), and when (OIDC Core's `auth_time`). A token without them (one
   * issued before they were added) is read as a password login at `iat`.
   */
  amr?: string[]
  auth_time?: number
}

export interface VerifyOptions {
  keys: readonly SigningKey[]
  issuer: string
  audience: string
  /** Seconds since the epoch. */
  now: number
  /** Seconds of clock skew tolerated for exp, nbf and iat. */
  leewaySeconds?: number
}

/** Clock skew tolerated when no leewaySeconds is given (also by src/auth/jwt-cache.ts, which must agree). */
export const DEFAULT_LEEWAY_SECONDS = 30

const SEGMENT = /^[A-Za-z0-9_-]+$/
const MAX_TOKEN_LENGTH = 4096

const isString = (v: unknown): v is string => typeof v === 'string'
const b64json = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url')
const hs256 = (secret: Buffer, data: string) => createHmac('sha256', secret).update(data).digest('base64url')

export function signJwt(claims: JwtClaims, key: SigningKey): string {
  const signingInput = `${b64json({ alg: 'HS256', typ: 'JWT', kid: key.kid })}.${b64json(claims)}`
  return `${signingInput}.${hs256(key.secret, signingInput)}`
}

/** A JWS compact serialization: three base64url segments. Opaque tokens and API keys never look like this. */
export const looksLikeJwt = (token: string) => token.split('.').length === 3

/** A base64url segment holding a JSON object, decoded; anything else is an InvalidTokenError. */
export function decodeSegment(segment: string): Record<string, unknown> {
  try {
    const value: unknown = JSON.parse(Buffer.from(segment, 'base64url').toString('utf8'))
    if (value && typeof value === 'object' && !Array.isArray(value)) return value as Record<string, unknown>
  } catch {
    // fall through
  }
  throw new InvalidTokenError('segment is not a JSON object')
}

/**
 * A JWS compact serialization of at most `maxLength` characters taken apart, its header decoded: the first step of
 * every verification.
 */
export function parseJws(
  token: string,
  maxLength: number,
): { header: Record<string, unknown>; headerText: string; payloadText: string; signature: string } {
  if (token.length > maxLength) throw new InvalidTokenError('too long')
  const parts = token.split('.')
  if (parts.length !== 3 || !parts.every((p) => SEGMENT.test(p)))
    throw new InvalidTokenError('not a JWS compact serialization')
  const [headerText, payloadText, signature] = parts as [string, string, string]
  return { header: decodeSegment(headerText), headerText, payloadText, signature }
}

export function verifyJwt(token: string, options: VerifyOptions): JwtClaims {
  const { header, headerText, payloadText, signature } = parseJws(token, MAX_TOKEN_LENGTH)
  // Exactly HS256: `none` in any spelling, other HMACs and public-key
  // algorithms (the RS256/HS256 confusion attack) are all refused here.
  if (header.alg !== 'HS256') throw new InvalidTokenError('algorithm not accepted')
  // RFC 7515 §4.1.11: an extension we do not understand must fail the token.
  if ('crit' in header) throw new InvalidTokenError('critical extension')
  if ('typ' in header && header.typ !== 'JWT') throw new InvalidTokenError('unexpected typ')
  // jku, jwk, x5u, x5c are never consulted: keys come only from configuration.
  let candidates: readonly SigningKey[] = options.keys
  if ('kid' in header) {
    const key = typeof header.kid === 'string' ? options.keys.find((k) => k.kid === header.kid) : undefined
    if (!key) throw new InvalidTokenError('unknown kid')
    candidates = [key]
  }

  // Compared as text: a signature re-encoded with padding, + and /, or other
  // trailing bits decodes to the same bytes but is not the token we issued.
  const given = Buffer.from(signature)
  const signingInput = `${headerText}.${payloadText}`
  const valid = candidates.some((key) => {
    const expected = Buffer.from(hs256(key.secret, signingInput))
    return expected.length === given.length && timingSafeEqual(expected, given)
  })
  if (!valid) throw new InvalidTokenError('bad signature')

  const claims = decodeSegment(payloadText)
  const leeway = options.leewaySeconds ?? DEFAULT_LEEWAY_SECONDS
  const isTime = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v)
  if (!isTime(claims.exp)) throw new InvalidTokenError('exp missing')
  if (options.now >= claims.exp + leeway) throw new InvalidTokenError('expired')
  if ('nbf' in claims && (!isTime(claims.nbf) || claims.nbf > options.now + leeway))
    throw new InvalidTokenError('not yet valid')
  if ('iat' in claims && (!isTime(claims.iat) || claims.iat > options.now + leeway))
    throw new InvalidTokenError('issued in the future')
  if (claims.iss !== options.issuer) throw new InvalidTokenError('wrong issuer')
  const aud = claims.aud
  if (!(aud === options.audience || (Array.isArray(aud) && aud.includes(options.audience))))
    throw new InvalidTokenError('wrong audience')
  if (typeof claims.sub !== 'string' || !/^[1-9][0-9]{0,18}$/.test(claims.sub))
    throw new InvalidTokenError('bad subject')
  if (typeof claims.role !== 'string' || typeof claims.scope !== 'string')
    throw new InvalidTokenError('missing role or scope')
  // A token that cannot be revoked is not accepted: every one names its session and epoch.
  if (typeof claims.sid !== 'string' || !/^[1-9][0-9]{0,18}$/.test(claims.sid))
    throw new InvalidTokenError('bad session')
  if (!Number.isSafeInteger(claims.gen) || (claims.gen as number) < 0) throw new InvalidTokenError('bad epoch')
  if ('amr' in claims && !(Array.isArray(claims.amr) && claims.amr.length <= 8 && claims.amr.every(isString)))
    throw new InvalidTokenError('bad amr')
  if ('auth_time' in claims && !isTime(claims.auth_time)) throw new InvalidTokenError('bad auth_time')
  return claims as unknown as JwtClaims
}
