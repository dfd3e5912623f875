import type { TransactionSql } from 'postgres'
import { normalizeEmail } from '../auth/login/login-throttle.js'
import type { StoredRow } from '../core/resources/store.js'

// What the purge of a user erases beside its row (docs/security.md,
// "Erasure"), in the purge's transaction, before the row goes: the row's
// removal takes its credentials, second factor, known addresses and one-time
// tokens through their foreign keys (sql/002, 011, 012, 016), and leaves its
// provider link without its address (sql/019). Here, what names the person
// elsewhere: the address its provider links kept while it was in the trash
// (sql/019); the data of the events about it (its changes, failed logins on
// its address, its sessions with their user agents and client addresses, its
// API keys with their names) keep only ids; its mail still queued or kept
// after failing goes; and what counts logins and reset requests by its
// address goes, unless another user (live or in the trash) has that address.

export async function eraseUsers(tx: TransactionSql, rows: readonly StoredRow[]): Promise<void> {
  const ids = rows.map((r) => r.id)
  const emails = [...new Set(rows.map((r) => normalizeEmail(String(r.email))))]
  // The outbox first: an event the publisher is moving meanwhile is waited for, and then found in the log by the
  // statements on events, which start after it committed (each statement sees what committed before it began).
  for (const table of ['event_outbox', 'events'] as const) {
    await tx`
      UPDATE ${tx(table)} SET data = json_build_object('id', subject_id)
      WHERE subject_type = 'user' AND subject_id = ANY(${ids}::bigint[])`
    await tx`
      UPDATE ${tx(table)} SET data = json_build_object('id', subject_id, 'user_id', (data->>'user_id')::bigint)
      WHERE subject_type = 'session' AND subject_id IN (SELECT id FROM sessions WHERE user_id = ANY(${ids}::bigint[]))`
    // Its API keys were deleted when it went to the trash (sql/019): their events are found by the owner they name.
    await tx`
      UPDATE ${tx(table)} SET data = json_build_object('id', subject_id, 'user_id', (data->>'user_id')::bigint)
      WHERE subject_type = 'api_key' AND (data->>'user_id')::bigint = ANY(${ids}::bigint[])`
  }
  await tx`DELETE FROM mail_outbox WHERE user_id = ANY(${ids}::bigint[])`
  // Stored answers (kept 24 hours for Idempotency-Key retries): its own, and any that show it (a POST /users, a batch).
  await tx`
    DELETE FROM idempotency_keys
    WHERE caller = ANY(${ids.map((id) => `user ${id}`)}::text[])
      OR EXISTS (SELECT 1 FROM unnest(${emails}::text[]) AS e WHERE position(e IN lower(body)) > 0)`
  // Its provider links keep the time of its deletion, which refuses the tokens issued before, not its address.
  await tx`
    UPDATE identities SET deleted_email = NULL, trashed_user_id = NULL WHERE trashed_user_id = ANY(${ids}::bigint[])`
  // The address may be another user's now (it was free once this one was deleted): that user's counts stay.
  const unclaimed = (
    await tx<Array<{ email: string }>>`
      SELECT e.email FROM unnest(${emails}::text[]) AS e(email)
      WHERE NOT EXISTS (
          SELECT 1 FROM users u WHERE lower(u.email) = e.email AND u.deleted_at IS NULL
            AND u.id <> ALL(${ids}::bigint[]))
        AND NOT EXISTS (
          SELECT 1 FROM users u WHERE lower(u.email) = e.email AND u.deleted_at IS NOT NULL
            AND u.id <> ALL(${ids}::bigint[]))`
  ).map((r) => r.email)
  if (unclaimed.length === 0) return
  await tx`DELETE FROM login_failures WHERE email = ANY(${unclaimed}::text[])`
  // The SHA-256 of the normalized address, as recovery.ts keys them (hashSecret).
  await tx`
    DELETE FROM password_reset_requests
    WHERE email_hash IN (SELECT sha256(convert_to(e, 'UTF8')) FROM unnest(${unclaimed}::text[]) AS e)`
}
