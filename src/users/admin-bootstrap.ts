import { randomBytes } from 'node:crypto'
import type { Sql, TransactionSql } from 'postgres'
import { normalizeEmail } from '../auth/login/login-throttle.js'
import type { PasswordHasher } from '../auth/password.js'
import { revokeSessionsOf } from '../auth/sessions/sessions.js'
import { ConfigError } from '../core/config-error.js'
import { systemOrigin } from '../auth/origin.js'
import { insertRow, updateRow } from '../core/resources/store.js'
import { users } from './resource.js'

// The first admin. `make admin` creates one, or gives an existing admin a
// new password (ending all its sessions, as any password change does);
// ADMIN_EMAIL + ADMIN_PASSWORD create one at start-up, but only while no
// admin exists (so a later restart never resets a password somebody changed).
// Neither ever promotes an existing account that is not an admin: it may be
// anybody's (a self-registered one, say), and making it admin would hand its
// sessions and keys admin rights. Promote through the API, as an admin.

export interface AdminResult {
  id: number
  password: string
  created: boolean
}

/**
 * Creates the admin, or resets an existing admin's password; returns the password (generated when none is given). An
 * admin made from the identity provider's tokens gets none unless `localPasswords` (OIDC_LOCAL_PASSWORDS).
 */
export async function createOrResetAdmin(
  sql: Sql,
  passwords: PasswordHasher,
  email: string,
  password?: string,
  localPasswords = false,
): Promise<AdminResult> {
  const secret = password ?? randomBytes(18).toString('base64url')
  const errors = users.bodies.create.errors({ name: 'Administrator', email, password: secret })
  // A ConfigError: bad input from the operator (the command line, ADMIN_EMAIL) gets
  // its message on stderr, not the JSON-and-stack-trace main.ts prints for a crash.
  if (errors.length) throw new ConfigError(errors.map((e) => `${e.path.slice(1)} ${e.message}`).join('; '))
  const passwordHash = await passwords.hash(secret)
  return sql.begin(async (tx) => {
    const [existing] = await tx<
      Array<{ id: number; role: string; made_by_provider: boolean; email_verified_at: Date | null }>
    >`SELECT id, role, made_by_provider, email_verified_at FROM users
      WHERE lower(email) = ${normalizeEmail(email)} AND deleted_at IS NULL FOR UPDATE`
    if (existing && existing.role !== 'admin') {
      throw new ConfigError(
        `${email} belongs to an account that is not an admin; it is not promoted from here. Promote it through the ` +
          `API as an admin (PATCH /users/${existing.id} {"role":"admin"}), or choose another e-mail.`,
      )
    }
    if (existing?.made_by_provider && !localPasswords) {
      throw new ConfigError(
        `${email} belongs to an admin made from tokens of the identity provider: it signs in there and has no ` +
          'password here (OIDC_LOCAL_PASSWORDS is not set). Choose another e-mail for a local admin.',
      )
    }
    // The operator typed the admin's address where the service runs: it counts as verified (REQUIRE_VERIFIED_EMAIL must
    // not lock the first admin out). Written with the change itself, so that its event shows the row as stored.
    const verified = existing?.email_verified_at ? {} : { email_verified_at: await transactionTime(tx) }
    if (existing) {
      // A new password: the trigger of sql/005 voids the JWTs issued before; the sessions end here.
      await updateRow(tx, users, existing.id, { password_hash: passwordHash, ...verified }, systemOrigin)
      await revokeSessionsOf(tx, existing.id, systemOrigin)
      return { id: existing.id, password: secret, created: false }
    }
    const row = await insertRow(
      tx,
      users,
      { name: 'Administrator', email, role: 'admin', password_hash: passwordHash, ...verified },
      systemOrigin,
    )
    return { id: row.id, password: secret, created: true }
  })
}

/** now(), the transaction's start, as the text PostgreSQL writes (a Date would lose its microseconds). */
async function transactionTime(tx: TransactionSql): Promise<string> {
  const [{ now }] = await tx<[{ now: string }]>`SELECT now()::text AS now`
  return now
}

export async function bootstrapAdminIfNone(
  sql: Sql,
  passwords: PasswordHasher,
  admin: { email: string; password: string },
): Promise<boolean> {
  const [any] = await sql`SELECT 1 FROM users WHERE role = 'admin' AND deleted_at IS NULL LIMIT 1`
  if (any) return false
  // At start-up the operator reads "Cannot start: …": which settings, and that it was the admin that failed.
  await createOrResetAdmin(sql, passwords, admin.email, admin.password).catch((err: unknown) => {
    throw err instanceof ConfigError
      ? new ConfigError(`ADMIN_EMAIL, ADMIN_PASSWORD: cannot create the first admin: ${err.message}`)
      : err
  })
  return true
}

/**
 * The password for `make admin`: ADMIN_PASSWORD, else the first line of
 * standard input when it is not a terminal (`… | make admin`), else none (a
 * generated one is printed). Never a command-line argument: those show in `ps`.
 */
export async function adminPasswordFrom(env: NodeJS.ProcessEnv, stdin: NodeJS.ReadStream): Promise<string | undefined> {
  if (env.ADMIN_PASSWORD) return env.ADMIN_PASSWORD
  if (stdin.isTTY) return undefined
  let text = ''
  for await (const chunk of stdin) {
    text += String(chunk)
    if (text.includes('\n') || text.length > 1024) break
  }
  const line = text.split(/\r?\n/)[0]
  return line || undefined
}
