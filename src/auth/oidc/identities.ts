import type { Sql } from 'postgres'
import Type from 'typebox'
import { compileValidator } from '../../core/http/validate.js'
import { BoundedMap } from '../../core/lib/bounded-map.js'
import { recordEvents } from '../../core/resources/change-events.js'
import type { Resource } from '../../core/resources/resource.js'
import { eventOf, insertRow, type StoredRow } from '../../core/resources/store.js'
import type { EventOrigin } from '../origin.js'
import { InvalidTokenError } from '../jwt.js'
import type { Role } from '../principal.js'
import type { RevocationList } from '../revocation/revocations.js'
import { anotherAdminExists } from '../../accounts/queries.js'
import type { ProviderSettings } from '../../config.js'
import type { ProviderClaims } from './provider-token.js'

// Which local user a verified provider token is (table `identities`,
// sql/014): the user linked to its (issuer, subject); on first sight one
// linked to the local user with the token's verified address (never an
// admin), or made from it (users.made_by_provider, sql/018); or the user that
// linked it itself (explicit-links.ts). Kept in memory per instance like a
// JWT's claims, and checked against the revocation list on every use, so
// that a token costs no statement while this instance provably hears every
// change; when it cannot, the link is read from the database every time (it
// fails closed).
//
// A provider token has no session and no epoch of ours: withdrawal is told by
// time. Raising a user's credential epoch (logout everywhere, a password or
// role change) stamps credential_epoch_at, and the provider's tokens issued
// at or before it are refused; deleting the user leaves the link with
// user_deleted_at, and the tokens issued before it stay refused.

export interface LinkedUser {
  userId: number
  /** The local user's role (what a token's role is when OIDC_ADMIN_CLAIM is not set). */
  role: Role
  epoch: number
  /** credential_epoch_at, in ms since the epoch; -Infinity when never raised. */
  epochAtMs: number
  /** The role a token's claim asked for that the user could not take (the last admin): not asked again. */
  keptFrom?: Role
}

/** What a link was read as, and when (performance.now()): a link is read again after LINK_MAX_AGE_MS. */
type Link = (LinkedUser | { deletedAtMs: number }) & { readAt?: number }

/**
 * A link remembered longer than the revocation list remembers a revocation
 * (a day, src/auth/revocation/revocations.ts) could outlive the entry that makes it be
 * read again: it is read again well before.
 */
export const LINK_MAX_AGE_MS = 3600_000

export interface IdentityDeps {
  sql: Sql
  /** Runs database work under database admission. */
  bounded: <T>(work: () => Promise<T>) => Promise<T>
  revocations: RevocationList
  /**
   * Whether `revocations` may be trusted now (src/auth/revocation/credential-changes.ts): asked when it is used, after
   * any wait for keys.
   */
  trusted: () => boolean
  /** Who a user made from a token was made by, for its event. */
  origin: EventOrigin
}

/** Times as ms since the epoch, computed by the database (-infinity: -Infinity). */
interface LinkRow {
  user_id: number | null
  deleted_at_ms: number | null
  role: Role | null
  credential_epoch: number | null
  epoch_at_ms: number | null
  /** Its user waits in the trash (sql/019): refused as deleted, until a restore links it again. */
  trashed?: boolean
}

/** A token no user can be found or made for: 401 invalid_token, saying why. */
export class NoLocalUser extends InvalidTokenError {}

/**
 * A token whose verified address is a local admin's, on first sight of its account: never linked by the address
 * (403 identity_link_required). The admin links the account itself (POST /auth/identities).
 */
export class AdminNotLinked extends Error {
  constructor() {
    super('the address of a local admin is never linked by a token; the admin links its account itself')
  }
}

const refused = (why: string) => new NoLocalUser(why)

export class ProviderIdentities {
  private readonly links: BoundedMap<string, Link>
  private readonly newUser: ReturnType<typeof compileValidator>

  constructor(
    private readonly settings: ProviderSettings,
    /**
     * The users declaration (src/users/resource.ts): a user made from a token is written as the API writes one, with
     * its event.
     */
    private readonly users: Resource,
    size: number,
    private readonly linkMaxAgeMs = LINK_MAX_AGE_MS,
  ) {
    this.links = new BoundedMap(size)
    this.newUser = compileValidator(Type.Object({ name: users.members.name!, email: users.members.email! }))
  }

  /**
   * The local user of a verified token; a NoLocalUser when it has
   * none (deleted, no verified address, access withdrawn).
   */
  async userOf(claims: ProviderClaims, deps: IdentityDeps): Promise<LinkedUser> {
    let link = deps.trusted() ? this.links.get(claims.subject) : undefined
    if (link && performance.now() - (link.readAt ?? 0) > this.linkMaxAgeMs) link = undefined
    if (link && 'userId' in link && deps.revocations.revokesUser(link.userId, link.epoch)) link = undefined
    if (link && 'deletedAtMs' in link && this.reprovisions(claims, link)) link = undefined
    link ??= await this.read(claims.subject, deps)
    if (link === undefined || ('deletedAtMs' in link && this.reprovisions(claims, link)))
      link = await this.provision(claims, deps)
    if ('deletedAtMs' in link) {
      throw refused(
        claims.issuedAt * 1000 <= link.deletedAtMs
          ? 'the user of this token was deleted after it was issued'
          : 'the user of this token was deleted, and OIDC_REPROVISION is not set',
      )
    }
    if (claims.issuedAt * 1000 <= link.epochAtMs)
      throw refused(
        'issued before the access of its user was withdrawn (a logout everywhere, a password or role change)',
      )
    const claimed: Role | undefined = claims.admin === undefined ? undefined : claims.admin ? 'admin' : 'user'
    if (claimed !== undefined && claimed !== link.role && claimed !== link.keptFrom)
      link = await this.takeRole(link, claimed, claims, deps)
    return link
  }

  /** Forgets every link (tests; a TRUNCATE is caught by the revocation list anyway). */
  clear(): void {
    this.links.clear()
  }

  /** A token issued after its user's deletion makes the user again, with OIDC_REPROVISION=true. */
  private reprovisions(claims: ProviderClaims, link: { deletedAtMs: number }): boolean {
    return this.settings.reprovision && claims.issuedAt * 1000 > link.deletedAtMs
  }

  private async read(subject: string, deps: IdentityDeps): Promise<Link | undefined> {
    const [row] = await deps.bounded(
      () => deps.sql<LinkRow[]>`
      SELECT i.user_id, (extract(epoch FROM i.user_deleted_at) * 1000)::float8 AS deleted_at_ms, u.role,
      u.credential_epoch, (extract(epoch FROM u.credential_epoch_at) * 1000)::float8 AS epoch_at_ms,
      i.trashed_user_id IS NOT NULL AS trashed
      FROM identities i LEFT JOIN users u ON u.id = i.user_id
      WHERE i.issuer = ${this.settings.issuer} AND i.subject = ${subject}`,
    )
    if (!row) return undefined
    // A user in the trash is refused as a deleted one (sql/019), but not remembered so: a restore links it again.
    if (row.trashed) return linkOf(row)
    return this.remember(subject, linkOf(row))
  }

  private remember(subject: string, link: Link): Link {
    this.links.set(subject, { ...link, readAt: link.readAt ?? performance.now() })
    return link
  }

  /**
   * Links the token's subject to the local user with its verified address,
   * or to a user made from its claims. A local user whose address is not
   * verified is not linked: whoever signed up with it may not be its owner
   * (the pre-hijacking of an account the provider's user would then use). Nor
   * is an admin (AdminNotLinked): an address at the provider is not enough
   * for the authority of a local admin, the bootstrap admin among them; the
   * admin links its account itself. Without OIDC_REPROVISION, the address of
   * a deleted user that was linked is nobody's again: another account of the
   * provider with it gets no user (the deleted one's own is refused by its link).
   */
  private async provision(claims: ProviderClaims, deps: IdentityDeps, again = true): Promise<LinkedUser> {
    const email = claims.verifiedEmail
    if (email === undefined)
      throw refused(
        'the token carries no verified e-mail address (email with email_verified true): no user can be made for it',
      )
    const name = [claims.name?.trim(), email.split('@')[0]].find(
      (n) => n && this.newUser.errors({ name: n, email }).length === 0,
    )
    if (name === undefined) throw refused("the token's e-mail address is not one this service accepts")
    const role: Role = claims.admin ? 'admin' : 'user'
    try {
      const row = await deps.bounded(() =>
        deps.sql.begin(async (tx) => {
          const [existing] = await tx<Array<{ id: number; verified: boolean; role: Role }>>`
          SELECT id, email_verified_at IS NOT NULL AS verified, role FROM users WHERE lower(email) =
          lower(${email}) AND deleted_at IS NULL FOR UPDATE`
          if (existing?.role === 'admin') throw new AdminNotLinked()
          // Read after the lock above: a deletion of the user with this address that it waited for is seen here.
          const [deleted] = this.settings.reprovision
            ? []
            : await tx`
            SELECT 1 FROM identities WHERE issuer = ${this.settings.issuer} AND deleted_email IS NOT NULL
              AND lower(deleted_email) = lower(${email}) LIMIT 1`
          if (deleted)
            throw refused(
              'a user with this address was deleted, and OIDC_REPROVISION is not set: no account of the provider ' +
                'gets a user for it again',
            )
          if (existing && !existing.verified)
            throw refused(
              'a local user holds this address without having verified it; it is linked once that user verifies it ' +
                '(POST /auth/verify-email)',
            )
          const userId =
            existing?.id ??
            Number(
              (
                await insertRow(
                  tx,
                  this.users,
                  { name, email, role, email_verified_at: new Date(), made_by_provider: true },
                  deps.origin,
                )
              ).id,
            )
          // A link left by a deleted user is taken over only here, for a token issued after the deletion
          // (reprovisions); the tokens issued before it stay refused for the new user too.
          await tx`
          UPDATE users u SET credential_epoch_at = greatest(u.credential_epoch_at, i.user_deleted_at)
          FROM identities i
          WHERE u.id = ${userId} AND i.issuer = ${this.settings.issuer} AND i.subject = ${claims.subject}
            AND i.user_id IS NULL`
          const [linked] = await tx<Array<{ user_id: number }>>`
          INSERT INTO identities (issuer, subject, user_id) VALUES
          (${this.settings.issuer}, ${claims.subject}, ${userId})
          ON CONFLICT (issuer, subject) DO UPDATE SET user_id = excluded.user_id, user_deleted_at = NULL,
            deleted_email = NULL, trashed_user_id = NULL
            WHERE identities.user_id IS NULL AND identities.user_deleted_at < to_timestamp(${claims.issuedAt})
          RETURNING user_id`
          if (!linked) throw new LinkedMeanwhile()
          const [user] = await tx<LinkRow[]>`
          SELECT id AS user_id, NULL AS deleted_at_ms, role, credential_epoch, (extract(epoch FROM
          credential_epoch_at) * 1000)::float8 AS epoch_at_ms FROM users WHERE id = ${userId}`
          return user!
        }),
      )
      return this.remember(claims.subject, linkOf(row)) as LinkedUser
    } catch (err) {
      const { code, constraint_name: constraint } = err as { code?: string; constraint_name?: string }
      if (code === '23505' && constraint === 'identities_issuer_user_id_key')
        throw refused('the user with this address is linked to another account of the identity provider')
      // Another request linked it, or made a user with the address, at the same moment: what it did is in the
      // database now. Read as it is, or tried once more (a user made for another subject is then refused).
      if (err instanceof LinkedMeanwhile || (code === '23505' && constraint === 'users_email_key')) {
        const link = await this.read(claims.subject, deps)
        if (link && 'userId' in link) return link
        if (link) throw refused('the user of this token was deleted')
        if (again) return this.provision(claims, deps, false)
        throw refused('the user of this token could not be linked; try again')
      }
      throw err
    }
  }

  /**
   * OIDC_ADMIN_CLAIM decides the role of every token: the local user takes
   * it, so that what reads the role from the database (a webhook's owner,
   * the last admin) agrees. The change voids the provider's tokens issued
   * before this one (they carry the old role), not this one; it never
   * removes the last admin.
   */
  private async takeRole(
    link: LinkedUser,
    role: Role,
    claims: ProviderClaims,
    deps: IdentityDeps,
  ): Promise<LinkedUser> {
    const row = await deps.bounded(() =>
      deps.sql.begin(async (tx) => {
        // Under the lock the API's demotions take (src/accounts/queries.ts): two at once cannot leave no admin.
        if (role === 'user' && !(await anotherAdminExists(tx, link.userId))) return undefined
        // Set explicitly, so that the trigger of sql/014 does not
        // stamp the time of the change instead; never moved back.
        const [user] = await tx<Array<Record<string, unknown>>>`
        UPDATE users SET role = ${role}, credential_epoch_at = CASE
            WHEN to_timestamp(${claims.issuedAt}) - interval '1 millisecond' > credential_epoch_at THEN
              to_timestamp(${claims.issuedAt}) - interval '1 millisecond'
            ELSE clock_timestamp() END
        WHERE id = ${link.userId} AND role <> ${role} AND deleted_at IS NULL
        RETURNING *, (extract(epoch FROM credential_epoch_at) * 1000)::float8 AS epoch_at_ms`
        if (user)
          await recordEvents(tx, [eventOf(this.users, this.users.events.updated, user as StoredRow)], deps.origin)
        return user
      }),
    )
    // The last admin stays one in the database; the token still has the role its claim gives (provider-principals.ts).
    if (!row) return this.remember(claims.subject, { ...link, keptFrom: role }) as LinkedUser
    const taken: LinkedUser = {
      userId: link.userId,
      role,
      epoch: Number(row.credential_epoch),
      epochAtMs: Number(row.epoch_at_ms),
    }
    return this.remember(claims.subject, taken) as LinkedUser
  }
}

class LinkedMeanwhile extends Error {}

function linkOf(row: LinkRow): Link {
  if (row.user_id === null) return { deletedAtMs: Number(row.deleted_at_ms) }
  return {
    userId: Number(row.user_id),
    role: row.role!,
    epoch: row.credential_epoch!,
    epochAtMs: Number(row.epoch_at_ms),
  }
}
