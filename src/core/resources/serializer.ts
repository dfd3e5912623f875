import Type, { type TObject, type TSchema } from 'typebox'

// A representation's JSON, written by code compiled once from its schema (as
// fast-json-stringify does for Fastify): member names and punctuation are
// literals, and each value is written by the writer of its declared type. No
// object is built per row and nothing walks a row's keys: a page is its rows'
// texts joined. JSON.stringify of the same rows looks keys up per object and
// escapes every string, a large part of what a page costs (bench/README.md).
//
// A writer falls back to JSON.stringify for a value that is not of the
// declared type (null in a nullable member, a Date), so the text is always
// what JSON.stringify would give for the same members in the same order.

type Row = Record<string, unknown>
type Writer = (value: unknown) => string

const anyValue: Writer = (v) => (v === undefined ? 'null' : JSON.stringify(v))

const writers = {
  // Not `${v}`: that goes through V8's number-to-string cache, and on pages of
  // ever-different ids each new string is stored there and outlives the
  // request, to be promoted to the old generation (more memory and more CPU
  // per page; bench/README.md). JSON.stringify
  // writes a number without that cache.
  integer: anyValue,
  // Timestamps come from the driver as RFC 3339 text (src/core/db/timestamps.ts): digits, '-', ':', '.', 'T', 'Z',
  // nothing to escape.
  timestamp: ((v) => (typeof v === 'string' ? `"${v}"` : anyValue(v))) as Writer,
  string: ((v) => (typeof v === 'string' ? JSON.stringify(v) : anyValue(v))) as Writer,
  any: anyValue,
}
type WriterName = keyof typeof writers

function writerOf(schema: TSchema): WriterName {
  if (Type.IsInteger(schema)) return 'integer'
  if (Type.IsString(schema)) return (schema as { format?: string }).format === 'date-time' ? 'timestamp' : 'string'
  // An enumeration of strings (a role): written as any string.
  if (
    Type.IsUnion(schema) &&
    schema.anyOf.every((s) => Type.IsString(s) || (Type.IsLiteral(s) && typeof s.const === 'string'))
  )
    return 'string'
  return 'any'
}

export interface Serializer {
  /** One representation: the schema's members of `row`, in the schema's order. */
  one(row: Row): string
  /** A page: every member, or only `fields` (in the schema's order, as `fields=` chose them). */
  page(rows: readonly Row[], fields?: readonly string[]): string
}

/** Compiles the writer of an object schema's members (a resource's representation). */
export function compileSerializer(representation: TObject): Serializer {
  const members = Object.entries(representation.properties as Record<string, TSchema>).map(([name, schema]) => ({
    name,
    writer: writerOf(schema),
    // The member's name as it is written: `"name":`, JSON-escaped once here.
    key: `${JSON.stringify(name)}:`,
  }))
  const byName = new Map(members.map((m) => [m.name, m]))

  // The names are the declaration's (identifiers checked by the resource), and
  // every literal goes into the code through JSON.stringify: nothing a client
  // sends reaches this text.
  const body = members
    .map((m, i) => `${JSON.stringify((i === 0 ? '{' : ',') + m.key)} + w.${m.writer}(row[${JSON.stringify(m.name)}])`)
    .join(' + ')
  const one = new Function(
    'w',
    `return function writeOne(row) { return ${members.length ? `${body} + '}'` : `'{}'`} }`,
  )(writers) as (row: Row) => string

  function writeFields(row: Row, fields: readonly string[]): string {
    let text = '{'
    for (let i = 0; i < fields.length; i++) {
      const m = byName.get(fields[i]!)!
      text += (i === 0 ? '' : ',') + m.key + writers[m.writer](row[m.name])
    }
    return text + '}'
  }

  return {
    one,
    page(rows, fields) {
      if (fields !== undefined)
        for (const f of fields) if (!byName.has(f)) throw new Error(`serializer: "${f}" is not a member`)
      let text = '['
      for (let i = 0; i < rows.length; i++)
        text += (i === 0 ? '' : ',') + (fields === undefined ? one(rows[i]!) : writeFields(rows[i]!, fields))
      return text + ']'
    },
  }
}
