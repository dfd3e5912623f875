// What this instance knows was revoked, so that a JWT is checked against
// revocation without a database read. Fed by the triggers of
// sql/005_revocations.sql through src/auth/revocation/credential-changes.ts, and loaded
// whole from the `revocations` table whenever
// the instance cannot know what it missed.
//
// Two rules cover every revocation:
// - a session ended: every JWT naming it (`sid`) is void;
// - a user's credential epoch raised to E: every JWT of that user issued at
//   an epoch below E (`gen`) is void; a deleted user's epoch is Infinity.
//
// Only additions: nothing is ever un-revoked, so applying a notification and
// a load in any order gives the same state. An entry is kept until every JWT
// it can concern has expired (ENTRY_LIFETIME_MS, longer than the longest
// ACCESS_TOKEN_TTL plus the clock leeway), then swept.

/** Longest ACCESS_TOKEN_TTL (a day) plus leeway; the table keeps rows as long (sql/005). */
export const ENTRY_LIFETIME_MS = (86_400 + 300) * 1000

export interface RevocationRow {
  kind: 'session' | 'epoch' | 'deleted'
  user_id: number
  session_id: number | null
  epoch: number | null
  /** ms since the epoch */
  expires_at: number
}

export class RevocationList {
  private readonly sessions = new Map<number, number>()
  private readonly epochs = new Map<number, { epoch: number; expiresAt: number }>()

  constructor(private readonly now: () => number = Date.now) {}

  get size(): number {
    return this.sessions.size + this.epochs.size
  }

  /** Whether a JWT of `userId`, naming session `sessionId`, issued at `epoch`, has been revoked. */
  revokes(userId: number, sessionId: number, epoch: number): boolean {
    return this.sessions.has(sessionId) || this.revokesUser(userId, epoch)
  }

  /**
   * Whether credentials of `userId` held at `epoch` (a provider token's
   * user, src/auth/oidc/identities.ts) have been revoked.
   */
  revokesUser(userId: number, epoch: number): boolean {
    const floor = this.epochs.get(userId)
    return floor !== undefined && epoch < floor.epoch
  }

  revokeSession(sessionId: number, expiresAt = this.now() + ENTRY_LIFETIME_MS): void {
    this.sessions.set(sessionId, Math.max(expiresAt, this.sessions.get(sessionId) ?? 0))
  }

  /** Credentials of `userId` issued below `epoch` are void; Infinity for a deleted user. */
  raiseEpoch(userId: number, epoch: number, expiresAt = this.now() + ENTRY_LIFETIME_MS): void {
    const current = this.epochs.get(userId)
    this.epochs.set(userId, {
      epoch: Math.max(epoch, current?.epoch ?? -1),
      expiresAt: Math.max(expiresAt, current?.expiresAt ?? 0),
    })
  }

  add(row: RevocationRow): void {
    if (row.kind === 'session') this.revokeSession(row.session_id!, row.expires_at)
    else this.raiseEpoch(row.user_id, row.kind === 'deleted' ? Infinity : row.epoch!, row.expires_at)
  }

  /** Drops entries no JWT can need any more. */
  sweep(): void {
    const now = this.now()
    for (const [id, expiresAt] of this.sessions) if (expiresAt <= now) this.sessions.delete(id)
    for (const [id, entry] of this.epochs) if (entry.expiresAt <= now) this.epochs.delete(id)
  }
}

const SESSIONS = /^sessions ([0-9]{1,19}(?:,[0-9]{1,19})*)$/
const EPOCHS = /^epochs ([0-9]{1,19}:(?:[0-9]{1,10}|deleted)(?:,[0-9]{1,19}:(?:[0-9]{1,10}|deleted))*)$/

/**
 * Applies a revocation notification; false when `payload` is not one (then
 * it is for someone else, or it is `revocations`: too many to list, reload).
 */
export function applyRevocation(list: RevocationList, payload: string): boolean {
  let m = SESSIONS.exec(payload)
  if (m) {
    for (const id of m[1]!.split(',')) list.revokeSession(Number(id))
    return true
  }
  m = EPOCHS.exec(payload)
  if (m) {
    for (const pair of m[1]!.split(',')) {
      const [user, epoch] = pair.split(':') as [string, string]
      list.raiseEpoch(Number(user), epoch === 'deleted' ? Infinity : Number(epoch))
    }
    return true
  }
  return false
}
