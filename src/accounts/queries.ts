import type { Sql, TransactionSql } from 'postgres'
import { HttpError } from '../core/http/problem.js'

// The accounts table as the service reads it, below both auth (logins,
// sessions, the identity provider) and the users resource (src/users/), which
// both need it. Functions take the database handle first, so the same function
// runs on the pool or inside a caller's transaction.

/**
 * A user's row: the users declaration's stored members (src/users/resource.ts
 * holds the two in step, at compile time) and the columns only the service reads.
 */
export type UserRow = {
  id: number
  name: string
  email: string
  role: 'admin' | 'user'
  email_verified_at: string | null
  created_at: string
  updated_at: string
  version: number
  password_hash: string | null
  /** Raised by a role or password change and by "log out everywhere"; JWTs of an older epoch are void (sql/005). */
  credential_epoch: number
  /** Made from a token of the identity provider, not an account a token was linked to (sql/018). */
  made_by_provider: boolean
}

/**
 * The password hash a user may log in and prove itself with: none for a user made from the identity provider's tokens
 * unless OIDC_LOCAL_PASSWORDS (`localPasswords`) allows one, whatever the row holds (a reset made before the rule).
 */
export const localPasswordHash = (
  user: Pick<UserRow, 'password_hash' | 'made_by_provider'>,
  localPasswords: boolean,
): string | null => (user.made_by_provider && !localPasswords ? null : user.password_hash)

/** A live user (not in the trash); so is every lookup here. */
export async function findUser(db: Sql | TransactionSql, id: string): Promise<UserRow | undefined> {
  const [row] = await db<UserRow[]>`SELECT * FROM users WHERE id = ${id} AND deleted_at IS NULL`
  return row
}

/**
 * By an address already normalized (normalizeEmail: ASCII letters lower-cased), through the unique lower(email) index.
 */
export async function findUserByEmail(db: Sql | TransactionSql, normalizedEmail: string): Promise<UserRow | undefined> {
  const [row] = await db<UserRow[]>`SELECT * FROM users WHERE lower(email) = ${normalizedEmail} AND deleted_at IS NULL`
  return row
}

// Held while an admin is demoted or deleted, so that two such changes cannot
// each see the other admin and together leave none.
const LAST_ADMIN_LOCK = 4_711_000_001

/**
 * Whether an admin other than `leavingId` exists, holding the lock until the transaction ends: call it inside the
 * transaction that removes the role.
 */
export async function anotherAdminExists(tx: TransactionSql, leavingId: number): Promise<boolean> {
  await tx`SELECT pg_advisory_xact_lock(${LAST_ADMIN_LOCK})`
  const [other] = await tx`
    SELECT 1 FROM users WHERE role = 'admin' AND id <> ${leavingId} AND deleted_at IS NULL LIMIT 1`
  return other !== undefined
}

/** Refuses (409) to remove the admin role from the only admin left. Call inside the transaction that does it. */
export async function ensureAnotherAdmin(tx: TransactionSql, leavingId: number): Promise<void> {
  if (!(await anotherAdminExists(tx, leavingId)))
    throw new HttpError('last_admin', 'This is the last admin; make another user admin first.')
}
