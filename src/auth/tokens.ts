import { createHash, randomBytes } from 'node:crypto'
import type { Sql } from 'postgres'

// Opaque secrets: 256 random bits behind a prefix that names their kind, so a
// leaked one is recognizable (secret scanners, logs) and its kind is known
// without a database read. Only the SHA-256 of a secret is stored; a fast hash
// is right here because the secret itself has full entropy (unlike a password).

export const tokenKinds = {
  access: 'upa_at_',
  refresh: 'upa_rt_',
  apiKey: 'upa_ak_',
  /** The second step of a login (src/auth/mfa/challenges.ts). */
  mfa: 'upa_mt_',
} as const

export type TokenKind = keyof typeof tokenKinds

export function newSecret(kind: TokenKind): string {
  return tokenKinds[kind] + randomBytes(32).toString('base64url')
}

export const hashSecret = (secret: string): Buffer => createHash('sha256').update(secret).digest()

/**
 * Hashes as one bytea[] parameter (`= ANY(…)`). Its type is named (1001 is
 * bytea[]): postgres.js would type an array of Buffers as one bytea.
 */
export const hashList = (sql: Sql, hashes: readonly Buffer[]) => sql.array(hashes as Buffer[], 1001)

/** The kind named by the prefix, if the rest has the shape we issue (43 base64url characters). */
export function kindOf(secret: string): TokenKind | undefined {
  for (const [kind, prefix] of Object.entries(tokenKinds) as Array<[TokenKind, string]>) {
    if (secret.startsWith(prefix) && /^[A-Za-z0-9_-]{43}$/.test(secret.slice(prefix.length))) return kind
  }
  return undefined
}

/** What may be shown of a key after creation: enough to tell keys apart. */
export const displayPrefix = (secret: string) => secret.slice(0, tokenKinds.apiKey.length + 6)
