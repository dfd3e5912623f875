import type { Sql, TransactionSql } from 'postgres'
import { HttpError } from '../http/problem.js'
import type { Role } from '../auth/principal.js'

// SQL for users. Functions take the database handle first, so the same
// function runs on the pool or inside a caller's transaction.

export interface UserRow {
  id: number
  name: string
  email: string
  role: Role
  password_hash: string | null
  /** Raised by a role or password change and by "log out everywhere"; JWTs of an older epoch are void (sql/005). */
  credential_epoch: number
  version: number
  created_at: Date
  updated_at: Date
}

export type UserWrite = Pick<UserRow, 'name' | 'email' | 'role' | 'password_hash'>

export function presentUser(row: UserRow) {
  return { id: row.id, name: row.name, email: row.email, role: row.role, created_at: row.created_at, updated_at: row.updated_at }
}

export async function findUser(db: Sql | TransactionSql, id: string): Promise<UserRow | undefined> {
  const [row] = await db<UserRow[]>`SELECT * FROM users WHERE id = ${id}`
  return row
}

/** By an address already normalized (normalizeEmail: ASCII letters lower-cased), through the unique lower(email) index. */
export async function findUserByEmail(db: Sql | TransactionSql, normalizedEmail: string): Promise<UserRow | undefined> {
  const [row] = await db<UserRow[]>`SELECT * FROM users WHERE lower(email) = ${normalizedEmail}`
  return row
}

export async function insertUser(db: Sql | TransactionSql, user: UserWrite): Promise<UserRow> {
  const [row] = await db<UserRow[]>`INSERT INTO users ${db(user)} RETURNING *`
  return row!
}

export async function updateUser(db: TransactionSql, id: number, changes: Partial<UserWrite>): Promise<UserRow> {
  const [row] = await db<UserRow[]>`
    UPDATE users SET ${db(changes, Object.keys(changes) as Array<keyof UserWrite>)}, version = version + 1,
        -- now() is the start of the transaction, which may predate the previous write if we waited on its lock.
        updated_at = greatest(clock_timestamp(), updated_at + interval '1 millisecond')
    WHERE id = ${id} RETURNING *`
  return row!
}

export async function deleteUser(db: TransactionSql, id: number): Promise<void> {
  await db`DELETE FROM users WHERE id = ${id}`
}

// Held while an admin is demoted or deleted, so that two such changes cannot
// each see the other admin and together leave none.
const LAST_ADMIN_LOCK = 4_711_000_001

/** Refuses (409) to remove the admin role from the only admin left. Call inside the transaction that does it. */
export async function ensureAnotherAdmin(tx: TransactionSql, leavingId: number): Promise<void> {
  await tx`SELECT pg_advisory_xact_lock(${LAST_ADMIN_LOCK})`
  const [other] = await tx`SELECT 1 FROM users WHERE role = 'admin' AND id <> ${leavingId} LIMIT 1`
  if (!other) throw new HttpError('last_admin', 'This is the last admin; make another user admin first.')
}
