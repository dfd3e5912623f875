import { BoundedMap } from '../lib/bounded-map.js'
import { quoteIdentifier as quote } from '../db/identifier.js'
import { DELETED_AT, type Collection, type FilterOperator, type MemberType } from './declaration.js'

// The SQL of a list request. Its text depends only on the request's shape
// (which filters and operators, whether there is a search, the sort keys and
// directions, whether there is a cursor or an offset) and every value is a $n
// parameter, so the text is compiled once per shape and kept, and postgres.js
// prepares it once per connection (building it from postgres.js fragments on
// every request costs more than the rest of a list request; bench/README.md).
// Behind a transaction pooler nothing is prepared (ListShapes' `prepare`).
//
// The text is made only of fixed keywords and the declaration's names, which
// defineCollection has checked to be plain identifiers; nothing a client sent
// is ever part of it. That is what makes it fit for sql.unsafe.

export type Value = string | number | Date
export interface Filter {
  member: string
  op: FilterOperator
  values: Value[]
}
export interface SortKey {
  member: string
  descending: boolean
}

/** A list request, parsed and typed. */
export interface ListRequest {
  /**
   * In a fixed order for a given set of parameters (see FilterParameter.rank), else each order is a shape of its own.
   */
  filters: readonly Filter[]
  /** The search text, as sent. */
  q?: string | undefined
  sort: readonly SortKey[]
  /** The sort-key values of the row the page starts after (from a cursor). */
  after?: readonly Value[] | undefined
  /** Rows per page; the query asks for one more, to know whether a next page exists. */
  limit: number
  offset?: number | undefined
  /** A collection with a trash: its live rows, or the trash (with `deleted_at`); undefined for one without. */
  trash?: 'live' | 'trashed' | undefined
}

/** Text and values for postgres.js's `sql.unsafe(text, values, { prepare })`. */
export interface Statement {
  text: string
  values: Array<string | number | Date | Array<string | number>>
}

export interface ListStatements {
  page: Statement
  /** `SELECT count(*)` of the same selection: what `count=true` answers. */
  count: Statement
  /** Whether to run them as named prepared statements (see `compiledFor`). */
  prepare: boolean
}

/**
 * Parameters are numbered in one order, the same for the text and the values:
 * one per filter (an IN list is one array), the search pattern, the cursor's
 * values, the limit, the offset. The count statement uses the first part only.
 */
export function listStatements(collection: Collection, request: ListRequest, shapes: ListShapes): ListStatements {
  const { page, count, prepare } = shapes.compiledFor(collection, request)
  const values: Statement['values'] = []
  for (const f of request.filters) values.push(filterValue(collection, f))
  if (request.q !== undefined) values.push(searchPattern(request.q))
  const countValues = values.slice()
  if (request.after) values.push(...request.after)
  values.push(request.limit + 1)
  if (request.offset) values.push(request.offset)
  return { page: { text: page, values }, count: { text: count, values: countValues }, prepare }
}

// ------------------------------------------------------------ compiled texts

interface Compiled {
  page: string
  count: string
  uses: number
  prepare: boolean
}

/**
 * Compiled texts per collection, by shape. The declaration allows far more
 * shapes than are ever used (every subset of its 40-odd filter parameters
 * times every sort), and a client chooses them, so the cache is bounded: the
 * least recently used shape goes first. An IN list is one array parameter,
 * so its length is not part of the shape.
 *
 * A prepared statement lives on every database connection that ran it until
 * the connection closes, and this cache forgetting a shape does not remove
 * it there. So only a shape used PREPARE_AFTER_USES times is prepared, and
 * at most MAX_PREPARED_SHAPES shapes per collection ever are, for the life
 * of the instance: the server memory they hold is bounded whatever shapes
 * clients send. Other shapes run unprepared (parsed and planned each time).
 */
export const MAX_SHAPES_PER_COLLECTION = 500
export const PREPARE_AFTER_USES = 3
export const MAX_PREPARED_SHAPES = 200

/** The compiled shapes of one service instance, per collection (CoreServices.listShapes). */
export class ListShapes {
  private readonly byTable = new Map<string, { shapes: BoundedMap<string, Compiled>; prepared: Set<string> }>()
  /** False behind a transaction pooler, where no statement is prepared (src/core/db/connect.ts, `pooled`). */
  private readonly prepare: boolean

  constructor({ prepare = true }: { prepare?: boolean } = {}) {
    this.prepare = prepare
  }

  compiledFor(collection: Collection, request: ListRequest): Compiled {
    const { shapes, prepared } = this.entry(collection)
    const key = shapeKey(request)
    let compiled = shapes.get(key)
    if (compiled) {
      shapes.refresh(key)
    } else {
      compiled = { ...compile(collection, request), uses: 0, prepare: prepared.has(key) }
    }
    if (
      ++compiled.uses >= PREPARE_AFTER_USES &&
      this.prepare &&
      !compiled.prepare &&
      prepared.size < MAX_PREPARED_SHAPES
    ) {
      prepared.add(key)
      compiled.prepare = true
    }
    shapes.set(key, compiled)
    return compiled
  }

  /** How many shapes of the collection are run as prepared statements. */
  preparedCount(collection: Collection): number {
    return this.byTable.get(collection.table)?.prepared.size ?? 0
  }

  /** The shapes of the collection that are compiled, least recently used first. */
  compiledShapes(collection: Collection): string[] {
    return [...(this.byTable.get(collection.table)?.shapes.keys() ?? [])]
  }

  private entry(collection: Collection) {
    let entry = this.byTable.get(collection.table)
    if (!entry)
      this.byTable.set(
        collection.table,
        (entry = { shapes: new BoundedMap(MAX_SHAPES_PER_COLLECTION), prepared: new Set() }),
      )
    return entry
  }
}

/** Everything the text depends on, and nothing else (members are identifiers, so the separators are unambiguous). */
function shapeKey(r: ListRequest): string {
  let key = ''
  for (const f of r.filters) key += `${f.member}:${f.op},`
  key += r.q !== undefined ? '|q|' : '||'
  for (const k of r.sort) key += `${k.descending ? '-' : ''}${k.member},`
  return key + (r.after ? '|after' : '|') + (r.offset ? '|offset' : '|') + (r.trash ? `|${r.trash}` : '|')
}

const COMPARISON: Record<Exclude<FilterOperator, 'in'>, string> = {
  eq: '=',
  ne: '<>',
  gt: '>',
  gte: '>=',
  lt: '<',
  lte: '<=',
}
/**
 * The element type of an IN list's array parameter. Integers as int8 also suit an int4 column (stock): int4 = int8 is
 * in the same btree operator family, so the (member, id) index still serves it.
 */
const ARRAY_TYPE: Record<MemberType['type'], string> = {
  integer: 'int8[]',
  text: 'text[]',
  email: 'text[]',
  enum: 'text[]',
  timestamp: 'timestamptz[]',
}

function compile(collection: Collection, r: ListRequest): { page: string; count: string } {
  let n = 0
  const conditions: string[] = []
  const { trash } = r
  if (trash) conditions.push(`${quote(DELETED_AT)} ${trash === 'live' ? 'IS NULL' : 'IS NOT NULL'}`)
  for (const f of r.filters) {
    const member = collection.filterable[f.member]!
    const column = isCaseless(member, f.op) ? `lower(${quote(f.member)})` : quote(f.member)
    // PostgreSQL itself turns `IN (a, b, c)` into `= ANY('{a,b,c}')`.
    conditions.push(
      f.op === 'in' ? `${column} = ANY($${++n}::${ARRAY_TYPE[member.type]})` : `${column} ${COMPARISON[f.op]} $${++n}`,
    )
  }
  if (r.q !== undefined) {
    const pattern = `$${++n}`
    conditions.push(`(${collection.searchColumns.map((c) => `${quote(c)} ILIKE ${pattern}`).join(' OR ')})`)
  }
  const table = quote(collection.table)
  const count = `SELECT count(*)::int8 AS total FROM ${table}${where(conditions)}`

  if (r.after) {
    conditions.push(keysetCondition(r.sort, n))
    n += r.sort.length
  }
  const columns = (trash === 'trashed' ? collection.trashedMembers : collection.outputMembers).map(quote).join(', ')
  const order = r.sort.map((k) => `${quote(k.member)} ${k.descending ? 'DESC' : 'ASC'}`).join(', ')
  const page =
    `SELECT ${columns} ` +
    `FROM ${table}${where(conditions)} ORDER BY ${order} LIMIT $${++n}${r.offset ? ` OFFSET $${++n}` : ''}`
  return { page, count }
}

/**
 * Rows strictly after the cursor in sort order; the cursor's values are
 * parameters first+1 … first+sort.length. When every key runs the same way
 * this is a row comparison, which PostgreSQL turns into an index range; mixed
 * directions expand to (a > x) OR (a = x AND b < y) OR ...
 */
function keysetCondition(sort: readonly SortKey[], first: number): string {
  const columns = sort.map((k) => quote(k.member))
  const params = sort.map((_, i) => `$${first + i + 1}`)
  if (sort.every((k) => k.descending === sort[0]!.descending)) {
    return `(${columns.join(', ')}) ${sort[0]!.descending ? '<' : '>'} (${params.join(', ')})`
  }
  const branches = sort.map((key, i) => {
    const terms = columns.slice(0, i).map((c, j) => `${c} = ${params[j]}`)
    terms.push(`${columns[i]} ${key.descending ? '<' : '>'} ${params[i]}`)
    return terms.length === 1 ? terms[0]! : `(${terms.join(' AND ')})`
  })
  return `(${branches.join(' OR ')})`
}

const where = (conditions: string[]) => (conditions.length ? ` WHERE ${conditions.join(' AND ')}` : '')

// -------------------------------------------------------------------- values

/** E-mail equality ignores case and is served by the unique lower(email) index. */
const isCaseless = (member: MemberType, op: FilterOperator) =>
  member.type === 'email' && (op === 'eq' || op === 'ne' || op === 'in')

function filterValue(collection: Collection, f: Filter): Statement['values'][number] {
  const caseless = isCaseless(collection.filterable[f.member]!, f.op)
  if (f.op === 'in') {
    // One array parameter. postgres.js types an array by its first element and
    // would declare an array of Dates a single timestamptz: timestamps go as
    // text, which the ::timestamptz[] cast reads back to the same instant.
    return f.values.map((v) => (v instanceof Date ? v.toISOString() : caseless ? String(v).toLowerCase() : v))
  }
  const value = f.values[0]!
  return caseless ? String(value).toLowerCase() : value
}

/** % and _ are literal in q: escape them (and the escape character) for ILIKE. */
const searchPattern = (q: string) => `%${q.replace(/[\\%_]/g, (c) => `\\${c}`)}%`
