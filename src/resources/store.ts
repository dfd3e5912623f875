import type { Sql, TransactionSql } from 'postgres'
import { checkIfMatch } from '../http/conditional.js'
import { HttpError, notFound } from '../http/problem.js'
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

const scoped = (db: Db, scope: Scope | undefined) =>
  Object.entries(scope ?? {}).reduce((conditions, [column, value]) => db`${conditions} AND ${db(column)} = ${value}`, db``)

export async function findRow(db: Db, resource: Resource, id: string, scope?: Scope): Promise<StoredRow | undefined> {
  const [row] = await db<StoredRow[]>`SELECT * FROM ${db(resource.table)} WHERE id = ${id} ${scoped(db, scope)}`
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
  const rows = await db`DELETE FROM ${db(resource.table)} WHERE id = ${id} ${scoped(db, scope)} RETURNING id`
  return rows.length > 0
}

/** A duplicate of a unique member is the client's conflict (409 with the member's code); anything else is rethrown. */
export function conflictOf(resource: Resource, err: unknown): unknown {
  const { code, constraint_name: constraint } = err as { code?: string; constraint_name?: string }
  const problem = code === '23505' && constraint ? resource.uniqueCodes.get(constraint) : undefined
  return problem ? new HttpError(problem.code, `A ${resource.label} with this ${problem.member} already exists.`) : err
}
