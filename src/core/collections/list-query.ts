import { hash } from 'node:crypto'
import { invalidParameter } from '../http/problem.js'
import type { Reply } from '../http/route.js'
import type { CoreServices } from '../http/services.js'
import type { Db } from '../db/transaction.js'
import { decodeCursor, encodeCursor, type CursorKey } from './cursor.js'
import type { Collection, FilterParameter, ListQuery, MemberType, Operand } from './declaration.js'
import { listStatements, type ListShapes, type Filter, type SortKey, type Value } from './list-sql.js'

declare module '../http/services.js' {
  interface CoreServices {
    /** HMAC keys of collection cursors: the first seals, every one opens (src/core/collections/cursor.ts). */
    cursorKeys: CursorKey[]
    /** The list statements compiled for this instance, by collection and shape (src/core/collections/list-sql.ts). */
    listShapes: ListShapes
  }
}

// The one list mechanism: turns a collection's checked query parameters into
// a filtered, sorted, keyset-paged SELECT (list-sql.ts), runs it, and answers
// with the page, `Link: rel="next"` and, on request, `X-Total-Count`.

const DEFAULT_LIMIT = 50
/** Filter parameters one request may combine: each combination is a statement shape of its own (list-sql.ts). */
export const MAX_FILTERS = 10

export interface ListContext {
  services: Pick<CoreServices, 'sql' | 'cursorKeys' | 'config' | 'listShapes'>
  /** Where the statements run: the request's database handle (HandlerContext.db); default `services.sql`. */
  db?: Db
  /**
   * Equality filters the caller cannot lift (a user sees only its own API
   * keys). Applied on top of the client's filters, and not part of the cursor:
   * they hold for every page whoever presents it.
   */
  fixedFilters?: Record<string, string>
}

/** Answers a list request whose query the collection's queryValidator has checked and typed. */
export async function listCollection(collection: Collection, query: ListQuery, ctx: ListContext): Promise<Reply> {
  const { cursorKeys, config, listShapes } = ctx.services
  const sql = ctx.db ?? ctx.services.sql
  const filters = parseFilters(collection, query)
  for (const [member, value] of Object.entries(ctx.fixedFilters ?? {}))
    filters.push({ member, op: 'eq', values: [value] })
  const sort = parseSort(collection, query.sort)
  const limit = query.limit ?? DEFAULT_LIMIT
  const { offset } = query
  const trashed = query.trashed === true
  const fields = parseFields(trashed ? collection.trashedMembers : collection.outputMembers, query.fields)
  if (offset !== undefined && query.cursor !== undefined)
    throw invalidParameter('offset', 'cannot be combined with cursor')

  const sortText = sort.map((k) => (k.descending ? '-' : '') + k.member).join(',')
  const wire = toWire(query)
  const filterDigest = digestFilters(collection, wire)
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
  const trash = collection.trash ? (trashed ? 'trashed' : 'live') : undefined
  const statements = listStatements(collection, { filters, q: query.q, sort, after, limit, offset, trash }, listShapes)
  const { prepare } = statements
  const pageQuery = sql.unsafe(statements.page.text, statements.page.values, { prepare })
  const countQuery = query.count
    ? sql.unsafe<[{ total: number }]>(statements.count.text, statements.count.values, { prepare })
    : undefined
  const [rows, counted] = await Promise.all([pageQuery, countQuery])

  const headers: Record<string, string> = {}
  if (counted) headers['x-total-count'] = String(counted[0].total)
  if (rows.length > limit) {
    rows.pop()
    const last = rows[rows.length - 1]!
    const cursor = encodeCursor(
      { sort: sortText, filter: filterDigest, after: sort.map((k) => cursorValue(last[k.member])) },
      cursorKeys[0]!,
    )
    headers.link = `<${nextUrl(`${config.apiPrefix}${collection.path}`, wire, cursor)}>; rel="next"`
  }
  // A row is the representation already (the SELECT list is outputMembers, in
  // order, and deleted_at in the trash); the collection's serializer writes the members `fields` chose.
  const serializePage = trashed ? collection.trash!.serializePage : collection.serializePage
  return { status: 200, headers, body: rows, serialize: (page: typeof rows) => serializePage(page, fields) }
}

function parseSort(collection: Collection, raw: string | undefined): SortKey[] {
  const keys: SortKey[] = []
  for (const part of (raw ?? 'id').split(',')) {
    const descending = part.startsWith('-')
    const member = descending ? part.slice(1) : part
    if (!Object.hasOwn(collection.members, member))
      throw invalidParameter(
        'sort',
        `"${member}" is not a sortable member (sortable: ${Object.keys(collection.members).join(', ')})`,
      )
    if (keys.some((k) => k.member === member)) throw invalidParameter('sort', `"${member}" appears twice`)
    keys.push({ member, descending })
  }
  // Ties break by id, in the direction of the last key, so that a one-key
  // sort in either direction is a plain scan of the (member, id) index.
  if (!keys.some((k) => k.member === 'id')) keys.push({ member: 'id', descending: keys[keys.length - 1]!.descending })
  return keys
}

function parseFields(members: readonly string[], raw: string | undefined): string[] | undefined {
  if (raw === undefined) return undefined
  const wanted = new Set(raw.split(','))
  for (const f of wanted)
    if (!members.includes(f))
      throw invalidParameter('fields', `"${f}" is not a member (members: ${members.join(', ')})`)
  return members.filter((m) => wanted.has(m))
}

function parseFilters(collection: Collection, query: ListQuery): Filter[] {
  const found: Array<[string, FilterParameter]> = []
  for (const param of Object.keys(query)) {
    const meaning = collection.filterParameters.get(param)
    if (meaning) found.push([param, meaning])
  }
  if (found.length > 1) found.sort((a, b) => a[1].rank - b[1].rank)
  if (found.length > MAX_FILTERS)
    throw invalidParameter(
      found[MAX_FILTERS]![0],
      `at most ${MAX_FILTERS} filter parameters may be combined in one request`,
    )
  return found.map(([param, { member, op }]) => {
    const operand = query[param] as Operand | Operand[]
    const type = collection.filterable[member]!
    return { member, op, values: (Array.isArray(operand) ? operand : [operand]).map((v) => sqlValue(type, v)) }
  })
}

/**
 * A checked operand as a statement parameter. Integers beyond 2^53 go to
 * SQL as exact text: as a Number they would silently name a neighbour.
 */
function sqlValue(member: MemberType, operand: Operand): Value {
  if (typeof operand === 'bigint') return Number.isSafeInteger(Number(operand)) ? Number(operand) : operand.toString()
  return member.type === 'timestamp' ? new Date(operand) : operand
}

/**
 * The query as text again, for the cursor's digest and the next link
 * (the same for the same selection, however it was spelled).
 */
function toWire(query: ListQuery): Record<string, string> {
  const wire: Record<string, string> = {}
  for (const name in query) {
    const value = query[name]
    if (value !== undefined) wire[name] = Array.isArray(value) ? value.join(',') : String(value)
  }
  return wire
}

const cursorValue = (v: unknown): string | number => (v instanceof Date ? v.toISOString() : (v as string | number))

/** Everything that selects rows, in a canonical order; a cursor is only valid for the same digest. */
function digestFilters(collection: Collection, query: Record<string, string>): string {
  const selecting = Object.keys(query)
    .filter((k) => k === 'q' || k === 'trashed' || collection.filterParameters.has(k))
    .sort()
    .map((k) => [k, query[k]])
  // The table is part of the digest: a cursor of /users (say `sort=id`, no
  // filter) would otherwise be accepted by /products, which has the same key.
  // crypto.hash: one call, no Hash object per page.
  return hash('sha256', JSON.stringify([collection.table, selecting]), 'base64url').slice(0, 16)
}

function nextUrl(basePath: string, query: Record<string, string>, cursor: string): string {
  const params = new URLSearchParams()
  for (const [k, v] of Object.entries(query)) if (k !== 'cursor' && k !== 'offset') params.set(k, v)
  params.set('cursor', cursor)
  return `${basePath}?${params.toString()}`
}
