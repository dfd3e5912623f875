import type { Sql, TransactionSql } from 'postgres'
import { checkIfMatch } from '../http/conditional.js'
import { HttpError, notFound } from '../http/problem.js'
import { quoteIdentifier } from '../db/identifier.js'
import type { Resource } from './resource.js'

// The SQL of single-row reads and writes, for any declared resource. Table
// and column names come from the declaration (checked to be plain
// identifiers) and go through postgres.js identifier escaping; every value is
// a parameter. Functions take the database handle first, so the same
// function runs on the pool or inside a caller's transaction.

type Db = Sql | TransactionSql
export type StoredRow = Record<string, unknown> & { id: number; version: number }

/** Equality conditions a caller cannot lift (a user's own API keys), ANDed to the id. */
export type Scope = Record<string, string>

// Reads and deletes by id (the commonest statements) have their text made
// once per table and set of scope columns (names from declarations, never
// from a request) and run as prepared statements. Built from fragments and
// an identifier per request, they cost a fifth of a GET by id.
const byIdTexts = new Map<string, string>()
/** Each statement's text before and after its conditions (`id = $1`, then the scope's). */
const byIdStatements = {
  select: { head: (table: string) => `SELECT * FROM ${quoteIdentifier(table)}`, tail: '' },
  delete: { head: (table: string) => `DELETE FROM ${quoteIdentifier(table)}`, tail: ' RETURNING id' },
}

function byId(db: Db, kind: keyof typeof byIdStatements, table: string, id: number | string, scope: Scope | undefined) {
  const columns = scope ? Object.keys(scope) : []
  const key = [kind, table, ...columns].join(' ')
  let text = byIdTexts.get(key)
  if (text === undefined) {
    const { head, tail } = byIdStatements[kind]
    text = `${head(table)} WHERE id = $1${columns.map((c, i) => ` AND ${quoteIdentifier(c)} = $${i + 2}`).join('')}${tail}`
    byIdTexts.set(key, text)
  }
  return db.unsafe<StoredRow[]>(text, [id, ...columns.map((c) => scope![c]!)], { prepare: true })
}

export async function findRow(db: Db, resource: Resource, id: string, scope?: Scope): Promise<StoredRow | undefined> {
  const [row] = await byId(db, 'select', resource.table, id, scope)
  return row
}

export async function insertRow(db: Db, resource: Resource, values: Record<string, unknown>): Promise<StoredRow> {
  const [row] = await db<StoredRow[]>`INSERT INTO ${db(resource.table)} ${db(values)} RETURNING *`
  return row!
}

/**
 * Reads the row for update, locking it until the transaction ends, then checks
 * If-Match against its version. Two writers with the same If-Match queue on
 * the lock, and the second sees the first's new version: one 200, one 412.
 */
export async function lockRow(tx: TransactionSql, resource: Resource, id: string, ifMatch: string | undefined): Promise<StoredRow> {
  const [row] = await tx<StoredRow[]>`SELECT * FROM ${tx(resource.table)} WHERE id = ${id} FOR UPDATE`
  if (!row) throw notFound()
  if (resource.versioned) checkIfMatch(ifMatch, row.version)
  return row
}

export async function updateRow(tx: TransactionSql, resource: Resource, id: number, changes: Record<string, unknown>): Promise<StoredRow> {
  const stamp = 'updated_at' in resource.members
    // now() is the start of the transaction, which may predate the previous write if we waited on its lock.
    ? tx`, updated_at = greatest(clock_timestamp(), updated_at + interval '1 millisecond')`
    : tx``
  const version = resource.versioned ? tx`, version = version + 1` : tx``
  const [row] = await tx<StoredRow[]>`
    UPDATE ${tx(resource.table)} SET ${tx(changes as Record<string, string>, Object.keys(changes))} ${version} ${stamp} WHERE id = ${id} RETURNING *`
  return row!
}

/** Deletes the row; whether there was one. */
export async function deleteRow(db: Db, resource: Resource, id: number | string, scope?: Scope): Promise<boolean> {
  const rows = await byId(db, 'delete', resource.table, id, scope)
  return rows.length > 0
}

/** A duplicate of a unique member is the client's conflict (409 with the member's code); anything else is rethrown. */
export function conflictOf(resource: Resource, err: unknown): unknown {
  const { code, constraint_name: constraint } = err as { code?: string; constraint_name?: string }
  const problem = code === '23505' && constraint ? resource.uniqueCodes.get(constraint) : undefined
  return problem ? new HttpError(problem.code, `A ${resource.label} with this ${problem.member} already exists.`) : err
}
