import type { TransactionSql } from 'postgres'
import { recordEvents } from '../../core/resources/change-events.js'
import { revokeApiKeysOf } from '../api-keys/declaration.js'
import type { EventOrigin } from '../origin.js'
import { revokeSessionsOf } from '../sessions/sessions.js'
import { removeFactor } from './factors.js'

// Turning a user's second factor off, by the user itself or by an admin, and
// the events a factor's life records.

export const mfaEvent = (type: 'user.mfa_enabled' | 'user.mfa_disabled', userId: number) => ({
  type,
  subject: { type: 'user', id: userId },
  data: { id: userId },
})

/** Removes a user's factor; when there was one, its event, and (`endCredentials`) every session and key of the user. */
export async function withdrawFactor(
  tx: TransactionSql,
  userId: number,
  origin: EventOrigin,
  endCredentials: boolean,
): Promise<boolean> {
  if (!(await removeFactor(tx, userId))) return false
  await recordEvents(tx, [mfaEvent('user.mfa_disabled', userId)], origin)
  if (endCredentials) {
    await revokeSessionsOf(tx, userId, origin)
    await revokeApiKeysOf(tx, userId, origin)
  }
  return true
}
