import type { Sql } from 'postgres'
import type { Component } from '../../core/lifecycle.js'
import type { Logger } from '../../core/log.js'
import type { Metrics } from '../../core/metrics.js'
import { BoundedMap } from '../../core/lib/bounded-map.js'
import type { Resource } from '../../core/resources/resource.js'
import type { EventOrigin } from '../origin.js'
import { InvalidTokenError } from '../jwt.js'
import type { Role, UserPrincipal } from '../principal.js'
import type { RevocationList } from '../revocation/revocations.js'
import type { ScopePolicy } from '../scopes.js'
import { ProviderIdentities } from './identities.js'
import { defaultKeySetSettings, ProviderKeySet, type KeySetSettings } from './key-set.js'
import { claimsIssuer, MAX_TOKEN_AGE_SECONDS, verifyProviderToken, type ProviderClaims } from './provider-token.js'
import type { ProviderSettings } from '../../config.js'
import type { Clock } from '../../core/lib/clock.js'

// The identity provider as authentication sees it: which bearer tokens are
// its, and the Principal each one gets. A token's signature and claims are
// checked once per instance (kept like our own JWTs, src/auth/jwt-cache.ts,
// and forgotten when a key leaves the provider's set); its user and
// revocation on every use (identities.ts).

export interface ProviderDeps {
  sql: Sql
  bounded: <T>(work: () => Promise<T>) => Promise<T>
  revocations: RevocationList
  /** Whether `revocations` may be trusted now: asked when it is used. */
  trusted: () => boolean
  scopes: ScopePolicy
  origin: EventOrigin
}

export type ProviderTuning = Partial<Omit<KeySetSettings, 'issuer'>> & {
  /** How long a link of a token's subject to its user is remembered before it is read again (identities.ts). */
  linkMaxAgeMs?: number
}

export class IdentityProvider implements Component {
  readonly name = 'identity-provider'
  readonly keys: ProviderKeySet
  private readonly verified: BoundedMap<string, ProviderClaims>
  private readonly identities: ProviderIdentities

  constructor(
    readonly settings: ProviderSettings,
    users: Resource,
    log: Logger,
    cacheSize: number,
    private readonly leewaySeconds: number,
    metrics: Metrics,
    private readonly clock: Clock,
    tuning: ProviderTuning = {},
  ) {
    this.verified = new BoundedMap(cacheSize)
    const { linkMaxAgeMs, ...keySet } = tuning
    this.identities = new ProviderIdentities(settings, users, cacheSize, linkMaxAgeMs)
    const counts = {
      fetched: metrics.counter(
        'identity_provider_key_fetches_total',
        "Fetches of the identity provider's keys (its discovery document, then its JWKS) that succeeded.",
      ),
      failed: metrics.counter(
        'identity_provider_key_fetch_failures_total',
        "Fetches of the identity provider's keys that failed: its tokens were checked with the keys cached, or " +
          'answered 503 without any.',
      ),
    }
    this.keys = new ProviderKeySet(
      { ...defaultKeySetSettings, ...keySet, issuer: settings.issuer },
      log,
      () => this.verified.clear(),
      counts,
    )
  }

  /**
   * Fetches the provider's keys at start-up, in the background: the first token need not wait, and start-up does not
   * wait for the provider.
   */
  start(): void {
    this.keys.prefetch()
  }

  /** Ends a fetch under way. */
  async stop(): Promise<void> {
    this.keys.stop()
  }

  /** Whether `token` says it is the provider's (its `iss`); read unverified, only to choose the verification. */
  issued(token: string): boolean {
    return claimsIssuer(token, this.settings.issuer)
  }

  /**
   * The token's Principal, or undefined when it is invalid, expired or revoked; rejects with ProviderUnavailable (503),
   * or AdminNotLinked (403) on the first sight of an account whose address is a local admin's.
   */
  async principalOf(token: string, deps: ProviderDeps): Promise<UserPrincipal | undefined> {
    let claims: ProviderClaims
    let user
    try {
      claims = await this.claimsOf(token)
      user = await this.identities.userOf(claims, deps)
    } catch (err) {
      // AdminNotLinked is not one: a 403 that says what to do (src/auth/credentials.ts).
      if (err instanceof InvalidTokenError) return undefined
      throw err
    }
    const role: Role = claims.admin === undefined ? user.role : claims.admin ? 'admin' : 'user'
    return {
      kind: 'user',
      userId: String(user.userId),
      role,
      scopes: deps.scopes.effective(role, claims.scopes),
      credential: {
        type: 'oidc',
        issuer: this.settings.issuer,
        subject: claims.subject,
        expiresAt: new Date(Math.min(claims.expiresAt, claims.issuedAt + MAX_TOKEN_AGE_SECONDS) * 1000).toISOString(),
        epoch: user.epoch,
        authenticatedAt: claims.authenticatedAt,
        amr: claims.amr,
      },
    }
  }

  /**
   * The claims of a token of the provider, verified as a bearer token's are (and remembered as they are): an
   * InvalidTokenError when it is not valid now; ProviderUnavailable (503) as for a bearer token.
   */
  verify(token: string): Promise<ProviderClaims> {
    return this.claimsOf(token)
  }

  private async claimsOf(token: string): Promise<ProviderClaims> {
    const now = this.clock.now() / 1000
    const cached = this.verified.get(token)
    if (
      cached &&
      now < cached.expiresAt + this.leewaySeconds &&
      now - cached.issuedAt <= MAX_TOKEN_AGE_SECONDS + this.leewaySeconds
    )
      return cached
    const claims = await verifyProviderToken(token, this.keys, this.settings, now, this.leewaySeconds)
    this.verified.set(token, claims)
    return claims
  }
}
