/**
 * What an account is: an admin, or a user. The scopes each may
 * hold follow from the resources' access (src/auth/scopes.ts).
 */
export type Role = 'admin' | 'user'
