import { decodeSegment, InvalidTokenError, parseJws } from '../jwt.js'
import { PROVIDER_ALGORITHMS, verifySignature, type ProviderAlgorithm } from './jws.js'
import type { ProviderKeySet } from './key-set.js'
import type { ProviderSettings } from '../../config.js'

// An access token of the identity provider (OIDC_ISSUER), verified: the
// header, the signature with a key of the provider's set, then the claims.
// Every failure is an InvalidTokenError (401 invalid_token), whatever the
// token holds; only a provider that cannot be reached while no keys are
// cached is something else (ProviderUnavailable, 503).

/** What the service uses of a verified token. */
export interface ProviderClaims {
  subject: string
  /** Seconds since the epoch. */
  issuedAt: number
  expiresAt: number
  /**
   * `auth_time`: when the person last signed in at the provider (a sensitive
   * action within REAUTH_WINDOW of it needs no password).
   */
  authenticatedAt: number | undefined
  /** `amr`: how the person signed in at the provider (RFC 8176); empty when the token does not say. */
  amr: string[]
  /** The address, when the provider says it verified it (`email_verified`). */
  verifiedEmail: string | undefined
  /** `name`, else `preferred_username`; checked as a user's name when a user is made of it. */
  name: string | undefined
  /** The token's scopes (`scope`, or `scp`): they narrow what its user's role allows. */
  scopes: string[]
  /** What OIDC_ADMIN_CLAIM/OIDC_ADMIN_VALUE say, when set; undefined: the local user's role holds. */
  admin: boolean | undefined
}

/** Twice our own tokens' bound: providers put more in them (roles, groups). Checked before any decoding. */
const MAX_TOKEN_LENGTH = 8 * 1024
/**
 * A token issued longer ago than this is refused whatever its exp: a
 * revocation is remembered for a day (src/auth/revocation/revocations.ts), and a
 * provider token must not outlive what can refuse it.
 */
export const MAX_TOKEN_AGE_SECONDS = 86_400
/** RFC 9068 names access tokens `at+jwt`; most providers still say `JWT`. */
const ACCEPTED_TYPES: ReadonlySet<string> = new Set(['jwt', 'at+jwt', 'application/at+jwt'])
const MAX_SUBJECT_LENGTH = 255
/** A string fit to be stored and shown: no NUL (PostgreSQL text cannot hold it) nor any other control character. */
const PRINTABLE = /^[^\u0000-\u001f\u007f]+$/

/**
 * Whether a JWT says it comes from `issuer`, read without trusting it: only
 * to choose which verification it goes through. The provider's path accepts
 * no HMAC, ours nothing but HMAC, so a token
 * claiming the other issuer gains nothing.
 */
export function claimsIssuer(token: string, issuer: string): boolean {
  if (token.length > MAX_TOKEN_LENGTH) return false
  const payload = token.split('.')[1]
  if (payload === undefined) return false
  try {
    return decodeSegment(payload).iss === issuer
  } catch {
    return false
  }
}

export async function verifyProviderToken(
  token: string,
  keys: ProviderKeySet,
  settings: ProviderSettings,
  now: number,
  leewaySeconds: number,
): Promise<ProviderClaims> {
  const { header, headerText, payloadText, signature } = parseJws(token, MAX_TOKEN_LENGTH)
  if (!PROVIDER_ALGORITHMS.includes(header.alg as ProviderAlgorithm))
    throw new InvalidTokenError('algorithm not accepted')
  if ('crit' in header) throw new InvalidTokenError('critical extension')
  if ('typ' in header && !(typeof header.typ === 'string' && ACCEPTED_TYPES.has(header.typ.toLowerCase())))
    throw new InvalidTokenError('unexpected typ')
  if ('kid' in header && typeof header.kid !== 'string') throw new InvalidTokenError('kid is not a string')
  const alg = header.alg as ProviderAlgorithm
  const key = await keys.keyFor(header.kid as string | undefined, alg)
  if (!key) throw new InvalidTokenError('no key of the provider verifies it')
  if (!verifySignature(alg, key, `${headerText}.${payloadText}`, Buffer.from(signature, 'base64url')))
    throw new InvalidTokenError('bad signature')
  // base64url that decodes to the same bytes but is not canonical text is not the token the provider signed.
  if (Buffer.from(signature, 'base64url').toString('base64url') !== signature)
    throw new InvalidTokenError('signature not canonical')
  return checkClaims(decodeSegment(payloadText), settings, now, leewaySeconds)
}

function checkClaims(
  claims: Record<string, unknown>,
  settings: ProviderSettings,
  now: number,
  leeway: number,
): ProviderClaims {
  const isTime = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v)
  if (claims.iss !== settings.issuer) throw new InvalidTokenError('wrong issuer')
  const aud = claims.aud
  if (!(aud === settings.audience || (Array.isArray(aud) && aud.includes(settings.audience))))
    throw new InvalidTokenError('wrong audience')
  if (!isTime(claims.exp)) throw new InvalidTokenError('exp missing')
  if (now >= claims.exp + leeway) throw new InvalidTokenError('expired')
  if ('nbf' in claims && (!isTime(claims.nbf) || claims.nbf > now + leeway))
    throw new InvalidTokenError('not yet valid')
  if (!isTime(claims.iat)) throw new InvalidTokenError('iat missing')
  if (claims.iat > now + leeway) throw new InvalidTokenError('issued in the future')
  if (now - claims.iat > MAX_TOKEN_AGE_SECONDS + leeway) throw new InvalidTokenError('issued too long ago')
  const sub = claims.sub
  // A lone surrogate would be stored as U+FFFD: two subjects would share one link.
  if (typeof sub !== 'string' || sub.length > MAX_SUBJECT_LENGTH || !PRINTABLE.test(sub) || !sub.isWellFormed())
    throw new InvalidTokenError('bad subject')
  const verified = claims.email_verified === true || claims.email_verified === 'true'
  const email = typeof claims.email === 'string' && verified ? claims.email : undefined
  const name = [claims.name, claims.preferred_username].find((n): n is string => typeof n === 'string')
  return {
    subject: sub,
    issuedAt: claims.iat,
    expiresAt: claims.exp,
    authenticatedAt: isTime(claims.auth_time) && claims.auth_time <= now + leeway ? claims.auth_time : undefined,
    amr: Array.isArray(claims.amr) ? claims.amr.filter((m): m is string => typeof m === 'string').slice(0, 16) : [],
    verifiedEmail: email,
    name,
    scopes: scopesOf(claims),
    admin:
      settings.adminClaim === undefined ? undefined : holds(claimAt(claims, settings.adminClaim), settings.adminValue!),
  }
}

/** `scope` (OAuth 2.0, space-separated), else `scp` (Entra ID, Okta: a string or an array). Absent: none. */
function scopesOf(claims: Record<string, unknown>): string[] {
  const given = typeof claims.scope === 'string' ? claims.scope : claims.scp
  if (typeof given === 'string') return given.split(' ').filter(Boolean)
  if (Array.isArray(given)) return given.filter((s): s is string => typeof s === 'string')
  return []
}

/**
 * The claim named `name`: a top-level claim of that exact name first (Auth0
 * namespaces its claims with URLs, dots included), else the dotted path
 * through nested objects (Keycloak's `realm_access.roles`).
 */
export function claimAt(claims: Record<string, unknown>, name: string): unknown {
  if (Object.hasOwn(claims, name)) return claims[name]
  let at: unknown = claims
  for (const step of name.split('.')) {
    if (!at || typeof at !== 'object' || Array.isArray(at) || !Object.hasOwn(at, step)) return undefined
    at = (at as Record<string, unknown>)[step]
  }
  return at
}

const holds = (claim: unknown, value: string) => claim === value || (Array.isArray(claim) && claim.includes(value))
