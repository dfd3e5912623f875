import { requestOnce } from '../../core/http/outbound.js'
import { HOUR, MINUTE, SECOND } from '../../core/lib/durations.js'
import { describeError, type Logger } from '../../core/log.js'
import { importProviderKey, keyAllows, type ProviderAlgorithm, type ProviderKey } from './jws.js'

// The identity provider's signing keys, as this instance knows them: found
// through the discovery document (`jwks_uri`), fetched once and kept in
// memory, so that a token costs no fetch. Fetched again
// - when they expire (the JWKS answer's Cache-Control max-age, within
//   bounds): in the background, the cached keys answering meanwhile;
// - for a `kid` they do not hold (a key rotated in at the provider), at most
//   once every `unknownKidRefetchMs`: a flood of made-up kids costs one fetch.
// One fetch at a time, shared by every request that waits for it; each is
// bounded (a time-out, a size cap, no redirect followed), so no request
// waits on the provider longer than one fetch. A provider that cannot be
// reached leaves the cached keys working; with none cached, the requests
// that need them fail with ProviderUnavailable (503), and the next attempt
// waits `retryAfterMs`, so a provider that is down is not hammered.

export interface KeySetSettings {
  /** OIDC_ISSUER, exactly as the discovery document must repeat it. */
  issuer: string
  /** At most one fetch for unknown kids in this long. */
  unknownKidRefetchMs: number
  /**
   * One fetch, both of its GETs (discovery and JWKS), from the start of the first to the end of the last answer's body.
   */
  fetchTimeoutMs: number
  /** After a failed fetch, none before this long. */
  retryAfterMs: number
  /**
   * Bounds of how long fetched keys are used before they are fetched again, and the time when the answer says nothing.
   */
  minMaxAgeMs: number
  maxMaxAgeMs: number
  defaultMaxAgeMs: number
}

export const defaultKeySetSettings: Omit<KeySetSettings, 'issuer'> = {
  unknownKidRefetchMs: 30 * SECOND,
  fetchTimeoutMs: 5 * SECOND,
  retryAfterMs: 5 * SECOND,
  minMaxAgeMs: MINUTE,
  maxMaxAgeMs: 24 * HOUR,
  defaultMaxAgeMs: 15 * MINUTE,
}

const MAX_DOCUMENT_BYTES = 64 * 1024
const MAX_JWKS_BYTES = 256 * 1024
const MAX_KEYS = 100

/**
 * No keys are cached and the provider cannot give them now: the request is answered 503 identity_provider_unavailable.
 */
export class ProviderUnavailable extends Error {
  constructor(
    reason: string,
    /** Seconds until the next attempt, for Retry-After. */
    readonly retryAfterSeconds: number,
  ) {
    super(reason)
  }
}

/** What a token's header asks for: a key of the set, none (the token is invalid), after at most one bounded fetch. */
export type KeyLookup = ProviderKey | undefined

/** Counters of the fetches (GET /metrics). */
export interface FetchCounts {
  fetched: { inc(): void }
  failed: { inc(): void }
}

const uncounted: FetchCounts = { fetched: { inc() {} }, failed: { inc() {} } }

export class ProviderKeySet {
  private keys: readonly ProviderKey[] | undefined
  private expiresAt = 0
  private fetching: Promise<void> | undefined
  private lastFailure: { at: number; reason: string } | undefined
  private lastUnknownKidFetch = -Infinity
  private readonly stopping = new AbortController()

  constructor(
    private readonly settings: KeySetSettings,
    private readonly log: Logger,
    /** Told when a fetch changed the set: what was verified with a key that left must be forgotten. */
    private readonly onChange: () => void = () => {},
    private readonly counts: FetchCounts = uncounted,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** Whether keys are held. Not a readiness condition: our own credentials work without the provider. */
  get loaded(): boolean {
    return this.keys !== undefined
  }

  /** Fetches the keys in the background (at start-up, so that the first token does not wait). */
  prefetch(): void {
    this.fetchOnce().catch(() => {})
  }

  /** Ends a fetch under way, and makes none after (the service is stopping). */
  stop(): void {
    this.stopping.abort()
  }

  /**
   * The key that verifies a token signed with `alg`, named by `kid` (required
   * when the set holds several keys); undefined when there is none. Rejects
   * with ProviderUnavailable only when no keys are cached at all.
   */
  async keyFor(kid: string | undefined, alg: ProviderAlgorithm): Promise<KeyLookup> {
    if (!this.keys) {
      await this.fetchOnce().catch(() => {})
      if (!this.keys) {
        const failure = this.lastFailure
        throw new ProviderUnavailable(failure?.reason ?? 'no keys', Math.ceil(this.settings.retryAfterMs / 1000))
      }
    } else if (this.now() >= this.expiresAt) {
      this.fetchOnce().catch(() => {})
    }
    const found = this.find(kid, alg)
    if (found || kid === undefined || this.keys.some((k) => k.kid === kid)) return found
    // A fetch under way may bring it: a token of a key just rotated in, beside the one that asked for the fetch.
    if (this.fetching) {
      await this.fetching.catch(() => {})
      return this.find(kid, alg)
    }
    if (this.now() - this.lastUnknownKidFetch < this.settings.unknownKidRefetchMs) return undefined
    this.lastUnknownKidFetch = this.now()
    await this.fetchOnce().catch(() => {})
    return this.find(kid, alg)
  }

  private find(kid: string | undefined, alg: ProviderAlgorithm): ProviderKey | undefined {
    const keys = this.keys ?? []
    // RFC 7515 §4.1.4 lets a token leave kid out; only an unambiguous set may be used then.
    if (kid !== undefined) return keys.find((k) => k.kid === kid && keyAllows(k, alg))
    const [only] = keys
    return keys.length === 1 && keyAllows(only!, alg) ? only : undefined
  }

  /** One fetch at a time; none within retryAfterMs of a failed one. */
  private fetchOnce(): Promise<void> {
    if (this.fetching) return this.fetching
    if (this.stopping.signal.aborted) return Promise.reject(new Error('the service is stopping'))
    const failure = this.lastFailure
    if (failure && this.now() - failure.at < this.settings.retryAfterMs)
      return Promise.reject(new Error(failure.reason))
    this.fetching = this.fetchKeys().finally(() => (this.fetching = undefined))
    return this.fetching
  }

  private async fetchKeys(): Promise<void> {
    try {
      const deadline = this.now() + this.settings.fetchTimeoutMs
      const discovery = await this.getJson(
        discoveryUrl(this.settings.issuer),
        MAX_DOCUMENT_BYTES,
        'the discovery document',
        deadline,
      )
      const jwksUri = jwksUriOf(discovery.body, this.settings.issuer)
      const jwks = await this.getJson(jwksUri, MAX_JWKS_BYTES, 'the JWKS', deadline)
      const keys = keysOf(jwks.body, this.log)
      const changed = !sameKeys(this.keys, keys)
      const recovered = this.lastFailure !== undefined
      this.keys = keys
      this.expiresAt = this.now() + maxAgeOf(jwks.cacheControl, this.settings)
      this.lastFailure = undefined
      this.counts.fetched.inc()
      if (changed) {
        this.log.info('identity provider keys loaded', {
          issuer: this.settings.issuer,
          kids: keys.map((k) => k.kid ?? '(none)'),
        })
        this.onChange()
      } else if (recovered) this.log.info('identity provider reachable again', { issuer: this.settings.issuer })
    } catch (err) {
      this.counts.failed.inc()
      const reason = err instanceof Error ? err.message : String(err)
      // Once per outage: a provider that stays down is not a new line every few seconds.
      if (!this.lastFailure)
        this.log.warn(
          "cannot fetch the identity provider's keys; " +
            (this.keys ? 'the cached keys go on working' : 'its tokens are answered 503 until it can be reached'),
          { issuer: this.settings.issuer, ...describeError(err) },
        )
      this.lastFailure = { at: this.now(), reason }
      throw err
    }
  }

  private async getJson(
    url: URL,
    maxBytes: number,
    what: string,
    deadline: number,
  ): Promise<{ body: unknown; cacheControl: string | undefined }> {
    const timeoutMs = Math.max(1, Math.round(deadline - this.now()))
    const outcome = await requestOnce({
      url,
      method: 'GET',
      headers: { accept: 'application/json' },
      timeoutMs,
      maxResponseBytes: maxBytes,
      keepBody: true,
      signal: this.stopping.signal,
    })
    if (!outcome.ok || !outcome.body)
      throw new Error(`${what} at ${url.origin}: ${outcome.error ?? `answered ${outcome.status}`}`)
    try {
      return {
        body: JSON.parse(outcome.body.toString('utf8')),
        cacheControl: headerText(outcome.headers?.['cache-control']),
      }
    } catch {
      throw new Error(`${what} at ${url.origin} is not JSON`)
    }
  }
}

/** OpenID Connect Discovery §4: the issuer, without a trailing slash, and the well-known path. */
export const discoveryUrl = (issuer: string) => new URL(`${issuer.replace(/\/$/, '')}/.well-known/openid-configuration`)

function jwksUriOf(document: unknown, issuer: string): URL {
  const fields = (document && typeof document === 'object' ? document : {}) as Record<string, unknown>
  // Discovery §4.3: a document naming another issuer is not this provider's (a misconfiguration, or a substitution).
  if (fields.issuer !== issuer)
    throw new Error(
      `the discovery document names issuer ${JSON.stringify(fields.issuer)}, not OIDC_ISSUER ${JSON.stringify(issuer)}`,
    )
  const uri = fields.jwks_uri
  if (typeof uri !== 'string' || !URL.canParse(uri) || new URL(uri).protocol !== 'https:')
    throw new Error('the discovery document has no https jwks_uri')
  return new URL(uri)
}

function keysOf(jwks: unknown, log: Logger): ProviderKey[] {
  const list = jwks && typeof jwks === 'object' ? (jwks as Record<string, unknown>).keys : undefined
  if (!Array.isArray(list)) throw new Error('the JWKS has no "keys" array')
  const keys: ProviderKey[] = []
  for (const jwk of list.slice(0, MAX_KEYS)) {
    const key = importProviderKey(jwk)
    if (typeof key === 'string') log.debug('identity provider key skipped', { reason: key })
    else keys.push(key)
  }
  if (keys.length === 0) throw new Error('the JWKS holds no key that can verify RS256, PS256, ES256 or EdDSA')
  return keys
}

const sameKeys = (a: readonly ProviderKey[] | undefined, b: readonly ProviderKey[]) =>
  a !== undefined &&
  a.length === b.length &&
  a.every((k, i) => k.kid === b[i]!.kid && k.alg === b[i]!.alg && k.key.equals(b[i]!.key))

/** max-age of a Cache-Control header, within the bounds; no-store and no-cache mean as short as allowed. */
export function maxAgeOf(
  cacheControl: string | undefined,
  bounds: Pick<KeySetSettings, 'minMaxAgeMs' | 'maxMaxAgeMs' | 'defaultMaxAgeMs'>,
): number {
  if (cacheControl === undefined) return bounds.defaultMaxAgeMs
  if (/(^|,)\s*no-(store|cache)\b/i.test(cacheControl)) return bounds.minMaxAgeMs
  const m = /(?:^|,)\s*max-age\s*=\s*"?([0-9]{1,10})"?\s*(?:,|$)/i.exec(cacheControl)
  if (!m) return bounds.defaultMaxAgeMs
  return Math.min(bounds.maxMaxAgeMs, Math.max(bounds.minMaxAgeMs, Number(m[1]) * 1000))
}

const headerText = (value: string | string[] | undefined) => (Array.isArray(value) ? value.join(', ') : value)
