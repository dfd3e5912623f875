import { constants, createPublicKey, verify, type KeyObject } from 'node:crypto'
import { InvalidTokenError } from '../jwt.js'

// The signature of an identity provider's JWT, checked with node:crypto only
// and in the order RFC 8725 asks for: the algorithm first, from an allow-list
// of asymmetric ones, and it must be the algorithm of the key that verifies;
// then the signature over the exact text received. HS* is never accepted
// here (an HMAC keyed with a provider's public key is the classic confusion
// attack), nor `none`, nor keys carried by the token itself (jwk, jku, x5u,
// x5c): keys come only from the provider's JWKS.

export const PROVIDER_ALGORITHMS = ['RS256', 'PS256', 'ES256', 'EdDSA'] as const
export type ProviderAlgorithm = (typeof PROVIDER_ALGORITHMS)[number]

/** A key of the provider's set, imported; `alg` is the algorithm it verifies. */
export interface ProviderKey {
  kid: string | undefined
  /** The JWK's `alg` when it names one; else any algorithm its type allows. */
  alg: ProviderAlgorithm | undefined
  key: KeyObject
}

const MIN_RSA_BITS = 2048

/** Which algorithms a key of this type may verify. */
function algorithmsOf(key: KeyObject): readonly ProviderAlgorithm[] {
  const details = key.asymmetricKeyDetails
  switch (key.asymmetricKeyType) {
    case 'rsa':
      return (details?.modulusLength ?? 0) >= MIN_RSA_BITS ? ['RS256', 'PS256'] : []
    case 'rsa-pss':
      return (details?.modulusLength ?? 0) >= MIN_RSA_BITS ? ['PS256'] : []
    case 'ec':
      return details?.namedCurve === 'prime256v1' ? ['ES256'] : []
    case 'ed25519':
    case 'ed448':
      return ['EdDSA']
    default:
      return []
  }
}

/**
 * A JWK of the provider's set as a key that may verify, or a reason to skip
 * it: one key the service cannot use (an encryption key, a curve it does
 * not support) must not make the whole set unusable.
 */
export function importProviderKey(jwk: unknown): ProviderKey | string {
  if (!jwk || typeof jwk !== 'object' || Array.isArray(jwk)) return 'not a JSON object'
  const fields = jwk as Record<string, unknown>
  if (fields.use !== undefined && fields.use !== 'sig') return `use ${JSON.stringify(fields.use)}, not sig`
  if (fields.kid !== undefined && (typeof fields.kid !== 'string' || fields.kid.length > 256))
    return 'kid is not a short string'
  if (fields.alg !== undefined && !PROVIDER_ALGORITHMS.includes(fields.alg as ProviderAlgorithm))
    return `alg ${JSON.stringify(fields.alg)} is not accepted`
  // A private member would mean the provider publishes its secret: such a set is not trusted with anything.
  if ('d' in fields || 'k' in fields) return 'a private or symmetric key'
  let key: KeyObject
  try {
    key = createPublicKey({ key: fields as never, format: 'jwk' })
  } catch {
    return 'not a public key node:crypto can import'
  }
  const allowed = algorithmsOf(key)
  const alg = fields.alg as ProviderAlgorithm | undefined
  if (allowed.length === 0 || (alg && !allowed.includes(alg)))
    return `a ${key.asymmetricKeyType} key cannot verify ${alg ?? 'any accepted algorithm'}`
  return { kid: fields.kid as string | undefined, alg, key }
}

/** Whether `key` may verify a signature made with `alg`: the key's type decides, never the token alone. */
export const keyAllows = (key: ProviderKey, alg: ProviderAlgorithm) =>
  (key.alg === undefined || key.alg === alg) && algorithmsOf(key.key).includes(alg)

export function verifySignature(
  alg: ProviderAlgorithm,
  key: ProviderKey,
  signingInput: string,
  signature: Buffer,
): boolean {
  if (!keyAllows(key, alg)) throw new InvalidTokenError('the key does not verify this algorithm')
  const data = Buffer.from(signingInput)
  switch (alg) {
    case 'RS256':
      return verify('sha256', data, key.key, signature)
    case 'PS256':
      return verify(
        'sha256',
        data,
        { key: key.key, padding: constants.RSA_PKCS1_PSS_PADDING, saltLength: 32 },
        signature,
      )
    // JWS carries r || s (RFC 7518 §3.4), not DER.
    case 'ES256':
      return signature.length === 64 && verify('sha256', data, { key: key.key, dsaEncoding: 'ieee-p1363' }, signature)
    case 'EdDSA':
      return verify(null, data, key.key, signature)
  }
}
