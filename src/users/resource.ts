import Type from 'typebox'
import { revokeApiKeysOf } from '../auth/api-keys/declaration.js'
import { requireInteractive } from '../auth/access.js'
import {
  codeMember,
  currentPasswordMember,
  currentPasswordRequired,
  freshProofMembers,
  proveCurrentPassword,
  requireFreshProof,
} from '../auth/current-password.js'
import { isAdmin, sessionOf, type Principal, type UserPrincipal } from '../auth/principal.js'
import { revokeSessionsOf } from '../auth/sessions/sessions.js'
import { originOf } from '../auth/origin.js'
import { transaction } from '../core/db/transaction.js'
import { HttpError } from '../core/http/problem.js'
import { idMember, nameSchema, timestampMember } from '../core/resources/common.js'
import { member } from '../core/resources/member.js'
import { defineResource, type Row } from '../core/resources/resource.js'
import type { ResourceHooks, Write } from '../core/resources/routes.js'
import { conflictOf, insertRow, type StoredRow } from '../core/resources/store.js'
import { addressChanged, queueVerification } from '../auth/recovery/recovery.js'
import type { Holds, Same } from '../core/lib/type-checks.js'
import { ensureAnotherAdmin, type UserRow } from '../accounts/queries.js'
import { eraseUsers } from './erasure.js'

const emailSchema = () =>
  Type.String({
    maxLength: 254,
    // local@domain with a dot in the domain; ASCII only (no internationalized addresses).
    pattern:
      "^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$",
    description: 'an e-mail address (local@domain, with a dot in the domain)',
  })

export const users = defineResource({
  name: 'User',
  path: '/users',
  table: 'users',
  // A deleted user waits in the trash for TRASH_RETENTION; moving it there ends every credential and grant of it
  // (sql/019), and the purge erases it (erasure.ts).
  trash: true,
  // A user reads and changes itself; an admin anyone (the routes below: listing and creating are an admin's).
  access: { read: 'admin-or-self', write: 'admin-or-self' },
  // The password as its scrypt hash; the epoch that a password or role change raises, voiding JWTs (sql/005),
  // and when it was raised, voiding the identity provider's tokens issued before (sql/014); whether a token of the
  // identity provider made the user (sql/018: then it has no local password unless OIDC_LOCAL_PASSWORDS).
  serverColumns: ['password_hash', 'credential_epoch', 'credential_epoch_at', 'made_by_provider'],
  members: {
    id: idMember(),
    name: member(nameSchema(), { sort: true, search: true }),
    email: member(emailSchema(), {
      sort: true,
      search: true,
      caseless: true,
      unique: { constraint: 'users_email_key', code: 'email_taken', title: 'E-mail address already in use' },
    }),
    // Role and password are access attributes: a PUT leaves them as they are unless it names them.
    role: member(Type.Union([Type.Literal('admin'), Type.Literal('user')]), {
      sort: true,
      default: 'user',
      keepOnReplace: true,
    }),
    password: member(Type.String({ minLength: 8, maxLength: 256, description: 'a password of 8 to 256 characters' }), {
      // Stored as its scrypt hash by `prepare` below; null in a patch removes it (no password login).
      virtual: true,
      secret: true,
      optional: true,
      keepOnReplace: true,
      nullable: true,
    }),
    // Set by POST /auth/verify-email; null until then, and again when the address changes (the trigger of sql/012).
    email_verified_at: member(
      Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
        description: 'when the address was verified; null until it is',
      }),
      { write: 'server' },
    ),
    created_at: timestampMember(),
    updated_at: timestampMember(),
  },
  // An admin creating a user with a password or the admin role gives a fresh proof.
  createExtras: freshProofMembers("the admin's"),
  writeExtras: {
    current_password: currentPasswordMember(
      "the caller's current password: to change one's own e-mail or password; and a fresh proof for an admin " +
        "creating a user with a password or the admin role, or setting another user's password, e-mail or admin " +
        'role (not needed within REAUTH_WINDOW of a login with every factor)',
    ),
    code: codeMember('with current_password, when the caller has a second factor: its current code'),
  },
  deleteBody: {
    current_password: currentPasswordMember(
      "the current password; required to delete one's own account (an admin deleting another user sends no body)",
    ),
  },
})

/** Only an admin may set or change a role (403; stops `"role": "admin"` mass assignment). */
function assertMaySetRole(principal: Principal): void {
  if (!isAdmin(principal)) throw new HttpError('forbidden', 'Only an admin may set or change a role.')
}

function assertMayChangeOwnCredentials(
  caller: UserPrincipal,
  provenHash: string | undefined,
  current: StoredRow,
): void {
  // A key is for a program; taking over its owner's account must not be one of the things it can do.
  requireInteractive(caller)
  if (provenHash === undefined)
    throw currentPasswordRequired('Changing your own e-mail or password needs current_password.')
  // The password changed since it was checked: the proof is for a password that no longer is.
  if (provenHash !== current.password_hash) throw currentPasswordRequired('current_password is wrong.')
}

/** A user acting on its own account, and the password hash it proved it knows. */
interface UserWriteState {
  self: UserPrincipal | undefined
  provenHash: string | undefined
  /**
   * For a step-up act on another account (docs/auth.md, "Step-up"): undefined when the caller's proof holds (in
   * the body, or its session's recent login), else why not, thrown once the transaction knows the act really
   * changes something.
   */
  stepUpRefusal: unknown
}

/**
 * Acts on another account that create lasting authority (docs/auth.md,
 * "Step-up"): a password someone else will log in with, an address that
 * password resets go to, the admin role.
 */
const isStepUp = (changes: { password_hash?: unknown; email?: unknown; role?: unknown }) =>
  changes.password_hash !== undefined || changes.email !== undefined || changes.role === 'admin'

const credentialsChanged = (changes: Record<string, unknown>) =>
  changes.role !== undefined || changes.password_hash !== undefined

export const userHooks: ResourceHooks<UserWriteState> = {
  async prepare({ op, ctx, columns }: Write) {
    const body = ctx.body as { role?: string; password?: string | null; current_password?: string }
    // Self sign-up (ALLOW_SIGNUP) creates plain users only.
    if (op === 'create' && body.role !== undefined && body.role !== 'user') assertMaySetRole(ctx.principal)
    const caller = ctx.principal.kind === 'user' ? ctx.principal : undefined
    const self = op !== 'create' && caller?.userId === ctx.params.id ? caller : undefined
    const provenHash = self && (await proveCurrentPassword(self, body.current_password, ctx))
    // A step-up on another account is checked here, before the transaction: a password hash is slow, and a query of
    // the pool from inside a transaction could wait for a connection the transactions hold. A proof given is always
    // checked (a wrong one is refused at once); a missing one is refused only if the write really changes what
    // needs it (a PUT naming the same address again does not).
    const stepUp =
      caller !== undefined &&
      !self &&
      (op === 'create'
        ? (body.password !== undefined && body.password !== null) || body.role === 'admin'
        : isStepUp({ password_hash: body.password, email: (body as { email?: string }).email, role: body.role }))
    let stepUpRefusal: unknown
    if (stepUp && body.current_password !== undefined) await requireFreshProof(caller, body, ctx)
    else if (stepUp)
      stepUpRefusal = await requireFreshProof(caller, {}, ctx).then(
        () => undefined,
        (err) => err,
      )
    if (op === 'create' && stepUpRefusal !== undefined) throw stepUpRefusal
    if (body.password !== undefined)
      columns.password_hash = body.password === null ? null : await ctx.services.passwords.hash(body.password)
    return { self, provenHash, stepUpRefusal }
  },
  async inTransaction(tx, { ctx, current, changes }, { self, provenHash, stepUpRefusal }) {
    // Checked against the stored row, so echoing one's own role back in a PUT is fine.
    if (changes.role !== undefined) assertMaySetRole(ctx.principal)
    // What really changes on another account: a PUT that names the same address again is no step-up.
    if (!self && stepUpRefusal !== undefined && isStepUp(changes)) throw stepUpRefusal
    // Whoever asks: a local password would outlive what the provider withdraws (docs/auth.md, OIDC_LOCAL_PASSWORDS).
    if (
      typeof changes.password_hash === 'string' &&
      current.made_by_provider &&
      !ctx.services.config.oidcLocalPasswords
    )
      throw new HttpError(
        'no_local_password',
        'This user was made from tokens of the identity provider: it signs in there and has no password here ' +
          '(OIDC_LOCAL_PASSWORDS is not set).',
      )
    if (self && (changes.email !== undefined || changes.password_hash !== undefined))
      assertMayChangeOwnCredentials(self, provenHash, current)
    if (changes.role === 'user') await ensureAnotherAdmin(tx, current.id)
    // A new address is verified anew, and the old one hears of the change (src/auth/recovery/recovery.ts).
    if (typeof changes.email === 'string') {
      await addressChanged(
        tx,
        ctx.services,
        { id: current.id, email: current.email as string, emailVerified: current.email_verified_at !== null },
        changes.email,
      )
    }
    // A new password ends the user's other sessions (all of them when an admin sets another user's); the trigger of
    // sql/005 voids its JWTs.
    if (changes.password_hash !== undefined) {
      const origin = originOf(ctx.principal, ctx.requestId)
      await revokeSessionsOf(tx, current.id, origin, self ? sessionOf(self.credential) : undefined)
      // An admin setting another user's password is account recovery: whoever held the account may have minted keys,
      // and they go too.
      if (!self) await revokeApiKeysOf(tx, current.id, origin)
    }
  },
  // A new user is sent a verification link, queued with its row (with verification off, the one INSERT alone).
  async insert(ctx, values) {
    const origin = ctx.services.changeOrigin(ctx)
    if (ctx.services.config.verifyEmailUrl === undefined) {
      return {
        row: await insertRow(ctx.db, users, values, origin).catch((err: unknown) =>
          Promise.reject(conflictOf(users, err)),
        ),
      }
    }
    const row = await transaction(ctx.db, async (tx) => {
      const row = await insertRow(tx, users, values, origin)
      await queueVerification(tx, ctx.services, { id: row.id as number, email: row.email as string })
      return row
    }).catch((err: unknown) => Promise.reject(conflictOf(users, err)))
    return { row }
  },
  // A role or password change revoked JWTs: answer once this instance
  // has heard it (src/auth/revocation/credential-changes.ts).
  async afterCommit({ ctx, changes }) {
    if (credentialsChanged(changes)) await ctx.services.credentialChanges.caughtUp()
  },
  // Deleting one's own account is for its owner in person: not a program's
  // key, not a stolen access token without the password.
  async prepareDelete(ctx) {
    const caller = ctx.principal.kind === 'user' ? ctx.principal : undefined
    const self = caller?.userId === ctx.params.id ? caller : undefined
    if (!self) return { self: undefined, provenHash: undefined, stepUpRefusal: undefined }
    requireInteractive(self)
    const provenHash = await proveCurrentPassword(self, ctx.body?.current_password as string | undefined, ctx)
    if (provenHash === undefined)
      throw currentPasswordRequired('Deleting your own account needs current_password in a JSON body.')
    return { self, provenHash, stepUpRefusal: undefined }
  },
  async beforeDelete(tx, current, { self, provenHash }) {
    // The password changed since it was checked: the proof is for a password that no longer is.
    if (self && provenHash !== current.password_hash) throw currentPasswordRequired('current_password is wrong.')
    // Only a live admin counts, and leaves: purging one from the trash takes no admin away.
    if (current.role === 'admin' && current.deleted_at === null) await ensureAnotherAdmin(tx, current.id)
  },
  // Its sessions, JWTs and API keys are revoked with it (the move to the trash, sql/019, or the purge).
  afterDelete: (ctx) => ctx.services.credentialChanges.caughtUp(),
  beforePurge: eraseUsers,
}

// The declaration's stored members and the accounts' row type (src/accounts/queries.ts) are the same:
// a member added to one and not the other fails the type check here.
export type UserRowsAgree = Holds<
  Same<
    Omit<Row<typeof users.members>, 'password'>,
    Omit<UserRow, 'password_hash' | 'credential_epoch' | 'made_by_provider'>
  >
>
