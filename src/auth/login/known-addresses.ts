import { createHmac } from 'node:crypto'
import type { Sql } from 'postgres'
import type { Config } from '../../config.js'

// Addresses that proved an account's password: the account-wide failure
// count that other addresses drive up does not lock them out
// (src/auth/login/login-throttle.ts). One row per (user, address bucket), so IPv6
// counts per /64 as the throttle does, holding across instances.
//
// The address is stored as a keyed hash (HMAC-SHA-256 under a key derived
// from JWT_SECRETS), never as itself: a copy of the database does not tell
// where each user logs in from, and the IPv4 space cannot be searched
// through the hash without the key. Every configured secret checks and the
// first writes, so a JWT_SECRETS rotation done as documented (new key first,
// old key dropped later) keeps the addresses that log in during the overlap;
// an address forgotten by a rotation is only an ordinary address again.
//
// A row counts while its user's credential_epoch is the one it was proved
// at, for KNOWN_DAYS: a password change, a role change or "log out
// everywhere" forgets every address, the way it ends every JWT.

export const KNOWN_DAYS = 30

/** One address as login throttling sees it: its bucket, and its tag under each configured key (the first writes). */
export interface LoginAddress {
  bucket: string
  tags: Buffer[]
}

/** The tag keys, derived so that a tag can never double as a token signature or a cursor MAC. */
export const knownAddressKeysFrom = (secrets: Config['jwtSecrets']): Buffer[] =>
  secrets.map((s) => createHmac('sha256', s.secret).update('login-known-address-v1').digest())

export const tagsOf = (keys: readonly Buffer[], bucket: string): Buffer[] =>
  keys.map((key) => createHmac('sha256', key).update(bucket).digest())

/**
 * The condition, on `k` (login_known_addresses) joined to its user `u`, that
 * `from` is known to that user: proved at the user's current credential
 * epoch, within KNOWN_DAYS.
 */
export const knownCondition = (sql: Sql, from: LoginAddress) => sql`
  k.address_tag IN ${sql(from.tags)} AND k.epoch = u.credential_epoch
    AND k.last_success_at > now() - ${KNOWN_DAYS}::int * interval '1 day'`

/** The statement that makes `from` known to a user from now on, at its current credential epoch. */
export const rememberAddress = (sql: Sql, userId: number, from: LoginAddress) => sql`
  INSERT INTO login_known_addresses AS k (user_id, address_tag, epoch, last_success_at)
  SELECT id, ${from.tags[0]!}, credential_epoch, now() FROM users WHERE id = ${userId}
  ON CONFLICT (user_id, address_tag) DO UPDATE SET epoch = excluded.epoch, last_success_at = excluded.last_success_at`

/** The rows older than KNOWN_DAYS (job `logins.purge-known-addresses`, src/service.ts). */
export const expiredKnownAddresses = (sql: Sql) => sql`last_success_at < now() - ${KNOWN_DAYS}::int * interval '1 day'`
