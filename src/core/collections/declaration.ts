import Type, { type TSchema } from 'typebox'
import { compileValidator, type Validator } from '../http/validate.js'

// What a resource says about its collection: which members can be filtered
// and sorted, and how their values are typed. From it comes the query
// schema, which parses and checks every parameter once (TypeBox, with the
// typed operand of each filter); the SQL, cursors and links follow from the
// checked values (list-query.ts, list-sql.ts).

export type MemberType =
  | { type: 'integer'; minimum: number; maximum: number }
  | { type: 'text' }
  /** Text whose equality ignores case (e-mail addresses). */
  | { type: 'email' }
  | { type: 'enum'; values: readonly string[] }
  | { type: 'timestamp' }

export interface CollectionDeclaration {
  /** The table. */
  table: string
  /** The collection's path (without API prefix), for Link headers. */
  path: string
  /** Members that can be filtered and sorted; each has an index (member, id). */
  members: Record<string, MemberType>
  /**
   * Columns that can be filtered but not sorted, and need not be output
   * members (an event's subject_type, shown inside its `subject`): a cursor
   * holds sort keys only, so these need not be read.
   */
  filterOnly?: Record<string, MemberType>
  /** Columns `q` searches as a case-insensitive substring; none: no `q`. */
  searchColumns: readonly string[]
  /**
   * Members a client may see, in output order; `fields` picks among them. Each
   * is a column: a list selects these columns (and the filterable members), so
   * a column left out here (a password hash, a key hash) is never read.
   */
  outputMembers: readonly string[]
  /** Writes a page of rows as JSON: every output member, or only `fields`. */
  serializePage(rows: readonly Record<string, unknown>[], fields?: readonly string[]): string
  /**
   * Rows go to a trash (a `deleted_at` column) rather than away: lists show live rows only, and `trashed=true` the
   * trash, each item with its `deleted_at`, written by this serializer.
   */
  trash?: { serializePage(rows: readonly Record<string, unknown>[], fields?: readonly string[]): string }
}

export const filterOperators = ['ne', 'gt', 'gte', 'lt', 'lte', 'in'] as const
export type FilterOperator = 'eq' | (typeof filterOperators)[number]

/** A filter operand as checked: integers as BigInt (ids reach 2^63 - 1), timestamps as their RFC 3339 text. */
export type Operand = string | bigint

/** The query of a list request, checked and typed. */
export interface ListQuery {
  q?: string
  sort?: string
  limit?: number
  offset?: number
  cursor?: string
  count?: boolean
  fields?: string
  /** The trash instead of the live rows (a collection with a trash only). */
  trashed?: boolean
  /** Filters: `price`, `price[gte]` (one operand), `price[in]` (a list). */
  [filter: string]: Operand | Operand[] | number | boolean | undefined
}

/** What a filter parameter of the query string (`price`, `price[gte]`) stands for. */
export interface FilterParameter {
  member: string
  op: FilterOperator
  /**
   * Its place in one fixed order (members as declared, then operators as
   * listed), so that filters come out in the same order however the query
   * string is written: one SQL shape, and the same parameter named first when
   * several are wrong.
   */
  rank: number
}

/** The column a trash keeps the time of deletion in: a member of the items of `trashed=true` lists. */
export const DELETED_AT = 'deleted_at'

export interface Collection extends CollectionDeclaration {
  /** What an item of the trash may show (`fields` picks among them): the output members and `deleted_at`. */
  trashedMembers: readonly string[]
  /** Every filterable column and its type: `members` and `filterOnly`. */
  filterable: Readonly<Record<string, MemberType>>
  /** Parses and checks the whole query string: names, shapes, ranges. */
  queryValidator: Validator<ListQuery>
  /** Every filter parameter name, built once: a request looks up only the names it has. */
  filterParameters: ReadonlyMap<string, FilterParameter>
}

const MAX_LIMIT = 200
export const MAX_OFFSET = 100_000
const MAX_IN_VALUES = 100
const MAX_VALUE_LENGTH = 1000
const INT4_MAX = 2_147_483_647

/**
 * The operand of a filter on a member. A filter compares: `id[gt]=0` or
 * `stock[lt]=-1` are fair questions though no row holds such a value, so an
 * integer operand may be anything the column's type holds (int4 when the
 * member's values fit there, else int8); the member's own range is for writes.
 */
function operandSchema(member: MemberType): TSchema {
  switch (member.type) {
    case 'integer': {
      // Bounds as powers of two: TypeBox's compiled check writes them as
      // number literals, and 2^63 - 1 would round up to 2^63 and let it through.
      const bound = member.maximum <= INT4_MAX ? 2n ** 31n : 2n ** 63n
      return Type.BigInt({
        minimum: -bound,
        exclusiveMaximum: bound,
        description: `an integer from ${-bound} to ${bound - 1n}`,
      })
    }
    case 'timestamp':
      // The format checks the calendar (no 2024-02-30); the pattern keeps to the one spelling Date parses.
      return Type.String({
        format: 'date-time',
        pattern: '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})$',
        description: 'an RFC 3339 timestamp',
      })
    case 'enum':
      return Type.Union(member.values.map((v) => Type.Literal(v)))
    default:
      return Type.String({ maxLength: MAX_VALUE_LENGTH })
  }
}

export function defineCollection(declaration: CollectionDeclaration): Collection {
  checkIdentifiers(declaration)
  const properties: Record<string, TSchema> = {
    ...(declaration.searchColumns.length
      ? {
          q: Type.Optional(
            Type.String({ minLength: 1, maxLength: 200, description: 'a search text of 1 to 200 characters' }),
          ),
        }
      : {}),
    sort: Type.Optional(
      Type.String({
        maxLength: 500,
        description: 'at most 500 characters: comma-separated members, each optionally prefixed by - for descending',
      }),
    ),
    limit: Type.Optional(
      Type.Integer({ minimum: 1, maximum: MAX_LIMIT, description: `an integer from 1 to ${MAX_LIMIT}` }),
    ),
    offset: Type.Optional(
      Type.Integer({ minimum: 0, maximum: MAX_OFFSET, description: `an integer from 0 to ${MAX_OFFSET}` }),
    ),
    cursor: Type.Optional(Type.String({ maxLength: 8192, description: 'a cursor from a Link header' })),
    count: Type.Optional(Type.Boolean({ description: 'true or false' })),
    fields: Type.Optional(
      Type.String({ maxLength: 500, description: 'at most 500 characters: comma-separated members to return' }),
    ),
    ...(declaration.trash
      ? {
          trashed: Type.Optional(
            Type.Boolean({
              description: 'true (the trash, an admin only) or false (the live ones, the default)',
              examples: [true],
            }),
          ),
        }
      : {}),
  }
  const filterParameters = new Map<string, FilterParameter>()
  const filterable = { ...declaration.members, ...declaration.filterOnly }
  for (const [name, member] of Object.entries(filterable)) {
    for (const op of ['eq', ...filterOperators] as const) {
      const param = op === 'eq' ? name : `${name}[${op}]`
      const operand = operandSchema(member)
      properties[param] = Type.Optional(
        op === 'in'
          ? Type.Array(operand, {
              minItems: 1,
              maxItems: MAX_IN_VALUES,
              description: `at most ${MAX_IN_VALUES} comma-separated values`,
            })
          : operand,
      )
      filterParameters.set(param, { member: name, op, rank: filterParameters.size })
    }
  }
  // Rows are sent as selected (list-query.ts), so what can be filtered and
  // sorted must be part of the representation.
  for (const member of Object.keys(declaration.members)) {
    if (!declaration.outputMembers.includes(member))
      throw new Error(`collection ${declaration.path}: member "${member}" is not one of outputMembers`)
  }
  const schema = Type.Object(properties, { additionalProperties: false })
  const wireForms = wireDecoders(properties)
  return {
    ...declaration,
    trashedMembers: declaration.trash ? [...declaration.outputMembers, DELETED_AT] : [],
    filterable,
    queryValidator: compileValidator(schema, {
      fromWire: (query) => fromWire(query as Record<string, string>, wireForms),
    }) as Validator<ListQuery>,
    filterParameters,
  }
}

type Decoder = (raw: string) => unknown

/**
 * Query values arrive as text; each parameter's schema says what the text
 * stands for: a list is split at commas, and integers, BigInts and booleans
 * are read as such. Text that does not read as its type is left as it is,
 * for the schema check to refuse with a message naming the parameter.
 */
function wireDecoders(properties: Record<string, TSchema>): Map<string, Decoder> {
  const scalar = (schema: TSchema): Decoder => {
    if (Type.IsBigInt(schema)) return (raw) => (/^-?[0-9]{1,20}$/.test(raw) ? BigInt(raw) : raw)
    if (Type.IsInteger(schema)) return (raw) => (/^[0-9]{1,7}$/.test(raw) ? Number(raw) : raw)
    if (Type.IsBoolean(schema)) return (raw) => (raw === 'true' ? true : raw === 'false' ? false : raw)
    return (raw) => raw
  }
  const decoders = new Map<string, Decoder>()
  for (const [name, schema] of Object.entries(properties)) {
    if (Type.IsArray(schema)) {
      const item = scalar(schema.items as TSchema)
      decoders.set(name, (raw) => raw.split(',').map(item))
    } else {
      decoders.set(name, scalar(schema))
    }
  }
  return decoders
}

function fromWire(query: Record<string, string>, decoders: ReadonlyMap<string, Decoder>): Record<string, unknown> {
  const typed: Record<string, unknown> = {}
  for (const name in query) {
    const decode = decoders.get(name)
    typed[name] = decode ? decode(query[name]!) : query[name]
  }
  return typed
}

const IDENTIFIER = /^[a-z_][a-z0-9_]*$/

/**
 * The list SQL is compiled from these names (quoted, but never from client
 * text). Plain lower-case identifiers only, checked at start-up: a name that
 * needs care to quote is a mistake in a declaration, not something to support.
 */
function checkIdentifiers(declaration: CollectionDeclaration): void {
  const names = [
    declaration.table,
    ...Object.keys(declaration.members),
    ...Object.keys(declaration.filterOnly ?? {}),
    ...declaration.searchColumns,
    ...declaration.outputMembers,
  ]
  for (const name of names) {
    if (!IDENTIFIER.test(name))
      throw new Error(`collection ${declaration.path}: "${name}" is not a plain SQL identifier`)
  }
}
