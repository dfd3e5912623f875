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
  /** Members a client may see, in output order; `fields` picks among them. */
  outputMembers: readonly string[]
}

export const filterOperators = ['ne', 'gt', 'gte', 'lt', 'lte', 'in'] as const
export type FilterOperator = 'eq' | (typeof filterOperators)[number]

export interface Collection extends CollectionDeclaration {
  /** Validates parameter names and shapes; typed conversion follows in list-query. */
  queryValidator: Validator<Record<string, string>>
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
  for (const [name, member] of Object.entries(declaration.members)) {
    properties[name] = valueSchema(member, false)
    for (const op of filterOperators) properties[`${name}[${op}]`] = valueSchema(member, op === 'in')
  }
  const schema = Type.Object(properties, { additionalProperties: false })
  return { ...declaration, queryValidator: compileValidator(schema) as Validator<Record<string, string>> }
}
