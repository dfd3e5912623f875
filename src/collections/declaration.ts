import Type, { type TSchema } from 'typebox'
import { compileValidator, type Validator } from '../http/validate.js'

// What a resource says about its collection: which members can be filtered
// and sorted, and how their values are typed. Everything else (query schema,
// SQL, cursors, links) is derived from this by the one list mechanism.

export type MemberType =
  | { type: 'integer'; minimum: number; maximum: number }
  | { type: 'text' }
  /** Text whose equality ignores case (e-mail addresses). */
  | { type: 'email' }
  | { type: 'enum'; values: readonly string[] }
  | { type: 'timestamp' }

export interface CollectionDeclaration {
  /** The table. */
  table: 'users' | 'products' | 'api_keys'
  /** The collection's path (without API prefix), for Link headers. */
  path: string
  /** Members that can be filtered and sorted; each has an index (member, id). */
  members: Record<string, MemberType>
  /** Columns `q` searches as a case-insensitive substring. */
  searchColumns: readonly string[]
  /**
   * Members a client may see, in output order; `fields` picks among them. Each
   * is a column: a list selects these columns (and the filterable members), so
   * a column left out here (a password hash, a key hash) is never read.
   */
  outputMembers: readonly string[]
}

export const filterOperators = ['ne', 'gt', 'gte', 'lt', 'lte', 'in'] as const
export type FilterOperator = 'eq' | (typeof filterOperators)[number]

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

export interface Collection extends CollectionDeclaration {
  /** Validates parameter names and shapes; typed conversion follows in list-query. */
  queryValidator: Validator<Record<string, string>>
  /** Every filter parameter name, built once: a request looks up only the names it has. */
  filterParameters: ReadonlyMap<string, FilterParameter>
}

const MAX_VALUE_LENGTH = 1000

function valueSchema(member: MemberType, list: boolean): TSchema {
  const one = {
    integer: { pattern: '-?[0-9]{1,19}', description: 'an integer' },
    text: { pattern: '', description: 'a string' },
    email: { pattern: '', description: 'a string' },
    enum: { pattern: member.type === 'enum' ? `(${member.values.join('|')})` : '', description: member.type === 'enum' ? `one of ${member.values.join(', ')}` : '' },
    timestamp: { pattern: '[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})', description: 'an RFC 3339 timestamp' },
  }[member.type]
  const description = list ? `a comma-separated list of ${one.description.replace(/^an? /, '')} values` : one.description
  if (!one.pattern) return Type.Optional(Type.String({ maxLength: MAX_VALUE_LENGTH, description }))
  const pattern = list ? `^${one.pattern}(,${one.pattern})*$` : `^${one.pattern}$`
  return Type.Optional(Type.String({ maxLength: MAX_VALUE_LENGTH, pattern, description }))
}

export function defineCollection(declaration: CollectionDeclaration): Collection {
  const properties: Record<string, TSchema> = {
    q: Type.Optional(Type.String({ minLength: 1, maxLength: 200, description: 'a search text of 1 to 200 characters' })),
    sort: Type.Optional(Type.String({ maxLength: 500, description: 'comma-separated members, each optionally prefixed by - for descending' })),
    limit: Type.Optional(Type.String({ pattern: '^[0-9]{1,3}$', description: 'an integer from 1 to 200' })),
    offset: Type.Optional(Type.String({ pattern: '^[0-9]{1,6}$', description: 'an integer from 0 to 100000' })),
    cursor: Type.Optional(Type.String({ maxLength: 8192, description: 'a cursor from a Link header' })),
    count: Type.Optional(Type.String({ pattern: '^(true|false)$', description: 'true or false' })),
    fields: Type.Optional(Type.String({ maxLength: 500, description: 'comma-separated members to return' })),
  }
  const filterParameters = new Map<string, FilterParameter>()
  for (const [name, member] of Object.entries(declaration.members)) {
    for (const op of ['eq', ...filterOperators] as const) {
      const param = op === 'eq' ? name : `${name}[${op}]`
      properties[param] = valueSchema(member, op === 'in')
      filterParameters.set(param, { member: name, op, rank: filterParameters.size })
    }
  }
  checkIdentifiers(declaration)
  // Rows are sent as selected (list-query.ts), so what can be filtered and
  // sorted must be part of the representation.
  for (const member of Object.keys(declaration.members)) {
    if (!declaration.outputMembers.includes(member)) throw new Error(`collection ${declaration.path}: member "${member}" is not one of outputMembers`)
  }
  const schema = Type.Object(properties, { additionalProperties: false })
  return {
    ...declaration,
    queryValidator: compileValidator(schema) as Validator<Record<string, string>>,
    filterParameters,
  }
}

const IDENTIFIER = /^[a-z_][a-z0-9_]*$/

/**
 * The list SQL is compiled from these names (quoted, but never from client
 * text). Plain lower-case identifiers only, checked at start-up: a name that
 * needs care to quote is a mistake in a declaration, not something to support.
 */
function checkIdentifiers(declaration: CollectionDeclaration): void {
  const names = [declaration.table, ...Object.keys(declaration.members), ...declaration.searchColumns, ...declaration.outputMembers]
  for (const name of names) {
    if (!IDENTIFIER.test(name)) throw new Error(`collection ${declaration.path}: "${name}" is not a plain SQL identifier`)
  }
}
