import { createHash, randomBytes } from 'node:crypto'
import type { Sql, TransactionSql } from 'postgres'
import { sealer, type SealingKeys } from '../../core/lib/sealed-text.js'
import { base32Encode, matchTotp, newTotpSecret } from './totp.js'

// A user's TOTP factor and recovery codes as stored (sql/016): the secret
// sealed under a purpose of its own (never opening as a webhook secret), the
// last step a code was accepted for, the recovery codes as SHA-256 hashes.

type Db = Sql | TransactionSql

const totpSecrets = sealer('users-products-api totp secret v1', 'the TOTP secret')

export const RECOVERY_CODE_COUNT = 10
/** What a recovery code looks like: two groups of five base32 letters or digits (50 random bits). */
export const RECOVERY_CODE = /^[a-zA-Z2-7]{5}-?[a-zA-Z2-7]{5}$/

const hashCode = (code: string) => createHash('sha256').update(code.toLowerCase().replace('-', '')).digest()

/** The user's factor: none, an enrolment waiting for its first code, or on. */
export async function factorState(db: Db, userId: number | string): Promise<'none' | 'pending' | 'on'> {
  const [row] = await db<Array<{ on: boolean }>>`
    SELECT confirmed_at IS NOT NULL AS on FROM totp_factors WHERE user_id = ${userId}`
  return row === undefined ? 'none' : row.on ? 'on' : 'pending'
}

/** Whether the user has a confirmed factor (a login then needs a code). */
export const hasFactor = async (db: Db, userId: number | string): Promise<boolean> =>
  (await factorState(db, userId)) === 'on'

/**
 * A new secret for the user, waiting for its first code; a previous
 * enrolment not yet confirmed is replaced. Undefined when the user already
 * has a confirmed factor (it must be removed first).
 */
export async function beginEnrolment(db: Db, keys: SealingKeys, userId: number | string): Promise<string | undefined> {
  const secret = newTotpSecret()
  const [row] = await db`
    INSERT INTO totp_factors (user_id, secret_sealed) VALUES (${userId}, ${totpSecrets.seal(secret, keys)})
    ON CONFLICT (user_id) DO UPDATE SET secret_sealed = excluded.secret_sealed, last_step = 0, created_at = now()
      WHERE totp_factors.confirmed_at IS NULL
    RETURNING user_id`
  return row ? secret : undefined
}

/**
 * Accepts `code` for the user's factor, confirmed or (`pending`) waiting for
 * its first code: true when it matches a step within one of now that was not
 * accepted before. The step is claimed with a compare-and-set, so of two
 * requests with one code, one wins.
 */
export async function acceptCode(
  db: Db,
  keys: SealingKeys,
  userId: number | string,
  code: string,
  nowMs: number,
  state: 'confirmed' | 'pending' = 'confirmed',
): Promise<boolean> {
  const [factor] = await db<Array<{ secret_sealed: string; last_step: string }>>`
    SELECT secret_sealed, last_step FROM totp_factors
    WHERE user_id = ${userId} AND (confirmed_at IS NOT NULL) = ${state === 'confirmed'}`
  if (!factor) return false
  const step = matchTotp(totpSecrets.open(factor.secret_sealed, keys), code, nowMs, Number(factor.last_step))
  if (step === undefined) return false
  const claimed = await db`
    UPDATE totp_factors SET last_step = ${step} WHERE user_id = ${userId} AND last_step < ${step}`
  return claimed.count === 1
}

/** Turns a pending factor on; false when there was none waiting. */
export async function confirmFactor(tx: TransactionSql, userId: number | string): Promise<boolean> {
  const confirmed = await tx`
    UPDATE totp_factors SET confirmed_at = now() WHERE user_id = ${userId} AND confirmed_at IS NULL`
  return confirmed.count === 1
}

/**
 * Removes the user's factor and its recovery codes (with `setUpSince`, only a factor enrolled at or after that
 * time); whether a confirmed one was removed.
 */
export async function removeFactor(tx: TransactionSql, userId: number | string, setUpSince?: Date): Promise<boolean> {
  const [removed] = await tx<Array<{ confirmed: boolean }>>`
    DELETE FROM totp_factors WHERE user_id = ${userId} ${setUpSince ? tx`AND created_at >= ${setUpSince}` : tx``}
    RETURNING confirmed_at IS NOT NULL AS confirmed`
  if (removed) await tx`DELETE FROM recovery_codes WHERE user_id = ${userId}`
  return removed?.confirmed ?? false
}

/** New recovery codes for a user whose factor is on (its row locked meanwhile); undefined without one. */
export async function replaceRecoveryCodes(tx: TransactionSql, userId: number | string): Promise<string[] | undefined> {
  const [factor] = await tx`
    SELECT 1 FROM totp_factors WHERE user_id = ${userId} AND confirmed_at IS NOT NULL FOR UPDATE`
  return factor ? newRecoveryCodes(tx, userId) : undefined
}

/** A new set of recovery codes, replacing the user's: shown once, stored as hashes. */
export async function newRecoveryCodes(tx: TransactionSql, userId: number | string): Promise<string[]> {
  const codes = Array.from({ length: RECOVERY_CODE_COUNT }, () => {
    const letters = base32Encode(randomBytes(7)).slice(0, 10).toLowerCase()
    return `${letters.slice(0, 5)}-${letters.slice(5)}`
  })
  await tx`DELETE FROM recovery_codes WHERE user_id = ${userId}`
  await tx`INSERT INTO recovery_codes ${tx(codes.map((code) => ({ user_id: userId, code_hash: hashCode(code) })))}`
  return codes
}

/** Spends one recovery code of the user: true once per code. */
export async function useRecoveryCode(db: Db, userId: number | string, code: string): Promise<boolean> {
  if (!RECOVERY_CODE.test(code)) return false
  const used = await db`
    UPDATE recovery_codes SET used_at = now()
    WHERE user_id = ${userId} AND code_hash = ${hashCode(code)} AND used_at IS NULL`
  return used.count === 1
}

/**
 * Re-seals, under the first kid, every TOTP secret sealed under another
 * configured kid, so that dropping an old JWT secret later loses no factor;
 * how many it rewrote. Compare-and-set per row: a concurrent enrolment wins.
 */
export async function resealTotpSecrets(sql: Sql, keys: SealingKeys): Promise<number> {
  const others = keys.slice(1).map((k) => k.kid)
  if (others.length === 0) return 0
  const rows = await sql<Array<{ user_id: string; secret_sealed: string }>>`
    SELECT user_id, secret_sealed FROM totp_factors
    WHERE split_part(secret_sealed, '.', 2) = ANY (${others}) LIMIT 1000`
  let resealed = 0
  for (const row of rows) {
    const next = totpSecrets.reseal(row.secret_sealed, keys)
    if (next === undefined || next === row.secret_sealed) continue
    const written = await sql`
      UPDATE totp_factors SET secret_sealed = ${next}
      WHERE user_id = ${row.user_id} AND secret_sealed = ${row.secret_sealed}`
    resealed += written.count
  }
  return resealed
}
