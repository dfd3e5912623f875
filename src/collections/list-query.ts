import { createHash } from 'node:crypto'
import { invalidParameter } from '../http/problem.js'
import type { AppDeps } from '../app-deps.js'
import type { Reply } from '../http/route.js'
import { decodeCursor, encodeCursor } from './cursor.js'
import type { Collection, FilterParameter, MemberType } from './declaration.js'
import { listStatements, type Filter, type SortKey, type Value } from './list-sql.js'

// The one list mechanism: turns a collection's checked query parameters into
// a filtered, sorted, keyset-paged SELECT (list-sql.ts), runs it, and answers
// with the page, `Link: rel="next"` and, on request, `X-Total-Count`.

const DEFAULT_LIMIT = 50
const MAX_LIMIT = 200
const MAX_OFFSET = 100_000
const MAX_IN_VALUES = 100
/** Filter parameters one request may combine: each combination is a statement shape of its own (list-sql.ts). */
export const MAX_FILTERS = 10
const BIGINT_MAX = 9223372036854775807n

export interface ListContext {
  deps: Pick<AppDeps, 'sql' | 'cursorKeys' | 'config'>
  /**
   * Equality filters the caller cannot lift (a user sees only its own API
   * keys). Applied on top of the client's filters, and not part of the cursor:
   * they hold for every page whoever presents it.
   */
  fixedFilters?: Record<string, string>
}

export async function listCollection(collection: Collection, query: Record<string, string>, ctx: ListContext): Promise<Reply> {
  const { sql, cursorKeys, config } = ctx.deps
  const filters = parseFilters(collection, query)
  for (const [member, value] of Object.entries(ctx.fixedFilters ?? {})) filters.push({ member, op: 'eq', values: [value] })
  const sort = parseSort(collection, query.sort)
  const limit = parseBoundedInt('limit', query.limit, 1, MAX_LIMIT) ?? DEFAULT_LIMIT
  const offset = parseBoundedInt('offset', query.offset, 0, MAX_OFFSET)
  const fields = parseFields(collection, query.fields)
  if (offset !== undefined && query.cursor !== undefined) throw invalidParameter('offset', 'cannot be combined with cursor')

  const sortText = sort.map((k) => (k.descending ? '-' : '') + k.member).join(',')
  const filterDigest = digestFilters(collection, query)
  let after: Value[] | undefined
  if (query.cursor !== undefined) {
    const cursor = decodeCursor(query.cursor, cursorKeys)
    if (!cursor || cursor.after.length !== sort.length) throw invalidParameter('cursor', 'is not a valid cursor')
    if (cursor.sort !== sortText) throw invalidParameter('cursor', 'belongs to a different sort')
    if (cursor.filter !== filterDigest) throw invalidParameter('cursor', 'belongs to a different filter')
    after = cursor.after.map((v, i) => (collection.members[sort[i]!.member]!.type === 'timestamp' ? new Date(v) : v))
  }

  // The texts are compiled from the declaration only; every client value is
  // among the parameters (list-sql.ts). An unfiltered count has none, and
  // postgres.js sends a text without parameters as a simple query, unprepared.
  // Trap: postgres.js 3.4.9 caches Query.origin by the query's strings array,
  // which is new for every unsafe query, so each one that fails leaves about
  // 100 bytes in a Map; the fix belongs in src/db/postgres-patch.mjs (no
  // caching for untagged queries).
  const statements = listStatements(collection, { filters, q: query.q, sort, after, limit, offset })
  const { prepare } = statements
  const pageQuery = sql.unsafe(statements.page.text, statements.page.values, { prepare })
  const countQuery = query.count === 'true' ? sql.unsafe<[{ total: number }]>(statements.count.text, statements.count.values, { prepare }) : undefined
  const [rows, counted] = await Promise.all([pageQuery, countQuery])

  const headers: Record<string, string> = {}
  if (counted) headers['x-total-count'] = String(counted[0].total)
  if (rows.length > limit) {
    rows.pop()
    const last = rows[rows.length - 1]!
    const cursor = encodeCursor({ sort: sortText, filter: filterDigest, after: sort.map((k) => cursorValue(last[k.member])) }, cursorKeys[0]!)
    headers.link = `<${nextUrl(`${config.apiPrefix}${collection.path}`, query, cursor)}>; rel="next"`
  }
  // A row is the representation already: the SELECT list is outputMembers, in order.
  const body = fields ? rows.map((row) => Object.fromEntries(fields.map((f) => [f, row[f]]))) : rows
  return { status: 200, headers, body }
}

function parseBoundedInt(name: string, raw: string | undefined, min: number, max: number): number | undefined {
  if (raw === undefined) return undefined
  const value = Number(raw)
  if (!Number.isInteger(value) || value < min || value > max) throw invalidParameter(name, `must be an integer from ${min} to ${max}`)
  return value
}

function parseSort(collection: Collection, raw: string | undefined): SortKey[] {
  const keys: SortKey[] = []
  for (const part of (raw ?? 'id').split(',')) {
    const descending = part.startsWith('-')
    const member = descending ? part.slice(1) : part
    if (!Object.hasOwn(collection.members, member)) throw invalidParameter('sort', `"${member}" is not a sortable member (sortable: ${Object.keys(collection.members).join(', ')})`)
    if (keys.some((k) => k.member === member)) throw invalidParameter('sort', `"${member}" appears twice`)
    keys.push({ member, descending })
  }
  // Ties break by id, in the direction of the last key, so that a one-key
  // sort in either direction is a plain scan of the (member, id) index.
  if (!keys.some((k) => k.member === 'id')) keys.push({ member: 'id', descending: keys[keys.length - 1]!.descending })
  return keys
}

function parseFields(collection: Collection, raw: string | undefined): string[] | undefined {
  if (raw === undefined) return undefined
  const wanted = new Set(raw.split(','))
  for (const f of wanted) if (!collection.outputMembers.includes(f)) throw invalidParameter('fields', `"${f}" is not a member (members: ${collection.outputMembers.join(', ')})`)
  return collection.outputMembers.filter((m) => wanted.has(m))
}

function parseFilters(collection: Collection, query: Record<string, string>): Filter[] {
  const found: Array<[string, FilterParameter]> = []
  for (const param of Object.keys(query)) {
    const meaning = collection.filterParameters.get(param)
    if (meaning) found.push([param, meaning])
  }
  if (found.length > 1) found.sort((a, b) => a[1].rank - b[1].rank)
  if (found.length > MAX_FILTERS) throw invalidParameter(found[MAX_FILTERS]![0], `at most ${MAX_FILTERS} filter parameters may be combined in one request`)
  return found.map(([param, { member, op }]) => {
    const raw = query[param]!
    const parts = op === 'in' ? raw.split(',') : [raw]
    if (parts.length > MAX_IN_VALUES) throw invalidParameter(param, `must list at most ${MAX_IN_VALUES} values`)
    const type = collection.members[member]!
    return { member, op, values: parts.map((p) => typedValue(param, type, p)) }
  })
}

function typedValue(param: string, member: MemberType, raw: string): Value {
  switch (member.type) {
    case 'integer': {
      // A filter compares: `id[gt]=0` or `stock[lt]=-1` are fair questions even
      // though no row holds such a value, so the operand may be anything the
      // column's type holds (the member's own range is for what is written).
      // Compared as BigInt: as a Number, 9223372036854775807 rounds up to 2^63,
      // passed the bound and reached PostgreSQL out of range (a 500), and ids
      // beyond 2^53 silently named a neighbour; those go to SQL as exact text.
      const [min, max] = columnRange(member)
      const value = /^-?[0-9]+$/.test(raw) ? BigInt(raw) : undefined
      if (value === undefined || value < min || value > max) throw invalidParameter(param, `must be an integer from ${min} to ${max}`)
      return Number.isSafeInteger(Number(value)) ? Number(value) : value.toString()
    }
    case 'timestamp': {
      const value = new Date(raw)
      if (Number.isNaN(value.getTime()) || !/^\d{4}-\d{2}-\d{2}T/.test(raw) || !isCalendarDate(raw)) throw invalidParameter(param, 'must be an RFC 3339 timestamp')
      return value
    }
    case 'enum':
      if (!member.values.includes(raw)) throw invalidParameter(param, `must be one of ${member.values.join(', ')}`)
      return raw
    default:
      return raw
  }
}

const INT4_MAX = 2_147_483_647n

/** What the member's column can hold: integer (int4) when its values fit there, else bigint. */
function columnRange(member: { maximum: number }): [bigint, bigint] {
  return BigInt(member.maximum) <= INT4_MAX ? [-INT4_MAX - 1n, INT4_MAX] : [-BIGINT_MAX - 1n, BIGINT_MAX]
}

/**
 * Date.parse rolls a day past the end of its month over (2024-02-30 is read
 * as 2024-03-01), so a filter on an impossible date would silently select
 * from another day: the date part must name a real day.
 */
function isCalendarDate(raw: string): boolean {
  const [y, m, d] = raw.slice(0, 10).split('-').map(Number) as [number, number, number]
  const day = new Date(0)
  day.setUTCFullYear(y, m - 1, d) // not Date.UTC, which reads years 0-99 as 1900-1999
  return day.getUTCFullYear() === y && day.getUTCMonth() === m - 1 && day.getUTCDate() === d
}

const cursorValue = (v: unknown): string | number => (v instanceof Date ? v.toISOString() : (v as string | number))

/** Everything that selects rows, in a canonical order; a cursor is only valid for the same digest. */
function digestFilters(collection: Collection, query: Record<string, string>): string {
  const selecting = Object.keys(query)
    .filter((k) => k === 'q' || collection.filterParameters.has(k))
    .sort()
    .map((k) => [k, query[k]])
  // The table is part of the digest: a cursor of /users (say `sort=id`, no
  // filter) would otherwise be accepted by /products, which has the same key.
  return createHash('sha256').update(JSON.stringify([collection.table, selecting])).digest('base64url').slice(0, 16)
}

function nextUrl(basePath: string, query: Record<string, string>, cursor: string): string {
  const params = new URLSearchParams()
  for (const [k, v] of Object.entries(query)) if (k !== 'cursor' && k !== 'offset') params.set(k, v)
  params.set('cursor', cursor)
  return `${basePath}?${params.toString()}`
}
