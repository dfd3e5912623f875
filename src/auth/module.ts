import Type from 'typebox'
import type { Sql } from 'postgres'
import type { AppModule } from '../app-module.js'
import type { BackgroundWork } from '../core/background-work.js'
import { purgeJob } from '../core/db/batched-delete.js'
import { expiredKnownAddresses } from './login/known-addresses.js'
import { expiredLoginFailures } from './login/login-throttle.js'
import { identityRoutes } from './identity-routes.js'
import type { IdentityProvider } from './oidc/provider-principals.js'
import { oldResetRequests, spentOneTimeTokens } from './recovery/recovery.js'
import { recoveryRoutes } from './recovery/recovery-routes.js'
import type { CredentialChanges } from './revocation/credential-changes.js'
import { authRoutes } from './routes.js'
import type { Config } from '../config.js'
import { Job } from '../core/scheduler.js'
import { MINUTE } from '../core/lib/durations.js'
import { expiredChallenges } from './mfa/challenges.js'
import { resealTotpSecrets } from './mfa/factors.js'
import { mfaRoutes } from './mfa-routes.js'
import { sessionRoutes } from './sessions/session-routes.js'

/** What auth runs beside requests, of a service's parts. */
export interface AuthModuleServices {
  credentialChanges: CredentialChanges
  recoveryRequests: BackgroundWork
  identityProvider: IdentityProvider | undefined
  /** The purges' connection (AppDeps.maintenanceSql). */
  maintenanceSql: Sql
  /** The JWT secrets, which seal TOTP secrets (src/core/lib/sealed-text.ts). */
  config: Pick<Config, 'jwtSecrets'>
}

/**
 * Logins, sessions, revocation, account recovery and the identity provider
 * (its accounts, and their links): the routes of /auth, the listener that
 * keeps every credential check right, and the purges of what logins and
 * recovery leave behind.
 */
export const authModule: AppModule<AuthModuleServices> = {
  name: 'auth',
  routes: [...authRoutes, ...mfaRoutes, ...recoveryRoutes, ...sessionRoutes, ...identityRoutes],
  problems: {
    unauthorized: { status: 401, title: 'Authentication required' },
    invalid_token: { status: 401, title: 'Invalid credential' },
    invalid_credentials: { status: 401, title: 'Invalid e-mail or password' },
    forbidden: { status: 403, title: 'Forbidden' },
    insufficient_scope: { status: 403, title: 'Insufficient scope' },
    current_password_required: { status: 403, title: 'Current password required' },
    mfa_required: {
      status: 401,
      title: 'Second factor required',
      members: {
        mfa_token: Type.String({ description: 'with mfa_required: for POST /auth/login/mfa, single use' }),
        expires_in: Type.Integer({ description: 'with mfa_required: seconds the mfa_token is good for' }),
      },
    },
    mfa_code_required: { status: 403, title: 'Second-factor code required' },
    mfa_enrollment_required: { status: 403, title: 'Second factor enrolment required' },
    mfa_already_enabled: { status: 409, title: 'Second factor already on' },
    mfa_not_enabled: { status: 409, title: 'No second factor' },
    too_many_login_attempts: { status: 429, title: 'Too many login attempts' },
    invalid_one_time_token: { status: 400, title: 'Invalid or expired link' },
    email_not_verified: { status: 403, title: 'E-mail address not verified' },
    email_already_verified: { status: 409, title: 'E-mail address already verified' },
    mail_not_configured: { status: 503, title: 'Mail is not configured' },
    // A code of its own: the users resource's code for an address in use is that resource's alone to name
    // (test/resource-names.test.ts).
    restore_address_taken: { status: 409, title: 'The address to put back belongs to another account' },
    identity_provider_unavailable: { status: 503, title: 'Identity provider unavailable' },
    identity_link_required: { status: 403, title: 'Link this account from the local one' },
    identity_already_linked: { status: 409, title: 'Account of the identity provider already linked' },
    invalid_identity_token: { status: 422, title: 'Invalid token of the identity provider' },
  },
  // Written by their own statements (src/auth/sessions/sessions.ts, login/login-throttle.ts, recovery/recovery.ts,
  // oidc/explicit-links.ts, mfa-routes.ts); a recovery event carries the user's id (and a restore the address put
  // back), never a token or a link.
  eventTypes: [
    'session.created',
    'session.revoked',
    'login.failed',
    'user.password_reset_requested',
    'user.password_reset',
    'user.email_verified',
    'user.mfa_enabled',
    'user.mfa_disabled',
    'user.identity_linked',
    'user.email_restored',
  ],
  components: (s) => [s.credentialChanges, s.recoveryRequests, s.identityProvider],
  jobs: (s) => [
    ...s.credentialChanges.jobs,
    purgeJob({
      name: 'logins.purge-failures',
      table: 'login_failures',
      where: expiredLoginFailures,
      sql: s.maintenanceSql,
    }),
    purgeJob({
      name: 'logins.purge-known-addresses',
      table: 'login_known_addresses',
      where: expiredKnownAddresses,
      sql: s.maintenanceSql,
    }),
    purgeJob({
      name: 'recovery.purge-tokens',
      table: 'one_time_tokens',
      where: spentOneTimeTokens,
      sql: s.maintenanceSql,
    }),
    purgeJob({
      name: 'recovery.purge-requests',
      table: 'password_reset_requests',
      where: oldResetRequests,
      sql: s.maintenanceSql,
    }),
    purgeJob({
      name: 'mfa.purge-challenges',
      table: 'mfa_challenges',
      where: expiredChallenges,
      sql: s.maintenanceSql,
    }),
    // Like webhook secrets, TOTP secrets move to the first JWT secret while an older one is still configured.
    new Job({
      name: 'mfa.reseal',
      periodMs: MINUTE,
      firstRunMs: 0,
      run: () => resealTotpSecrets(s.maintenanceSql, s.config.jwtSecrets),
    }),
  ],
}
