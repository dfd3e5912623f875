import Type from 'typebox'
import type { TransactionSql } from 'postgres'
import { checkIfMatch } from '../http/conditional.js'
import { notFound, validationFailed } from '../http/problem.js'

// What users and products share: the name rule, the read-only members a
// client may echo back, and the locked read-check-write of PUT, PATCH and DELETE.

export const NameSchema = Type.String({
  minLength: 1,
  maxLength: 200,
  // Not only white space; no control characters (it is a single line).
  // Fixed: the old form `^[^C]*[^\sC][^C]*$` backtracked quadratically when it
  // failed (TypeBox's Errors() runs it even on over-long strings: a 200 kB name
  // ending in "\n" blocked the event loop for ~16 s), and it let the C1
  // controls U+0080-U+009F through. A lookahead for one non-space character
  // plus a single class is linear and rejects every control (Unicode Cc).
  pattern: '^(?=[\\s\\S]*[^\\s])[^\\u0000-\\u001f\\u007f-\\u009f]*$',
  description: 'a name of 1 to 200 characters, not only white space, without control characters',
})

/** PUT and PATCH bodies may echo these back (a GET-modify-PUT round trip); they are ignored. */
export const readOnlyEcho = {
  id: Type.Optional(Type.Integer({ minimum: 1, description: 'read-only; must equal the id in the path' })),
  created_at: Type.Optional(Type.String({ maxLength: 64, description: 'read-only; ignored' })),
  updated_at: Type.Optional(Type.String({ maxLength: 64, description: 'read-only; ignored' })),
}

/** An echoed `id` must be the one in the path: otherwise the client is writing to the wrong resource. */
export function checkEchoedId(body: { id?: number }, pathId: string): void {
  if (body.id !== undefined && String(body.id) !== pathId) {
    throw validationFailed([{ path: '/id', message: 'must equal the id in the path' }])
  }
}

export interface Versioned {
  id: number
  version: number
}

/**
 * Reads the row for update, locking it until the transaction ends, then checks
 * If-Match against its version. Two writers with the same If-Match queue on
 * the lock, and the second sees the first's new version: one 200, one 412.
 */
export async function lockForWrite<Row extends Versioned>(tx: TransactionSql, table: 'users' | 'products', id: string, ifMatch: string | undefined): Promise<Row> {
  const [row] = await tx<Row[]>`SELECT * FROM ${tx(table)} WHERE id = ${id} FOR UPDATE`
  if (!row) throw notFound()
  checkIfMatch(ifMatch, row.version)
  return row
}

/**
 * The members a write would change, as the SET list of an UPDATE. PATCH with
 * `{}`, or a PUT of the same content, changes nothing: no new version, no new
 * updated_at, the same ETag.
 */
export function changedMembers<T extends object>(current: T, next: Partial<T>): Partial<T> {
  const changes: Partial<T> = {}
  for (const key of Object.keys(next) as Array<keyof T>) {
    if (next[key] !== undefined && next[key] !== current[key]) changes[key] = next[key]
  }
  return changes
}
