import { createHmac } from 'node:crypto'
import type { Sql } from 'postgres'
import { HttpError } from './problem.js'
import { jsonBody } from './reply.js'
import type { AnyRoute, HandlerContext, Reply } from './route.js'
import type { CoreServices } from './services.js'

// Idempotency-Key on creating POSTs. The key is scoped to the caller (the
// user, or the client address when anonymous) and bound to a fingerprint of
// method, path and body. The first request inserts a "running" record; the
// primary key makes that atomic across instances, so of many concurrent
// requests with one key exactly one runs the handler. Its answer is stored
// and replayed for 24 hours with `Idempotent-Replayed: true`; the same key
// with another body is 422; while the first still runs, 409. A failed first
// request (any error) removes its record, so that a retry runs again.

const KEY = /^[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?$/
const RETENTION = '24 hours'
// A record still "running" after this long belongs to a request that died with its process.
const ABANDONED = '1 minute'
// Headers of the first answer worth replaying; the request id and rate figures are the retry's own.
const REPLAYED_HEADERS = ['location', 'etag']

/** The records past retention, which a purge on the scheduler deletes (job `idempotency.purge`, src/service.ts). */
export const expiredIdempotencyRecords = (sql: Sql) => sql`created_at < now() - ${RETENTION}::interval`

declare module './services.js' {
  interface CoreServices {
    /** The secrets fingerprints are keyed under: the first makes new ones, every one matches. */
    idempotencySecrets: readonly Buffer[]
  }
}

interface StoredAnswer {
  fingerprint: string
  status: number | null
  headers: Record<string, string> | null
  body: string | null
  stale: boolean
}

const fingerprintKey = (secret: Buffer) => createHmac('sha256', secret).update('idempotency-fingerprint-v1').digest()

/**
 * `caller`: whom the key belongs to, as the application's stages name the
 * authenticated caller (`user 42`), or `address <client address>` for an
 * anonymous one.
 */
export async function handleIdempotently(
  route: AnyRoute,
  ctx: HandlerContext<unknown, unknown>,
  path: string,
  caller: string,
  services: CoreServices,
): Promise<Reply> {
  const header = ctx.headers['idempotency-key']
  if (header === undefined) return route.handle(ctx)
  if (typeof header !== 'string' || !KEY.test(header)) {
    throw new HttpError('invalid_request', 'Idempotency-Key must be 1 to 255 printable ASCII characters.')
  }
  const { sql, idempotencySecrets } = services
  // Keyed, not a plain SHA-256: the body may hold a password (POST /users), and
  // an unkeyed hash of it in the table would let whoever reads the table test
  // guesses at SHA-256 speed instead of scrypt's. The signing secret is the one
  // secret every instance shares; a record made under another configured key
  // (before a rotation of JWT_SECRETS) is matched under that key.
  const request = JSON.stringify([route.method, path, ctx.body])
  const fingerprintUnder = (secret: Buffer) =>
    createHmac('sha256', fingerprintKey(secret)).update(request).digest('base64url')
  const fingerprint = fingerprintUnder(idempotencySecrets[0]!)
  const sameRequest = (stored: string) =>
    stored === fingerprint || idempotencySecrets.slice(1).some((secret) => fingerprintUnder(secret) === stored)

  // Our own record is the one with our created_at: after a takeover (below) the
  // key may hold another request's record, which we must not finish or remove.
  let mine: string
  for (;;) {
    const [inserted] = await sql<Array<{ created_at: string }>>`
      INSERT INTO idempotency_keys (caller, key, fingerprint) VALUES (${caller}, ${header}, ${fingerprint})
      ON CONFLICT (caller, key) DO NOTHING RETURNING created_at`
    if (inserted) {
      mine = inserted.created_at
      break
    }
    const [stored] = await sql<StoredAnswer[]>`
      SELECT fingerprint, status, headers, body,
             created_at < now() - ${RETENTION}::interval OR (status IS NULL
               AND created_at < now() - ${ABANDONED}::interval) AS stale
      FROM idempotency_keys WHERE caller = ${caller} AND key = ${header}`
    if (!stored) continue // removed between our two statements: try to insert again
    if (stored.stale) {
      // Deleted only if still stale when deleted: of concurrent requests that all
      // saw the stale record, one may already have replaced it with its own
      // running record, and deleting that (same fingerprint) would let a
      // second request run the handler too.
      await sql`
        DELETE FROM idempotency_keys WHERE caller = ${caller} AND key = ${header}
          AND (created_at < now() - ${RETENTION}::interval OR (status IS NULL
            AND created_at < now() - ${ABANDONED}::interval))`
      continue
    }
    if (!sameRequest(stored.fingerprint)) {
      throw new HttpError('idempotency_key_reused', 'This Idempotency-Key was used with a different request.')
    }
    if (stored.status === null) {
      throw new HttpError(
        'idempotency_key_in_use',
        'A request with this Idempotency-Key is still being processed; retry shortly.',
        { headers: { 'retry-after': '1' } },
      )
    }
    const body: unknown = stored.body === null ? undefined : JSON.parse(stored.body)
    route.beforeReplay?.(ctx, body)
    return { status: stored.status, headers: { ...stored.headers, 'idempotent-replayed': 'true' }, body }
  }

  let reply: Reply
  try {
    reply = await route.handle(ctx)
  } catch (err) {
    await sql`DELETE FROM idempotency_keys WHERE caller = ${caller} AND key = ${header} AND created_at = ${mine}`.catch(
      () => {},
    )
    throw err
  }
  const headers = Object.fromEntries(
    REPLAYED_HEADERS.filter((h) => reply.headers?.[h] !== undefined).map((h) => [h, reply.headers![h]!]),
  )
  await sql`
    UPDATE idempotency_keys SET status
    = ${reply.status}, headers = ${sql.json(headers)}, body = ${jsonBody(reply) ?? null}
    WHERE caller = ${caller} AND key = ${header} AND created_at = ${mine}`
  return reply
}
