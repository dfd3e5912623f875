import { clearFailures, countAttempt, normalizeEmail } from '../auth/login-throttle.js'
import { verifyInSlot } from '../auth/password.js'
import { addressBucket } from '../http/client-address.js'
import { revokeSessionsOf } from '../auth/sessions.js'
import { listCollection } from '../collections/list-query.js'
import { etagFor } from '../http/conditional.js'
import { HttpError, notFound } from '../http/problem.js'
import { isAdmin, type Principal, type UserPrincipal } from '../auth/principal.js'
import { defineRoute, type HandlerContext, type Reply } from '../http/route.js'
import { compileValidator } from '../http/validate.js'
import { changedMembers, checkEchoedId, lockForWrite } from '../resources/common.js'
import { usersCollection } from './collection.js'
import { deleteUser, ensureAnotherAdmin, findUser, insertUser, presentUser, updateUser, type UserRow, type UserWrite } from './queries.js'
import { User, UserCreate, UserPage, UserPatch, UserReplace } from './schemas.js'

const createBody = { kind: 'json' as const, validator: compileValidator(UserCreate) }
const replaceBody = { kind: 'json' as const, validator: compileValidator(UserReplace) }
const patchBody = { kind: 'merge-patch' as const, validator: compileValidator(UserPatch) }

/** Only an admin may set or change a role (403; stops `"role": "admin"` mass assignment). */
function assertMaySetRole(principal: Principal): void {
  if (!isAdmin(principal)) throw new HttpError('forbidden', 'Only an admin may set or change a role.')
}

const userReply = (status: number, row: UserRow, extra: Record<string, string> = {}): Reply => ({
  status,
  headers: { etag: etagFor(row.version), ...extra },
  body: presentUser(row),
})

const currentPasswordRequired = (detail: string) => new HttpError('current_password_required', detail)

/**
 * Changing one's own e-mail or password needs the current password, so that
 * a stolen access token cannot take the account over (or lock its owner out
 * with `password: null`). Guesses are throttled like logins, against the
 * account and the client address. Checked before the transaction (scrypt is
 * slow and a row lock must not wait on it); returns the hash the password
 * matched, which the transaction compares with the locked row.
 */
async function proveCurrentPassword(caller: UserPrincipal, currentPassword: string | undefined, ctx: HandlerContext<unknown, unknown>): Promise<string | undefined> {
  if (currentPassword === undefined) return undefined
  const { sql } = ctx.deps
  const user = await findUser(sql, caller.userId)
  if (!user?.password_hash) throw currentPasswordRequired('current_password is wrong.')
  const email = normalizeEmail(user.email)
  const address = addressBucket(ctx.client)
  const ok = await ctx.deps.passwords.withSlot(address, async () => {
    await countAttempt(sql, email, address)
    return verifyInSlot(currentPassword, user.password_hash!)
  })
  if (!ok) throw currentPasswordRequired('current_password is wrong.')
  await clearFailures(sql, email, address)
  return user.password_hash
}

function assertMayChangeOwnCredentials(caller: UserPrincipal, provenHash: string | undefined, current: UserRow): void {
  // A key is for a program; taking over its owner's account must not be one of the things it can do.
  if (caller.credential.type === 'api_key') throw new HttpError('forbidden', 'An API key cannot change its owner\'s e-mail or password; log in to do this.')
  if (provenHash === undefined) throw currentPasswordRequired('Changing your own e-mail or password needs current_password.')
  // The password changed since it was checked: the proof is for a password that no longer is.
  if (provenHash !== current.password_hash) throw currentPasswordRequired('current_password is wrong.')
}

/**
 * PUT and PATCH: the new state is computed from the locked current row, so
 * concurrent writes serialize and If-Match is checked against what is written.
 * A new password is hashed before the transaction: scrypt is slow, and a row
 * lock must not wait on it. A new password ends the user's other sessions
 * (all of them when an admin sets another user's); with a role change, the
 * trigger of sql/005 voids the user's JWTs, and the answer waits until this
 * instance has heard it.
 */
async function writeUser(ctx: HandlerContext<unknown, UserReplace | UserPatch>, next: (current: UserRow, passwordHash: string | null | undefined) => Partial<UserWrite>): Promise<Reply> {
  checkEchoedId(ctx.body, ctx.params.id!)
  const caller = ctx.principal.kind === 'user' ? ctx.principal : undefined
  const self = caller?.userId === ctx.params.id ? caller : undefined
  const provenHash = self && (await proveCurrentPassword(self, ctx.body.current_password, ctx))
  const { password } = ctx.body
  const passwordHash = password === undefined || password === null ? password : await ctx.deps.passwords.hash(password)
  let credentialsChanged = false
  const row = await ctx.deps.sql.begin(async (tx) => {
    const current = await lockForWrite<UserRow>(tx, 'users', ctx.params.id!, ctx.headers['if-match'])
    const changes = changedMembers(current, next(current, passwordHash))
    // Checked against the stored row, so echoing one's own role back in a PUT is fine.
    if (changes.role !== undefined) assertMaySetRole(ctx.principal)
    if (self && (changes.email !== undefined || changes.password_hash !== undefined)) assertMayChangeOwnCredentials(self, provenHash, current)
    if (changes.role === 'user') await ensureAnotherAdmin(tx, current.id)
    credentialsChanged = changes.role !== undefined || changes.password_hash !== undefined
    const updated = Object.keys(changes).length ? await updateUser(tx, current.id, changes) : current
    if (changes.password_hash !== undefined) {
      const keep = self && self.credential.type !== 'api_key' ? self.credential.sessionId : undefined
      await revokeSessionsOf(tx, current.id, keep)
    }
    return updated
  })
  if (credentialsChanged) await ctx.deps.credentialChanges.caughtUp()
  return userReply(200, row)
}

export const userRoutes = [
  defineRoute({
    method: 'GET',
    path: '/users',
    summary: 'List users: filter, sort, page, select',
    responses: { 200: { description: 'A page of users', schema: UserPage, headers: ['link', 'x-total-count'] } },
    access: { kind: 'protected', scope: 'users:read', who: 'admin' },
    query: usersCollection.queryValidator,
    handle: ({ query, deps }) =>
      listCollection(usersCollection, query, {
        deps,
      }),
  }),

  defineRoute({
    method: 'POST',
    path: '/users',
    summary: 'Create a user',
    responses: { 201: { description: 'The created user', schema: User, headers: ['etag', 'location'] } },
    access: { kind: 'protected', scope: 'users:write', who: 'admin', signup: true },
    idempotent: true,
    body: createBody,
    async handle({ body, principal, deps }) {
      // Self sign-up (ALLOW_SIGNUP) creates plain users only.
      if (body.role !== undefined && body.role !== 'user') assertMaySetRole(principal)
      const passwordHash = body.password === undefined ? null : await deps.passwords.hash(body.password)
      const row = await insertUser(deps.sql, { name: body.name, email: body.email, role: body.role ?? 'user', password_hash: passwordHash })
      return userReply(201, row, { location: `${deps.config.apiPrefix}/users/${row.id}` })
    },
  }),

  defineRoute({
    method: 'GET',
    path: '/users/{id}',
    summary: 'Read a user',
    responses: { 200: { description: 'The user', schema: User, headers: ['etag'] } },
    access: { kind: 'protected', scope: 'users:read', who: 'admin-or-self' },
    async handle({ params, deps }) {
      const row = await findUser(deps.sql, params.id!)
      if (!row) throw notFound()
      return userReply(200, row)
    },
  }),

  defineRoute({
    method: 'PUT',
    path: '/users/{id}',
    summary: 'Replace a user\'s name and e-mail (role and password only when given)',
    responses: { 200: { description: 'The user', schema: User, headers: ['etag'] } },
    access: { kind: 'protected', scope: 'users:write', who: 'admin-or-self' },
    requiresIfMatch: true,
    body: replaceBody,
    handle: (ctx) =>
      writeUser(ctx, (current, passwordHash) => ({
        name: ctx.body.name,
        email: ctx.body.email,
        role: ctx.body.role ?? current.role,
        password_hash: passwordHash === undefined ? current.password_hash : passwordHash,
      })),
  }),

  defineRoute({
    method: 'PATCH',
    path: '/users/{id}',
    summary: 'Change a user (JSON merge patch)',
    responses: { 200: { description: 'The user', schema: User, headers: ['etag'] } },
    access: { kind: 'protected', scope: 'users:write', who: 'admin-or-self' },
    requiresIfMatch: true,
    body: patchBody,
    handle: (ctx) =>
      writeUser(ctx, (_current, passwordHash) => ({
        name: ctx.body.name,
        email: ctx.body.email,
        role: ctx.body.role,
        password_hash: passwordHash,
      })),
  }),

  defineRoute({
    method: 'DELETE',
    path: '/users/{id}',
    summary: 'Delete a user, its sessions and its API keys',
    responses: { 204: { description: 'Deleted' } },
    access: { kind: 'protected', scope: 'users:write', who: 'admin-or-self' },
    requiresIfMatch: true,
    async handle({ params, headers, deps }) {
      await deps.sql.begin(async (tx) => {
        const current = await lockForWrite<UserRow>(tx, 'users', params.id!, headers['if-match'])
        if (current.role === 'admin') await ensureAnotherAdmin(tx, current.id)
        await deleteUser(tx, current.id)
      })
      // Its sessions, JWTs and API keys are revoked: answer once this instance has heard it (src/auth/credential-changes.ts).
      await deps.credentialChanges.caughtUp()
      return { status: 204 }
    },
  }),
]
