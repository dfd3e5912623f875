import type { Sql } from 'postgres'
import type { Config } from '../config.js'
import { resealSecret } from './secret.js'

// Signing secrets are sealed under the first of JWT_SECRETS (secret.ts), and
// opened under whichever configured kid sealed them. So that the documented
// rotation (docs/auth.md: the new key first, the old one dropped later) never
// leaves a secret sealed under a key that is gone, every instance re-seals,
// under the first kid, each secret sealed under another kid still configured:
// when its worker starts and then every `resealIntervalMs`, in batches.
//
// Each row is written with a compare-and-set on the sealed texts, so several
// instances at once, or a rotation of the secret meanwhile, lose nothing:
// whoever writes first wins and the other changes nothing. The representation
// does not change (the sealed text is never shown), so neither do the version
// and the ETag, and no event is written. With a single key configured there
// is nothing to do and no statement is run.

type Keys = Config['jwtSecrets']

const BATCH = 100

interface Sealed {
  id: number
  secret_sealed: string
  previous_secret_sealed: string | null
}

/**
 * Re-seals, under the first kid, every secret (and previous secret still signing) sealed under another configured kid;
 * how many rows it rewrote.
 */
export async function resealSecrets(sql: Sql, keys: Keys, signal?: AbortSignal): Promise<number> {
  const others = keys.slice(1).map((k) => k.kid)
  if (others.length === 0) return 0
  let resealed = 0
  for (let after = 0; ;) {
    const rows = await sql<Sealed[]>`
      SELECT id, secret_sealed, CASE WHEN previous_secret_expires_at > now() THEN previous_secret_sealed END AS
      previous_secret_sealed
      FROM webhooks
      WHERE id > ${after} AND (split_part(secret_sealed, '.', 2) = ANY (${others})
        OR (previous_secret_expires_at > now() AND split_part(previous_secret_sealed, '.', 2) = ANY (${others})))
      ORDER BY id LIMIT ${BATCH}`
    for (const row of rows) {
      const next = {
        secret: resealSecret(row.secret_sealed, keys),
        previous: row.previous_secret_sealed && resealSecret(row.previous_secret_sealed, keys),
      }
      // A text that does not open (tampered) stays as it is: the worker reports it at each delivery.
      if (next.secret === undefined || next.previous === undefined) continue
      const written = await sql`
        UPDATE webhooks SET secret_sealed
        = ${next.secret}, previous_secret_sealed = coalesce(${next.previous}, previous_secret_sealed)
        WHERE id = ${row.id} AND secret_sealed = ${row.secret_sealed}
          AND (${row.previous_secret_sealed}::text IS NULL OR previous_secret_sealed = ${row.previous_secret_sealed})`
      resealed += written.count
    }
    // Stopped: what is left, the next start takes.
    if (rows.length < BATCH || signal?.aborted) return resealed
    after = rows.at(-1)!.id
  }
}
