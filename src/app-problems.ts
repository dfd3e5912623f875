import type { ProblemType } from './core/http/problem.js'

// The problem codes of the application's own rules (authentication, the
// last admin, limits); core registers its own, and each resource's unique
// constraints come from its declaration. Registered when the registry is
// built (src/registry.ts).

export const applicationProblems: Record<string, ProblemType> = {
  unauthorized: { status: 401, title: 'Authentication required' },
  invalid_token: { status: 401, title: 'Invalid credential' },
  invalid_credentials: { status: 401, title: 'Invalid e-mail or password' },
  forbidden: { status: 403, title: 'Forbidden' },
  insufficient_scope: { status: 403, title: 'Insufficient scope' },
  current_password_required: { status: 403, title: 'Current password required' },
  last_admin: { status: 409, title: 'The last admin cannot be removed' },
  api_key_limit: { status: 409, title: 'Too many API keys' },
  too_many_login_attempts: { status: 429, title: 'Too many login attempts' },
  too_many_streams: { status: 503, title: 'Too many event streams' },
  // Account recovery (src/auth/recovery/recovery-routes.ts).
  invalid_one_time_token: { status: 400, title: 'Invalid or expired link' },
  email_not_verified: { status: 403, title: 'E-mail address not verified' },
  email_already_verified: { status: 409, title: 'E-mail address already verified' },
  mail_not_configured: { status: 503, title: 'Mail is not configured' },
  // Tokens of the identity provider (src/auth/oidc/).
  identity_provider_unavailable: { status: 503, title: 'Identity provider unavailable' },
}
