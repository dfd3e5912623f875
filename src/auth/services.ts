import type { Config } from '../config.js'
import type { BackgroundWork } from '../core/background-work.js'
import type { RateLimiter } from '../core/http/rate-limit.js'
import type { CoreServices } from '../core/http/services.js'
import type { Clock } from '../core/lib/clock.js'
import type { MailWorker } from '../mail/worker.js'
import type { ApiKeyCache } from './api-keys/key-cache.js'
import type { LastUsedWrites } from './api-keys/last-used.js'
import type { CredentialChanges } from './revocation/credential-changes.js'
import type { JwtCache } from './jwt-cache.js'
import type { LoginGuard } from './login/login-throttle.js'
import type { IdentityProvider } from './oidc/provider-principals.js'
import type { PasswordHasher } from './password.js'
import type { RevocationList } from './revocation/revocations.js'
import type { ScopePolicy } from './scopes.js'

/**
 * What auth needs of a service instance. Each function of auth takes the few
 * of these it uses (a `Pick`); the composition root's object has them all
 * (src/app-deps.ts extends this), and nothing in auth sees the rest.
 */
export interface AuthServices extends CoreServices {
  config: Config
  /** The scopes the service's resources define (src/registry.ts). */
  registry: { readonly scopes: ScopePolicy }
  /** The time this instance's own expiry checks read (src/core/lib/clock.ts); the database keeps its own now(). */
  clock: Clock
  /** JWTs this instance has verified (src/auth/jwt-cache.ts). */
  jwtCache: JwtCache
  /** API keys this instance has read, kept right by notifications from PostgreSQL (src/auth/api-keys/key-cache.ts). */
  apiKeyCache: ApiKeyCache
  /** When this process last wrote each key's last_used_at (src/auth/api-keys/last-used.ts). */
  apiKeyUse: LastUsedWrites
  /** Login attempts per address on this instance (src/auth/login/login-throttle.ts). */
  logins: LoginGuard
  /** What this instance knows was revoked: sessions, users' credential epochs (src/auth/revocation/revocations.ts). */
  revocations: RevocationList
  /**
   * The listener that keeps apiKeyCache and revocations right, and says whether they may be trusted; a request that
   * revokes waits on `caughtUp` (src/auth/revocation/credential-changes.ts).
   */
  credentialChanges: CredentialChanges
  /** Requests per window per credential, user or address; undefined when RATE_LIMIT=0 (src/core/http/rate-limit.ts). */
  rateLimiter: RateLimiter | undefined
  /** Password hashing with this instance's slots on the thread pool (src/auth/password.ts). */
  passwords: PasswordHasher
  /** Sends the mail outbox (recovery and verification messages) with the configured transport (src/mail/worker.ts). */
  mail: MailWorker
  /** Password-reset requests, worked on after their answer (src/auth/recovery/recovery-routes.ts). */
  recoveryRequests: BackgroundWork
  /**
   * The identity provider whose access tokens are accepted beside
   * ours (OIDC_ISSUER, src/auth/oidc/); undefined without one.
   */
  identityProvider: IdentityProvider | undefined
}
