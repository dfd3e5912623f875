import assert from 'node:assert/strict'
import { after, test } from 'node:test'
import type { Sql } from 'postgres'
import Type, { type TSchema } from 'typebox'
import { connect } from '../src/core/db/connect.js'
import { idMember, nameSchema, timestampMember } from '../src/core/resources/common.js'
import { member, traitsOf } from '../src/core/resources/member.js'
import { defineResource, type Resource } from '../src/core/resources/resource.js'
import { categories, categoriesMigration } from './helpers/categories.js'
import { applicationRegistry } from './helpers/registry.js'
import { createTestDatabase } from './helpers/server.js'

// Each declaration held against the migrated schema, read from
// information_schema and pg_catalog: every stored member is a column of a
// type its schema fits, NULL is allowed exactly where the declaration lets a
// member be null, a declared default is the column's default, each declared
// unique constraint exists under its name on its column, and the table has no
// column the declaration does not know (its serverColumns and `version` aside).

const sql: Sql = connect(await createTestDatabase(), { max: 1, statementTimeoutMs: 60_000 })
after(() => sql.end())
await sql.unsafe(categoriesMigration)

interface Column {
  column_name: string
  data_type: string
  udt_name: string
  is_nullable: 'YES' | 'NO'
  column_default: string | null
}

const isNull = (s: TSchema) => Type.IsNull(s)
const withoutNull = (s: TSchema): TSchema => {
  if (!Type.IsUnion(s)) return s
  const rest = (s.anyOf as TSchema[]).filter((o) => !isNull(o))
  return rest.length === 1 ? rest[0]! : Type.Union(rest)
}

/** The column types a member's schema may be stored as (udt names: int8, _text, …). */
function storedAs(schema: TSchema): string[] {
  const s = withoutNull(schema)
  if (Type.IsInteger(s)) return ['int2', 'int4', 'int8']
  if (Type.IsNumber(s)) return ['numeric', 'float8', 'float4']
  if (Type.IsBoolean(s)) return ['bool']
  if (Type.IsString(s))
    return (s as { format?: string }).format === 'date-time' ? ['timestamptz'] : ['text', 'citext', 'varchar']
  // A union of string literals or an enum: text with a CHECK, or an enum type (its own udt name).
  if (Type.IsUnion(s) || Type.IsEnum(s)) return ['text', 'varchar', 'enum']
  if (Type.IsArray(s)) return storedAs(s.items as TSchema).map((t) => `_${t}`)
  return []
}

/**
 * Whether the declaration lets the stored value be NULL: a null in its schema, or optional or nullable with no default
 * to fall back on.
 */
function mayBeNull(schema: TSchema): boolean {
  const t = traitsOf(schema)
  const nullInSchema = Type.IsUnion(schema) && (schema.anyOf as TSchema[]).some(isNull)
  return nullInSchema || (t.default === undefined && (t.optional === true || t.nullable === true))
}

/** A column default as the value it gives: `'user'::text` is user, `0` is 0. */
const defaultValue = (text: string) =>
  text
    .replace(/::[a-z ]+(\[\])?$/, '')
    .replace(/^'(.*)'$/s, '$1')
    .replaceAll("''", "'")

async function disagreements(resource: Resource): Promise<string[]> {
  const table = resource.table
  const columns = await sql<Column[]>`
    SELECT column_name, data_type, udt_name, is_nullable, column_default FROM information_schema.columns
    WHERE table_schema = current_schema() AND table_name = ${table}`
  if (columns.length === 0) return [`${table}: no such table`]
  const enums = new Set(
    (await sql<Array<{ typname: string }>>`SELECT typname FROM pg_type WHERE typtype = 'e'`).map((r) => r.typname),
  )
  const byName = new Map(columns.map((c) => [c.column_name, c]))
  const found: string[] = []
  const stored = Object.entries(resource.members).filter(([, s]) => !traitsOf(s).virtual)
  for (const [name, schema] of stored) {
    const column = byName.get(name)
    if (!column) {
      found.push(`${table}.${name}: declared, but no such column`)
      continue
    }
    const udt = enums.has(column.udt_name) ? 'enum' : column.udt_name
    const allowed = storedAs(schema)
    if (!allowed.includes(udt))
      found.push(`${table}.${name}: column is ${column.udt_name}, the declaration wants one of ${allowed.join(', ')}`)
    const nullable = column.is_nullable === 'YES'
    if (nullable !== mayBeNull(schema))
      found.push(
        `${table}.${name}: column ${nullable ? 'allows' : 'refuses'} NULL, the ` +
          `declaration ${mayBeNull(schema) ? 'allows' : 'refuses'} it`,
      )
    const declared = traitsOf(schema).default
    if (
      declared !== undefined &&
      (column.column_default === null || defaultValue(column.column_default) !== String(declared))
    ) {
      found.push(
        `${table}.${name}: declared default ${JSON.stringify(declared)}, column default ${column.column_default}`,
      )
    }
  }
  const known = new Set([
    ...stored.map(([n]) => n),
    ...resource.serverColumns,
    ...(resource.versioned ? ['version'] : []),
  ])
  for (const column of columns)
    if (!known.has(column.column_name))
      found.push(`${table}.${column.column_name}: a column the declaration does not know`)
  if (resource.versioned && !byName.has('version')) found.push(`${table}: versioned, but no version column`)
  for (const s of resource.serverColumns)
    if (!byName.has(s)) found.push(`${table}.${s}: a declared server column that does not exist`)

  // A unique constraint is backed by a unique index of its name; an expression index (lower(email)) counts when it is
  // on the column.
  for (const [constraint, { member: label }] of resource.uniqueCodes) {
    const column = label.replaceAll(' ', '_')
    const [index] = await sql<Array<{ definition: string; is_unique: boolean }>>`
      SELECT pg_get_indexdef(i.indexrelid) AS definition, i.indisunique AS is_unique
      FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
      WHERE c.relname = ${constraint} AND t.relname = ${table}`
    if (!index?.is_unique) found.push(`${table}: no unique constraint ${constraint}`)
    else if (!new RegExp(`\\(\\s*(lower\\()?${column}\\)?\\s*\\)`).test(index.definition))
      found.push(`${table}: ${constraint} is not on ${column} (${index.definition})`)
  }
  return found
}

for (const resource of [...applicationRegistry.resources, categories]) {
  test(
    `the ${resource.label} declaration matches its ` +
      `table ${resource.table}: members, types, NULL, defaults, uniques, no unknown column`,
    async () => {
      assert.deepEqual(await disagreements(resource), [])
    },
  )
}

test('a declaration that disagrees with its migration is caught, each disagreement named', async () => {
  const wrong = defineResource({
    name: 'Category',
    path: '/categories',
    table: 'categories',
    access: { read: 'any', write: 'admin' },
    members: {
      id: idMember(),
      // A unique constraint under another name, and optional although the column is NOT NULL.
      name: member(nameSchema(), {
        optional: true,
        unique: {
          constraint: 'categories_title_key',
          code: 'category_name_taken',
          title: 'Category name already in use',
        },
      }),
      // An integer where the column is text, with a default the column does not have.
      description: member(Type.Integer({ minimum: 0 }), { default: 7 }),
      // No such column.
      colour: member(Type.String()),
      created_at: timestampMember(),
      // updated_at left out: a column the declaration does not know.
    },
  })
  assert.deepEqual((await disagreements(wrong)).sort(), [
    'categories.colour: declared, but no such column',
    // The table has a trash; a declaration without `trash: true` does not know its column.
    'categories.deleted_at: a column the declaration does not know',
    'categories.description: column is text, the declaration wants one of int2, int4, int8',
    "categories.description: declared default 7, column default ''::text",
    'categories.name: column refuses NULL, the declaration allows it',
    'categories.updated_at: a column the declaration does not know',
    'categories: no unique constraint categories_title_key',
  ])
})
