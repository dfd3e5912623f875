import Type, { type Static, type TObject, type TSchema } from 'typebox'
import { defineCollection, type Collection, type MemberType } from '../collections/declaration.js'
import type { ProblemType } from '../http/problem.js'
import { compileValidator, type FormatCheck, type Validator } from '../http/validate.js'
import { BoundedMap } from '../lib/bounded-map.js'
import { traitsOf, type MemberTraits } from './member.js'
import { compileSerializer, type Serializer } from './serializer.js'

// One declaration per resource is the source of truth: from its members come
// the create, replace and patch body schemas, the representation and its
// response schema, the collection (filters, sorts, search, the list SQL), the
// columns a write may set and the OpenAPI components. A new member is one
// line here plus its migration.

export type Members = Record<string, TSchema>

/**
 * Who may read and who may write a resource: empty in core, given its
 * members by the application (src/app-context.ts), whose authorization and
 * scopes are derived from it. Core only carries it.
 */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type
export interface ResourceAccess {}

export interface ResourceDeclaration<M extends Members> {
  /**
   * Singular and PascalCase: the OpenAPI components (`Order`, `OrderCreate`,
   * …) and operation ids (`getOrder`, `listOrders`).
   */
  name: string
  /** The plural for operation ids and summaries (`listCategories`); default the name and an s. */
  plural?: string
  /** The collection's path, without API prefix. */
  path: string
  /** A plain lower-case identifier (checked): the list SQL is built from it. */
  table: string
  members: M
  /** Who may read and write it (src/app-context.ts gives the members). */
  access: ResourceAccess
  /**
   * String formats its members use beyond TypeBox's own, each with its check,
   * given to each of its validators (src/core/http/validate.ts).
   */
  formats?: Readonly<Record<string, FormatCheck>>
  /**
   * Body members that are not members of the resource (a user's
   * `current_password`), accepted in replace and patch bodies for a hook.
   */
  writeExtras?: Members
  /**
   * Body members of a create that are not members of the resource
   * (an API key creator's `current_password`), for a hook.
   */
  createExtras?: Members
  /**
   * Members of an optional JSON body on DELETE (a user's `current_password`,
   * to delete one's own account), for a hook. Without it a DELETE takes no body.
   */
  deleteBody?: Members
  /**
   * Columns of its table that are no member: the service's own, never shown
   * or written by a client (a password's hash, a credential epoch). With
   * `version`, these and the members are the whole table (test/resource-schema.test.ts).
   */
  serverColumns?: readonly string[]
  /** Rows carry a `version` column: ETags, If-Match, 304. Default true. */
  versioned?: boolean
  /** The verb of the event a deletion writes (`order.cancelled`). Default `deleted`. */
  deletedVerb?: string
  /**
   * A DELETE moves the row to the trash (its `deleted_at` column, which this implies) instead of removing it: from
   * then on it is absent from reads, writes, lists and counts; an admin lists the trash (`?trashed=true`), restores
   * a row (`POST …/{id}/restore`) or purges one at once (`DELETE …?permanent=true`), and the service purges what
   * has been there for TRASH_RETENTION (src/core/resources/trash-purge.ts). Its unique constraints must hold among
   * live rows only (partial indexes `WHERE deleted_at IS NULL`). Default false.
   */
  trash?: boolean
}

/**
 * A row as read from the table: the members as their schemas type them (timestamps as the API's text,
 * src/core/db/timestamps.ts), and `version`.
 */
export type Row<M extends Members> = { [K in keyof M]: Static<M[K]> } & { version: number }

export interface Resource<M extends Members = Members> {
  readonly name: string
  /** `Orders`, `Categories`: operation ids of the collection. */
  readonly plural: string
  /** The name in a sentence: `OrderLine` is "order line". */
  readonly label: string
  readonly path: string
  readonly table: string
  readonly members: M
  readonly access: ResourceAccess
  readonly versioned: boolean
  /** Whether a DELETE moves a row to the trash (the declaration's `trash`). */
  readonly trash: boolean
  /** Its table's columns that are no member, `version` aside (the declaration's serverColumns, and `deleted_at`). */
  readonly serverColumns: readonly string[]
  readonly traits: Readonly<Record<string, MemberTraits>>
  /** What GET answers, in output order: the non-secret stored members. */
  readonly outputMembers: readonly string[]
  /** Named schemas, for the OpenAPI components: the representation, a page, and the bodies. */
  readonly schemas: {
    representation: TObject
    page: TSchema
    create: TSchema
    replace: TSchema
    patch: TSchema
    delete?: TSchema
  }
  readonly bodies: {
    create: Validator<Record<string, unknown>>
    replace: Validator<Record<string, unknown>>
    patch: Validator<Record<string, unknown>>
    delete?: Validator<Record<string, unknown>>
  }
  readonly collection: Collection
  /** The unique constraints on its members, by constraint name: the problem code and the member it guards. */
  readonly uniqueCodes: ReadonlyMap<string, { code: string; member: string }>
  /** The problems of its unique constraints, by code (all 409), for the service's problem table (src/registry.ts). */
  readonly problems: Readonly<Record<string, ProblemType>>
  /** Writes representations as JSON, compiled from the representation's schema. */
  readonly serializer: Serializer
  /** The representation of a row: output members only, in order. */
  present(row: Record<string, unknown>): Record<string, unknown>
  /** Output members that are timestamps (written as the API's timestamp text). */
  readonly timestampMembers: ReadonlySet<string>
  /**
   * The events its writes record (sql/007): the subject type (`order_line`) and the type of each write; `restored`
   * and `purged` are written by a resource with a trash only.
   */
  readonly events: {
    subject: string
    created: string
    updated: string
    deleted: string
    restored: string
    purged: string
  }
  /**
   * The texts of its single-row statements, made once per statement and set
   * of columns (src/core/resources/store.ts): derived from the declaration
   * alone, so they belong to it, not to a module.
   */
  readonly statementTexts: BoundedMap<string, string>
  /**
   * Its schemas by OpenAPI component name: `Order`, `OrderPage`, `OrderCreate`, `OrderReplace`, `OrderPatch` (and
   * `OrderDelete`, with a deleteBody).
   */
  components(): Record<string, TSchema>
}

/** Column sets come from the declaration, so there are few; the bound is a guard, not a working limit. */
const STATEMENT_TEXTS = 2000

export function defineResource<M extends Members>(declaration: ResourceDeclaration<M>): Resource<M> {
  const { name, members, formats } = declaration
  const traits: Record<string, MemberTraits> = {}
  for (const [member, schema] of Object.entries(members)) traits[member] = { write: 'client', ...traitsOf(schema) }
  const entries = Object.entries(members)
  const stored = (m: string) => !traits[m]!.virtual
  const outputMembers = entries.map(([m]) => m).filter((m) => stored(m) && !traits[m]!.secret)
  const writable = (m: string, op: 'create' | 'update') =>
    traits[m]!.write === 'client' || (op === 'create' && traits[m]!.write === 'create')

  const create: Record<string, TSchema> = {}
  const replace: Record<string, TSchema> = {}
  const patch: Record<string, TSchema> = {}
  for (const [member, schema] of entries) {
    const t = traits[member]!
    if (writable(member, 'create'))
      create[member] = t.default !== undefined || t.optional ? Type.Optional(schema) : schema
    if (!writable(member, 'update')) continue
    replace[member] = t.default !== undefined || t.optional || t.keepOnReplace ? Type.Optional(schema) : schema
    patch[member] = Type.Optional(t.nullable ? Type.Union([schema, Type.Null()]) : schema)
  }
  // PUT and PATCH bodies may echo read-only members (a GET-modify-PUT round trip); they are ignored, but an echoed id
  // must be the one in the path.
  const echo = readOnlyEcho(entries.filter(([m]) => traits[m]!.write !== 'client' && outputMembers.includes(m)))
  const extras = declaration.writeExtras ?? {}
  const strict = { additionalProperties: false }
  const trash = declaration.trash ?? false
  const representation = Type.Object(
    Object.fromEntries(outputMembers.map((m) => [m, responseSchema(members[m]!)])),
    strict,
  )
  // An item of the trash (`?trashed=true`) is the representation and when it was deleted.
  const trashed = trash
    ? Type.Object(
        {
          ...(representation.properties as Record<string, TSchema>),
          deleted_at: Type.String({
            format: 'date-time',
            description: 'when it was moved to the trash',
            examples: ['2026-11-28T01:40:12.345Z'],
          }),
        },
        strict,
      )
    : undefined
  const schemas = {
    representation,
    /** `fields` may leave members out of a page's items. */
    page: Type.Array(Type.Partial(trashed ?? representation)),
    create: Type.Object({ ...create, ...declaration.createExtras }, strict),
    replace: Type.Object({ ...replace, ...extras, ...echo }, strict),
    patch: Type.Object({ ...patch, ...extras, ...echo }, strict),
    ...(declaration.deleteBody ? { delete: Type.Object(declaration.deleteBody, strict) } : {}),
  }

  const serializer = compileSerializer(representation)
  const collection = defineCollection({
    table: declaration.table,
    path: declaration.path,
    members: Object.fromEntries(
      entries.filter(([m]) => traits[m]!.sort).map(([m, s]) => [m, memberType(name, m, s, traits[m]!)]),
    ),
    searchColumns: entries.filter(([m]) => traits[m]!.search).map(([m]) => m),
    outputMembers,
    serializePage: serializer.page,
    ...(trashed ? { trash: { serializePage: compileSerializer(trashed).page } } : {}),
  })
  const label = name.replace(/[A-Z]/g, (c, at: number) => (at ? ' ' : '') + c.toLowerCase())
  const subject = label.replaceAll(' ', '_')
  const uniques = entries.flatMap(([m]) => {
    const unique = traits[m]!.unique
    return unique ? [{ ...unique, member: m }] : []
  })
  const uniqueCodes = new Map(
    uniques.map((u) => [u.constraint, { code: u.code, member: u.member.replaceAll('_', ' ') }] as const),
  )

  return {
    name,
    plural: declaration.plural ?? `${name}s`,
    label,
    path: declaration.path,
    table: declaration.table,
    members,
    access: declaration.access,
    versioned: declaration.versioned ?? true,
    trash,
    serverColumns: [...(declaration.serverColumns ?? []), ...(trash ? ['deleted_at'] : [])],
    traits,
    outputMembers,
    schemas,
    bodies: {
      create: compileValidator(schemas.create, { formats }),
      replace: compileValidator(schemas.replace, { formats }),
      patch: compileValidator(schemas.patch, { formats }),
      ...(schemas.delete ? { delete: compileValidator(schemas.delete, { formats }) } : {}),
    },
    collection,
    uniqueCodes,
    problems: Object.fromEntries(uniques.map((u) => [u.code, { status: 409, title: u.title }])),
    timestampMembers: new Set(outputMembers.filter((m) => isTimestamp(members[m]!))),
    events: {
      subject,
      created: `${subject}.created`,
      updated: `${subject}.updated`,
      deleted: `${subject}.${declaration.deletedVerb ?? 'deleted'}`,
      restored: `${subject}.restored`,
      purged: `${subject}.purged`,
    },
    components: () => ({
      [name]: schemas.representation,
      [`${name}Page`]: schemas.page,
      [`${name}Create`]: schemas.create,
      [`${name}Replace`]: schemas.replace,
      [`${name}Patch`]: schemas.patch,
      ...(schemas.delete ? { [`${name}Delete`]: schemas.delete } : {}),
    }),
    serializer,
    statementTexts: new BoundedMap(STATEMENT_TEXTS),
    present(row) {
      const out: Record<string, unknown> = {}
      for (const m of outputMembers) out[m] = row[m]
      return out
    },
  }
}

/** A timestamp echoed back (any text, ignored), or null where the member may be null. */
const echoedTimestamp = (schema: TSchema) => {
  const text = Type.String({ maxLength: 64, description: 'read-only; ignored' })
  return isTimestampString(schema) ? text : Type.Union([text, Type.Null()])
}

function readOnlyEcho(entries: Array<[string, TSchema]>): Record<string, TSchema> {
  const echo: Record<string, TSchema> = {}
  for (const [member, schema] of entries) {
    echo[member] =
      member === 'id'
        ? Type.Optional(Type.Integer({ minimum: 1, description: 'read-only; must equal the id in the path' }))
        : Type.Optional(isTimestamp(schema) ? echoedTimestamp(schema) : schema)
  }
  return echo
}

/**
 * What a client receives: the member's type without the rules for what it
 * may send (a pattern, a length): a row written before a rule was tightened
 * is still shown. Timestamps keep their format.
 */
function responseSchema(schema: TSchema): TSchema {
  if (isEnum(schema)) return schema
  if (Type.IsUnion(schema)) return Type.Union((schema.anyOf as TSchema[]).map(responseSchema))
  if (Type.IsArray(schema)) return Type.Array(responseSchema(schema.items as TSchema))
  if (Type.IsInteger(schema)) {
    const { minimum } = schema as { minimum?: number }
    return Type.Integer(minimum !== undefined && minimum >= 0 ? { minimum } : {})
  }
  if (Type.IsString(schema)) return isTimestampString(schema) ? Type.String({ format: 'date-time' }) : Type.String()
  return schema
}

const isEnum = (schema: TSchema) => Type.IsUnion(schema) && (schema.anyOf as TSchema[]).every((o) => Type.IsLiteral(o))
const isTimestampString = (schema: TSchema) =>
  Type.IsString(schema) && (schema as { format?: string }).format === 'date-time'
/** A date-time string, or one that may be null (a time something has not happened yet). */
const isTimestamp = (schema: TSchema) =>
  isTimestampString(schema) ||
  (Type.IsUnion(schema) &&
    (schema.anyOf as TSchema[]).some(isTimestampString) &&
    (schema.anyOf as TSchema[]).every((s) => isTimestampString(s) || Type.IsNull(s)))

/** How a sortable member is compared and filtered, from its schema. */
function memberType(resource: string, member: string, schema: TSchema, traits: MemberTraits): MemberType {
  if (Type.IsInteger(schema)) {
    const { minimum, maximum } = schema as { minimum?: number; maximum?: number }
    if (minimum === undefined || maximum === undefined)
      throw new Error(`${resource}.${member}: a sortable integer needs a minimum and a maximum`)
    return { type: 'integer', minimum, maximum }
  }
  if (isTimestamp(schema)) return { type: 'timestamp' }
  if (Type.IsString(schema)) return traits.caseless ? { type: 'email' } : { type: 'text' }
  if (isEnum(schema)) {
    return {
      type: 'enum',
      values: (schema as unknown as { anyOf: Array<{ const: string }> }).anyOf.map((o) => o.const),
    }
  }
  throw new Error(`${resource}.${member}: only integers, strings, timestamps and enums can be sorted and filtered`)
}
