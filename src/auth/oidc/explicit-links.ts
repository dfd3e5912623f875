import type { Sql } from 'postgres'
import { recordEvents } from '../../core/resources/change-events.js'
import type { EventOrigin } from '../origin.js'

// A link a local user makes itself (POST /auth/identities, src/auth/identity-routes.ts): the account of the identity
// provider whose token it holds becomes this user, whatever address the token carries. The only way a provider
// account becomes an existing local admin: a token's address never links one (identities.ts). The route checks who
// calls and its fresh proof; this is the write, with its event (user.identity_linked).

export interface LinkedIdentity {
  issuer: string
  subject: string
  user_id: number
  linked_at: string
}

/** The credential that asks: its user, and what must still hold when the link is written. */
export interface Linker {
  userId: number
  /** A JWT's credential epoch: a logout everywhere or a password or role change meanwhile voids the request. */
  epoch: number | undefined
  /** Its session: ended meanwhile, the request is void. */
  sessionId: number | undefined
}

export type LinkOutcome =
  | { linked: LinkedIdentity; created: boolean }
  /**
   * `taken`: the account is another user's; `deleted`: its user was deleted (only a later token may take it, with
   * OIDC_REPROVISION); `linked`: the caller is linked to another account of the provider already; `gone`: the caller's
   * credential was revoked, or its user deleted, while the request ran.
   */
  | { refused: 'taken' | 'deleted' | 'linked' | 'gone' }

export async function linkIdentity(
  sql: Sql,
  issuer: string,
  subject: string,
  linker: Linker,
  origin: EventOrigin,
): Promise<LinkOutcome> {
  const { userId } = linker
  try {
    return await sql.begin(async (tx): Promise<LinkOutcome> => {
      // As an API key's creation does (src/api-keys/resource.ts): the caller's authority, checked under the lock a
      // password or role change and a logout everywhere take.
      const [user] = await tx<Array<{ epoch: number }>>`
        SELECT credential_epoch AS epoch FROM users WHERE id = ${userId} AND deleted_at IS NULL FOR NO KEY UPDATE`
      if (!user || (linker.epoch !== undefined && linker.epoch !== user.epoch)) return { refused: 'gone' }
      if (linker.sessionId !== undefined) {
        const [ended] = await tx`SELECT 1 FROM sessions WHERE id = ${linker.sessionId} AND revoked_at IS NOT NULL`
        if (ended) return { refused: 'gone' }
      }
      const [existing] = await tx<Array<{ user_id: number | null; linked_at: string }>>`
        SELECT user_id, created_at AS linked_at FROM identities WHERE issuer = ${issuer} AND subject = ${subject}`
      if (existing?.user_id === userId) {
        return { linked: { issuer, subject, user_id: userId, linked_at: existing.linked_at }, created: false }
      }
      if (existing) return { refused: existing.user_id === null ? 'deleted' : 'taken' }
      const [other] = await tx`SELECT 1 FROM identities WHERE issuer = ${issuer} AND user_id = ${userId}`
      if (other) return { refused: 'linked' }
      // A token of the account seen for the first time at this moment made or linked a user of its own: taken.
      const [row] = await tx<Array<{ linked_at: string }>>`
        INSERT INTO identities (issuer, subject, user_id) VALUES (${issuer}, ${subject}, ${userId})
        ON CONFLICT (issuer, subject) DO NOTHING RETURNING created_at AS linked_at`
      if (!row) return { refused: 'taken' }
      await recordEvents(
        tx,
        [
          {
            type: 'user.identity_linked',
            subject: { type: 'user', id: userId },
            data: { id: userId, issuer, subject },
          },
        ],
        origin,
      )
      return { linked: { issuer, subject, user_id: userId, linked_at: row.linked_at }, created: true }
    })
  } catch (err) {
    // A token of another account linked the caller by its address at this moment.
    const { code, constraint_name: constraint } = err as { code?: string; constraint_name?: string }
    if (code === '23505' && constraint === 'identities_issuer_user_id_key') return { refused: 'linked' }
    throw err
  }
}
