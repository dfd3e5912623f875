import type { TransactionSql } from 'postgres'
import { checkIfMatch } from '../http/conditional.js'
import { HttpError, notFound } from '../http/problem.js'
import { quoteIdentifier as quote } from '../db/identifier.js'
import type { Db } from '../db/transaction.js'
import { originValues, representationSql, type ChangeOrigin, type EventRecord } from './change-events.js'
import type { Resource } from './resource.js'

// The SQL of single-row reads and writes, for any declared resource. Every
// write records its event in the same statement (a data-modifying WITH), so
// a change and its event commit together or not at all, with no extra round
// trip (sql/007 explains how events get their commit-ordered ids).
//
// Texts are made once per resource and set of columns (names from declarations,
// checked to be plain identifiers and quoted; never from a request) and run
// as prepared statements: every value is a parameter (behind a transaction
// pooler, unnamed ones: the pool's `prepare: false` overrides a statement's
// `prepare: true`, src/core/db/connect.ts), because building them from
// fragments per request would be a large part of a read by id
// (bench/README.md). Functions take the
// database handle first, so the same function runs on the pool or inside a
// caller's transaction.

export type StoredRow = Record<string, unknown> & { id: number; version: number }

/** Equality conditions a caller cannot lift (a user's own API keys), ANDed to the id. */
export type Scope = Record<string, string>

function statement(resource: Resource, key: string, build: () => string): string {
  let text = resource.statementTexts.get(key)
  if (text === undefined) resource.statementTexts.set(key, (text = build()))
  return text
}

const run = (db: Db, text: string, values: unknown[]) =>
  db.unsafe<StoredRow[]>(text, values as never[], { prepare: true })

/**
 * `WITH row AS (<change> RETURNING *)`, its event from parameters $first…$first+2, and the row. The event's data is
 * the representation, or `data` (SQL over `row`).
 */
function withEvent(
  resource: Resource,
  change: string,
  type: string,
  first: number,
  select = '*',
  data = representationSql(resource),
): string {
  if (!/^[a-z_]+\.[a-z_]+$/.test(type)) throw new Error(`${resource.name}: "${type}" is not an event type`)
  return (
    `WITH row AS (${change} RETURNING *), event AS (
    INSERT INTO event_outbox (type, subject_type, subject_id, actor_id, actor_credential, request_id, data)
    SELECT '${type}', '${resource.events.subject}', row.id, ` +
    `$${first}::bigint, $${first + 1}::text, $${first + 2}::text, ${data} FROM row)
  SELECT ${select} FROM row`
  )
}

/** The condition that keeps a resource with a trash to its live rows (nothing for one without). */
const live = (resource: Resource) => (resource.trash ? ' AND deleted_at IS NULL' : '')

const scopeConditions = (columns: readonly string[], first: number) =>
  columns.map((c, i) => ` AND ${quote(c)} = $${first + i}`).join('')

export async function findRow(db: Db, resource: Resource, id: string, scope?: Scope): Promise<StoredRow | undefined> {
  const columns = scope ? Object.keys(scope) : []
  const text = statement(
    resource,
    `select ${columns.join(' ')}`,
    () => `SELECT * FROM ${quote(resource.table)} WHERE id = $1${live(resource)}${scopeConditions(columns, 2)}`,
  )
  const [row] = await run(db, text, [id, ...columns.map((c) => scope![c])])
  return row
}

export async function insertRow(
  db: Db,
  resource: Resource,
  values: Record<string, unknown>,
  origin: ChangeOrigin,
): Promise<StoredRow> {
  const columns = Object.keys(values)
  const text = statement(resource, `insert ${columns.join(' ')}`, () =>
    withEvent(
      resource,
      `INSERT INTO ${quote(resource.table)} ` +
        `(${columns.map(quote).join(', ')}) VALUES (${columns.map((_, i) => `$${i + 1}`).join(', ')})`,
      resource.events.created,
      columns.length + 1,
    ),
  )
  const [row] = await run(db, text, [...columns.map((c) => values[c]), ...originValues(origin)])
  return row!
}

/**
 * Reads the row for update, locking it until the transaction ends, then checks
 * If-Match against its version. Two writers with the same If-Match queue on
 * the lock, and the second sees the first's new version: one 200, one 412.
 * The lock is the one an UPDATE of the row takes (FOR NO KEY UPDATE), not FOR
 * UPDATE: inserting a row that refers to this one (a login's known address)
 * still proceeds, which a batch needs, whose operations count password guesses
 * on the pool while its own transaction holds the row. A live row only, unless
 * `trashed` (a purge, which takes a trashed one too).
 */
export async function lockRow(
  tx: TransactionSql,
  resource: Resource,
  id: string,
  ifMatch: string | undefined,
  { trashed = false } = {},
): Promise<StoredRow> {
  const text = statement(
    resource,
    trashed ? 'lock any' : 'lock',
    () => `SELECT * FROM ${quote(resource.table)} WHERE id = $1${trashed ? '' : live(resource)} FOR NO KEY UPDATE`,
  )
  const [row] = await run(tx, text, [id])
  if (!row) throw notFound()
  if (resource.versioned) checkIfMatch(ifMatch, row.version)
  return row
}

/** The SET list of an update of `columns` ($1…$n): the version moves on, and updated_at with it. */
function setList(resource: Resource, columns: readonly string[]): string {
  const set = columns.map((c, i) => `${quote(c)} = $${i + 1}`)
  if (resource.versioned) set.push('version = version + 1')
  // now() is the start of the transaction, which may predate the previous write if we waited on its lock.
  if ('updated_at' in resource.members)
    set.push(`updated_at = greatest(clock_timestamp(), updated_at + interval '1 millisecond')`)
  return set.join(', ')
}

export async function updateRow(
  tx: TransactionSql,
  resource: Resource,
  id: number,
  changes: Record<string, unknown>,
  origin: ChangeOrigin,
): Promise<StoredRow> {
  const columns = Object.keys(changes)
  const text = statement(resource, `update ${columns.join(' ')}`, () => {
    const idAt = columns.length + 1
    return withEvent(
      resource,
      `UPDATE ${quote(resource.table)} SET ${setList(resource, columns)} WHERE id = $${idAt}`,
      resource.events.updated,
      idAt + 1,
    )
  })
  const [row] = await run(tx, text, [...columns.map((c) => changes[c]), id, ...originValues(origin)])
  return row!
}

/**
 * A merge-patch in one statement, for a resource that needs nothing else in
 * the write's transaction: the row is updated, and its event recorded, only
 * if its version is one of `versions` (from If-Match; undefined: any) and a
 * member changes. PostgreSQL checks both against the newest version of the
 * row once it holds the row's lock, so concurrent writers serialize as they
 * do under lockRow's lock. Undefined when nothing was written: the
 * caller then takes the locked path, which tells a missing row, a failed
 * If-Match and a patch that changes nothing apart.
 */
export async function updateIfChanged(
  db: Db,
  resource: Resource,
  id: string,
  changes: Record<string, unknown>,
  versions: number[] | undefined,
  origin: ChangeOrigin,
): Promise<StoredRow | undefined> {
  const columns = Object.keys(changes)
  const text = statement(resource, `update if changed ${versions ? 'if-match ' : ''}${columns.join(' ')}`, () => {
    const idAt = columns.length + 1
    const versionAt = versions ? idAt + 1 : idAt
    const changed = columns.map((c, i) => `${quote(c)} IS DISTINCT FROM $${i + 1}`).join(' OR ')
    const version = versions ? ` AND version = ANY($${versionAt})` : ''
    const where = `id = $${idAt}${live(resource)}${version} AND (${changed})`
    return withEvent(
      resource,
      `UPDATE ${quote(resource.table)} SET ${setList(resource, columns)} WHERE ${where}`,
      resource.events.updated,
      versionAt + 1,
    )
  })
  const [row] = await run(db, text, [
    ...columns.map((c) => changes[c]),
    id,
    ...(versions ? [versions] : []),
    ...originValues(origin),
  ])
  return row
}

/**
 * The change a DELETE makes: for a resource with a trash, the live row moves there (a new version, so that an ETag
 * held before names no state it comes back in), else it is removed.
 */
function deletion(resource: Resource, where: string): string {
  const table = quote(resource.table)
  return resource.trash
    ? `UPDATE ${table} SET deleted_at = now()${resource.versioned ? ', version = version + 1' : ''} ` +
        `WHERE ${where} AND deleted_at IS NULL`
    : `DELETE FROM ${table} WHERE ${where}`
}

/** Deletes the row (within the scope), to the trash for a resource with one; whether there was one. */
export async function deleteRow(
  db: Db,
  resource: Resource,
  id: number | string,
  origin: ChangeOrigin,
  scope?: Scope,
): Promise<boolean> {
  const columns = scope ? Object.keys(scope) : []
  const text = statement(resource, `delete ${columns.join(' ')}`, () =>
    withEvent(
      resource,
      deletion(resource, `id = $1${scopeConditions(columns, 2)}`),
      resource.events.deleted,
      columns.length + 2,
      'row.id',
    ),
  )
  const rows = await run(db, text, [id, ...columns.map((c) => scope![c]), ...originValues(origin)])
  return rows.length > 0
}

/** Deletes every row within the scope (all API keys of a user), each with its event (to the trash, as deleteRow). */
export async function deleteRowsWhere(db: Db, resource: Resource, scope: Scope, origin: ChangeOrigin): Promise<number> {
  const columns = Object.keys(scope)
  if (columns.length === 0) throw new Error(`${resource.name}: deleteRowsWhere needs a scope`)
  const text = statement(resource, `delete where ${columns.join(' ')}`, () =>
    withEvent(
      resource,
      deletion(resource, columns.map((c, i) => `${quote(c)} = $${i + 1}`).join(' AND ')),
      resource.events.deleted,
      columns.length + 1,
      'row.id',
    ),
  )
  const rows = await run(db, text, [...columns.map((c) => scope[c]), ...originValues(origin)])
  return rows.length
}

/** Brings a trashed row back (its `restored` event), or undefined when there is no such row in the trash. */
export async function restoreRow(
  db: Db,
  resource: Resource,
  id: string,
  origin: ChangeOrigin,
): Promise<StoredRow | undefined> {
  const text = statement(resource, 'restore', () =>
    withEvent(
      resource,
      `UPDATE ${quote(resource.table)} SET deleted_at = NULL${resource.versioned ? ', version = version + 1' : ''} ` +
        'WHERE id = $1 AND deleted_at IS NOT NULL',
      resource.events.restored,
      2,
    ),
  )
  const [row] = await run(db, text, [id, ...originValues(origin)])
  return row
}

/**
 * Locks, until the transaction ends, up to `limit` rows moved to the trash before `before`, the oldest first; rows
 * another purge holds are skipped, so that two instances' purges take different rows.
 */
export async function lockDueForPurge(
  tx: TransactionSql,
  resource: Resource,
  before: string,
  limit: number,
): Promise<StoredRow[]> {
  const text = statement(
    resource,
    'due for purge',
    () =>
      `SELECT * FROM ${quote(resource.table)} WHERE deleted_at < $1::timestamptz ` +
      'ORDER BY deleted_at, id LIMIT $2 FOR UPDATE SKIP LOCKED',
  )
  return run(tx, text, [before, limit])
}

/**
 * Removes rows for good, live or trashed, each with its `purged` event, whose data is the id alone: what the row
 * held is gone, personal data included (its last state is in its earlier events, which a purge hook may erase). The
 * ids of the rows there were.
 */
export async function purgeRows(
  db: Db,
  resource: Resource,
  ids: readonly number[],
  origin: ChangeOrigin,
): Promise<number[]> {
  const text = statement(resource, 'purge', () =>
    withEvent(
      resource,
      `DELETE FROM ${quote(resource.table)} WHERE id = ANY($1::bigint[])`,
      resource.events.purged,
      2,
      'row.id',
      "json_build_object('id', row.id)",
    ),
  )
  const rows = await run(db, text, [ids, ...originValues(origin)])
  return rows.map((r) => Number(r.id))
}

/**
 * The event of a write a hook makes itself (an API key's insert),
 * for recordEvents (change-events.ts) in the write's transaction.
 */
export const eventOf = (resource: Resource, type: string, row: StoredRow): EventRecord => ({
  type,
  subject: { type: resource.events.subject, id: row.id },
  data: resource.present(row),
})

/** A duplicate of a unique member is the client's conflict (409 with the member's code); anything else is rethrown. */
export function conflictOf(resource: Resource, err: unknown): unknown {
  const { code, constraint_name: constraint } = err as { code?: string; constraint_name?: string }
  const problem = code === '23505' && constraint ? resource.uniqueCodes.get(constraint) : undefined
  return problem ? new HttpError(problem.code, `A ${resource.label} with this ${problem.member} already exists.`) : err
}
