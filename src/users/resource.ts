import Type from 'typebox'
import { countAttempt, normalizeEmail, passwordProven, recordFailedLogin } from '../auth/login-throttle.js'
import { verifyInSlot } from '../auth/password.js'
import { isAdmin, type Principal, type UserPrincipal } from '../auth/principal.js'
import { revokeSessionsOf } from '../auth/sessions.js'
import { originOf } from '../events/origin.js'
import { HttpError } from '../http/problem.js'
import { idMember, nameSchema, timestampMember } from '../resources/common.js'
import { member } from '../resources/member.js'
import { defineResource } from '../resources/resource.js'
import { resourceRoutes, type ResourceContext, type ResourceHooks, type Write } from '../resources/routes.js'
import type { StoredRow } from '../resources/store.js'
import { ensureAnotherAdmin, findUser } from './queries.js'

const emailSchema = () => Type.String({
  maxLength: 254,
  // local@domain with a dot in the domain; ASCII only (no internationalized addresses).
  pattern: "^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$",
  description: 'an e-mail address (local@domain, with a dot in the domain)',
})

export const users = defineResource({
  name: 'User',
  path: '/users',
  table: 'users',
  members: {
    id: idMember(),
    name: member(nameSchema(), { sort: true, search: true }),
    email: member(emailSchema(), { sort: true, search: true, caseless: true, unique: { constraint: 'users_email_key', code: 'email_taken' } }),
    // Role and password are access attributes: a PUT leaves them as they are unless it names them.
    role: member(Type.Union([Type.Literal('admin'), Type.Literal('user')]), { sort: true, default: 'user', keepOnReplace: true }),
    password: member(Type.String({ minLength: 8, maxLength: 256, description: 'a password of 8 to 256 characters' }), {
      // Stored as its scrypt hash by `prepare` below; null in a patch removes it (no password login).
      virtual: true, secret: true, optional: true, keepOnReplace: true, nullable: true,
    }),
    created_at: timestampMember(),
    updated_at: timestampMember(),
  },
  writeExtras: {
    /** Not a member of the user: the proof a user gives when changing its own e-mail or password. */
    current_password: Type.Optional(Type.String({ minLength: 1, maxLength: 256, description: 'the current password; required to change one\'s own e-mail or password' })),
  },
})

/** Only an admin may set or change a role (403; stops `"role": "admin"` mass assignment). */
function assertMaySetRole(principal: Principal): void {
  if (!isAdmin(principal)) throw new HttpError('forbidden', 'Only an admin may set or change a role.')
}

const currentPasswordRequired = (detail: string) => new HttpError('current_password_required', detail)

/**
 * Changing one's own e-mail or password needs the current password, so that
 * a stolen access token cannot take the account over (or lock its owner out
 * with `password: null`). Guesses are throttled like logins, against the
 * account and the client address. Checked before the transaction (scrypt is
 * slow and a row lock must not wait on it); returns the hash the password
 * matched, which the transaction compares with the locked row.
 */
async function proveCurrentPassword(caller: UserPrincipal, currentPassword: string | undefined, ctx: ResourceContext): Promise<string | undefined> {
  if (currentPassword === undefined) return undefined
  const { sql, passwords, logins } = ctx.deps
  const user = await findUser(sql, caller.userId)
  if (!user?.password_hash) throw currentPasswordRequired('current_password is wrong.')
  const email = normalizeEmail(user.email)
  const from = logins.address(ctx.client)
  const ok = await passwords.withSlot(from.bucket, async () => {
    await countAttempt(sql, email, from)
    return verifyInSlot(currentPassword, user.password_hash!)
  })
  if (!ok) {
    await recordFailedLogin(sql, { email, userId: user.id, client: ctx.client }, originOf(caller, ctx.requestId))
    throw currentPasswordRequired('current_password is wrong.')
  }
  await passwordProven(sql, email, user.id, from)
  return user.password_hash
}

function assertMayChangeOwnCredentials(caller: UserPrincipal, provenHash: string | undefined, current: StoredRow): void {
  // A key is for a program; taking over its owner's account must not be one of the things it can do.
  if (caller.credential.type === 'api_key') throw new HttpError('forbidden', 'An API key cannot change its owner\'s e-mail or password; log in to do this.')
  if (provenHash === undefined) throw currentPasswordRequired('Changing your own e-mail or password needs current_password.')
  // The password changed since it was checked: the proof is for a password that no longer is.
  if (provenHash !== current.password_hash) throw currentPasswordRequired('current_password is wrong.')
}

/** A user acting on its own account, and the password hash it proved it knows. */
interface UserWriteState {
  self: UserPrincipal | undefined
  provenHash: string | undefined
}

const credentialsChanged = (changes: Record<string, unknown>) => changes.role !== undefined || changes.password_hash !== undefined

const hooks: ResourceHooks<UserWriteState> = {
  async prepare({ op, ctx, columns }: Write) {
    const body = ctx.body as { role?: string; password?: string | null; current_password?: string }
    // Self sign-up (ALLOW_SIGNUP) creates plain users only.
    if (op === 'create' && body.role !== undefined && body.role !== 'user') assertMaySetRole(ctx.principal)
    const caller = ctx.principal.kind === 'user' ? ctx.principal : undefined
    const self = op !== 'create' && caller?.userId === ctx.params.id ? caller : undefined
    const provenHash = self && (await proveCurrentPassword(self, body.current_password, ctx))
    if (body.password !== undefined) columns.password_hash = body.password === null ? null : await ctx.deps.passwords.hash(body.password)
    return { self, provenHash }
  },
  async inTransaction(tx, { ctx, current, changes }, { self, provenHash }) {
    // Checked against the stored row, so echoing one's own role back in a PUT is fine.
    if (changes.role !== undefined) assertMaySetRole(ctx.principal)
    if (self && (changes.email !== undefined || changes.password_hash !== undefined)) assertMayChangeOwnCredentials(self, provenHash, current)
    if (changes.role === 'user') await ensureAnotherAdmin(tx, current.id)
    // A new password ends the user's other sessions (all of them when an admin sets another user's); the trigger of sql/005 voids its JWTs.
    if (changes.password_hash !== undefined) {
      await revokeSessionsOf(tx, current.id, originOf(ctx.principal, ctx.requestId), self && self.credential.type !== 'api_key' ? self.credential.sessionId : undefined)
    }
  },
  // A role or password change revoked JWTs: answer once this instance has heard it (src/auth/credential-changes.ts).
  async afterCommit({ ctx, changes }) {
    if (credentialsChanged(changes)) await ctx.deps.credentialChanges.caughtUp()
  },
  async beforeDelete(tx, current) {
    if (current.role === 'admin') await ensureAnotherAdmin(tx, current.id)
  },
  // Its sessions, JWTs and API keys are revoked with it.
  afterDelete: (ctx) => ctx.deps.credentialChanges.caughtUp(),
}

export const userRoutes = resourceRoutes(users, {
  access: {
    list: { kind: 'protected', scope: 'users:read', who: 'admin' },
    create: { kind: 'protected', scope: 'users:write', who: 'admin', signup: true },
    read: { kind: 'protected', scope: 'users:read', who: 'admin-or-self' },
    write: { kind: 'protected', scope: 'users:write', who: 'admin-or-self' },
  },
  hooks,
  summaries: {
    replace: 'Replace a user\'s name and e-mail (role and password only when given)',
    delete: 'Delete a user, its sessions and its API keys',
  },
})
