import { randomBytes } from 'node:crypto'
import type { Sql } from 'postgres'
import { hashPassword } from '../auth/password.js'
import { ConfigError } from '../config.js'
import { compileValidator } from '../http/validate.js'
import { UserCreate } from './schemas.js'

// The first admin. `make admin` creates one, or resets an existing user to
// admin with a new password; ADMIN_EMAIL + ADMIN_PASSWORD do the same at
// start-up, but only while no admin exists (so a later restart never resets
// a password somebody changed).

const checkUser = compileValidator(UserCreate)

/** Creates or resets the admin; returns the password (generated when none is given). */
export async function createOrResetAdmin(sql: Sql, email: string, password?: string): Promise<{ id: number; password: string; created: boolean }> {
  const secret = password ?? randomBytes(18).toString('base64url')
  const errors = checkUser.errors({ name: 'Administrator', email, password: secret })
  // A ConfigError: bad input from the operator (the command line, ADMIN_EMAIL) gets
  // its message on stderr, not the JSON-and-stack-trace main.ts prints for a crash.
  if (errors.length) throw new ConfigError(`Cannot create the admin: ${errors.map((e) => `${e.path.slice(1)} ${e.message}`).join('; ')}`)
  const passwordHash = await hashPassword(secret)
  const [row] = await sql<Array<{ id: number; created: boolean }>>`
    INSERT INTO users (name, email, role, password_hash) VALUES ('Administrator', ${email}, 'admin', ${passwordHash})
    ON CONFLICT ((lower(email))) DO UPDATE SET role = 'admin', password_hash = EXCLUDED.password_hash,
      version = users.version + 1, updated_at = now()
    RETURNING id, (xmax = 0) AS created`
  return { id: row!.id, password: secret, created: row!.created }
}

export async function bootstrapAdminIfNone(sql: Sql, admin: { email: string; password: string }): Promise<boolean> {
  const [any] = await sql`SELECT 1 FROM users WHERE role = 'admin' LIMIT 1`
  if (any) return false
  await createOrResetAdmin(sql, admin.email, admin.password)
  return true
}
