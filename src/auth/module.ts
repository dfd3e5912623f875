import type { Sql } from 'postgres'
import type { AppModule } from '../app-module.js'
import type { BackgroundWork } from '../core/background-work.js'
import { purgeJob } from '../core/db/batched-delete.js'
import { expiredKnownAddresses } from './login/known-addresses.js'
import { expiredLoginFailures } from './login/login-throttle.js'
import type { IdentityProvider } from './oidc/provider-principals.js'
import { oldResetRequests, spentOneTimeTokens } from './recovery/recovery.js'
import { recoveryRoutes } from './recovery/recovery-routes.js'
import type { CredentialChanges } from './revocation/credential-changes.js'
import { authRoutes } from './routes.js'
import { sessionRoutes } from './sessions/session-routes.js'

/** What auth runs beside requests, of a service's parts. */
export interface AuthModuleServices {
  credentialChanges: CredentialChanges
  recoveryRequests: BackgroundWork
  identityProvider: IdentityProvider | undefined
  /** The purges' connection (AppDeps.maintenanceSql). */
  maintenanceSql: Sql
}

/**
 * Logins, sessions, revocation, account recovery and the identity provider:
 * the routes of /auth, the listener that keeps every credential check right,
 * and the purges of what logins and recovery leave behind.
 */
export const authModule: AppModule<AuthModuleServices> = {
  name: 'auth',
  routes: [...authRoutes, ...recoveryRoutes, ...sessionRoutes],
  problems: {
    unauthorized: { status: 401, title: 'Authentication required' },
    invalid_token: { status: 401, title: 'Invalid credential' },
    invalid_credentials: { status: 401, title: 'Invalid e-mail or password' },
    forbidden: { status: 403, title: 'Forbidden' },
    insufficient_scope: { status: 403, title: 'Insufficient scope' },
    current_password_required: { status: 403, title: 'Current password required' },
    too_many_login_attempts: { status: 429, title: 'Too many login attempts' },
    invalid_one_time_token: { status: 400, title: 'Invalid or expired link' },
    email_not_verified: { status: 403, title: 'E-mail address not verified' },
    email_already_verified: { status: 409, title: 'E-mail address already verified' },
    mail_not_configured: { status: 503, title: 'Mail is not configured' },
    // A code of its own: the users resource's code for an address in use is that resource's alone to name
    // (test/resource-names.test.ts).
    restore_address_taken: { status: 409, title: 'The address to put back belongs to another account' },
    identity_provider_unavailable: { status: 503, title: 'Identity provider unavailable' },
  },
  // Written by their own statements (src/auth/sessions/sessions.ts, login/login-throttle.ts, recovery/recovery.ts);
  // a recovery event carries the user's id (and a restore the address put back), never a token or a link.
  eventTypes: [
    'session.created',
    'session.revoked',
    'login.failed',
    'user.password_reset_requested',
    'user.password_reset',
    'user.email_verified',
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
  ],
}
