import type { Static, TSchema } from 'typebox'
import { Compile } from 'typebox/compile'
import Format from 'typebox/format'
import { isApiDateTime } from './date-time.js'
import { validationFailed, type FieldError } from './problem.js'

// The one way input is checked: a TypeBox schema compiled once, when the
// module that declares it loads, and errors turned into JSON Pointer paths
// with messages a client can act on (one per member, the first found).

export interface Validator<T> {
  readonly schema: TSchema
  /** Field errors, or an empty list when the value conforms. */
  errors(value: unknown): FieldError[]
  /** The value typed, or a 422 `validation_failed`. */
  parseBody(value: unknown): T
  /** The value read from its wire form (`fromWire`) and checked: typed, or its field errors. */
  check(value: unknown): { value: T; errors: FieldError[] }
}

export interface ValidatorOptions {
  /**
   * Reads a value from the form it travels in (query parameters are text)
   * into the form the schema describes, before the one check.
   */
  fromWire?: (value: unknown) => unknown
  /** String formats the schema uses beyond TypeBox's own (ISO 4217 currency codes, say), each with its check. */
  formats?: Readonly<Record<string, FormatCheck>>
}

/** Whether a string is of a format. */
export type FormatCheck = (value: string) => boolean

/**
 * What a format means in every schema of the API: one date-time, stricter than TypeBox's (src/core/http/date-time.ts).
 */
const apiFormats: Readonly<Record<string, FormatCheck>> = { 'date-time': isApiDateTime }

export function compileValidator<S extends TSchema>(schema: S, options: ValidatorOptions = {}): Validator<Static<S>> {
  const declared = { ...apiFormats, ...options.formats }
  const named = [...formatsNamedIn(schema)]
  const unknown = named.filter((name) => !(name in declared) && !Format.Has(name))
  if (unknown.length)
    throw new Error(`string format "${unknown[0]}" has no check: declare it with the schema (ValidatorOptions.formats)`)
  // Only the formats this schema names are lent; a schema that names none leaves the table alone.
  const formats = Object.fromEntries(named.filter((name) => name in declared).map((name) => [name, declared[name]!]))
  const compiled = withFormats(formats, () => Compile(schema))
  const errors = (value: unknown): FieldError[] => {
    if (hasUnstorableString(value)) return findUnstorableStrings(value)
    if (compiled.Check(value)) return []
    const raw = withFormats(formats, () => compiled.Errors(value))
    const described = describeErrors(schema, raw)
    if (described.length) return described
    // TypeBox reports at most eight errors: for a union of more literals, the
    // eight are the alternatives' `const` misses (described by the union's
    // own error, which did not fit). A value Check refused is never accepted
    // for want of words.
    return [{ path: raw[0]?.instancePath ?? '', message: 'has an invalid value' }]
  }
  const { fromWire } = options
  return {
    schema,
    errors,
    parseBody(value) {
      const found = errors(value)
      if (found.length) throw validationFailed(found)
      return value as Static<S>
    },
    check(value) {
      const typed = fromWire ? fromWire(value) : value
      return { value: typed as Static<S>, errors: errors(typed) }
    },
  }
}

/**
 * TypeBox's format table is process-wide: a compiled check takes each
 * format's function when it is compiled (a format it does not know, it lets
 * pass), and the description of errors looks them up when it runs. So a
 * schema's formats are set in the table only while it compiles or describes
 * (both synchronous), and the table is left as TypeBox made it: what a
 * format means belongs to the schema that names it, and two services in one
 * process never see each other's.
 */
function withFormats<T>(formats: Readonly<Record<string, FormatCheck>>, run: () => T): T {
  if (Object.keys(formats).length === 0) return run()
  const before = Format.Entries()
  try {
    for (const [name, check] of Object.entries(formats)) Format.Set(name, check)
    return run()
  } finally {
    Format.Clear()
    for (const [name, check] of before) Format.Set(name, check)
  }
}

function formatsNamedIn(node: unknown, found = new Set<string>()): Set<string> {
  if (Array.isArray(node)) for (const item of node) formatsNamedIn(item, found)
  else if (typeof node === 'object' && node !== null) {
    for (const [key, value] of Object.entries(node)) {
      if (key === 'format' && typeof value === 'string') found.add(value)
      else formatsNamedIn(value, found)
    }
  }
  return found
}

export const UNKNOWN_MEMBER = 'is not a known member'

interface TypeBoxError {
  keyword: string
  schemaPath: string
  instancePath: string
  params: Record<string, unknown>
  message: string
}

function describeErrors(root: TSchema, raw: readonly TypeBoxError[]): FieldError[] {
  const byPath = new Map<string, string>()
  const add = (path: string, message: string) => byPath.has(path) || byPath.set(path, message)
  for (const e of raw) {
    const at = schemaAt(root, e.schemaPath)
    switch (e.keyword) {
      case 'required':
        for (const name of e.params.requiredProperties as string[])
          add(`${e.instancePath}/${escapePointer(name)}`, 'is required')
        break
      case 'additionalProperties':
        for (const name of e.params.additionalProperties as string[])
          add(`${e.instancePath}/${escapePointer(name)}`, UNKNOWN_MEMBER)
        break
      case 'boolean': // the `false` schema behind additionalProperties, reported above
        break
      case 'const':
        if (!e.schemaPath.includes('/anyOf/')) add(e.instancePath, `must be ${JSON.stringify(e.params.allowedValue)}`)
        break
      case 'anyOf': {
        const options = (at?.anyOf as TSchema[] | undefined)?.map((s) => (s as { const?: unknown }).const)
        add(
          e.instancePath,
          options?.every((o) => o !== undefined)
            ? `must be one of ${options.map((o) => JSON.stringify(o)).join(', ')}`
            : 'has an invalid value',
        )
        break
      }
      case 'type':
        add(e.instancePath, `must be ${article(String(e.params.type))}`)
        break
        break
      case 'minLength':
        add(e.instancePath, `must be at least ${e.params.limit} characters`)
        break
      case 'maxLength':
        add(e.instancePath, `must be at most ${e.params.limit} characters`)
        break
      case 'minimum':
      case 'maximum':
        add(e.instancePath, `must be ${e.keyword === 'minimum' ? 'at least' : 'at most'} ${e.params.limit}`)
        break
      case 'minItems':
      case 'maxItems':
        add(e.instancePath, `must have ${e.keyword === 'minItems' ? 'at least' : 'at most'} ${e.params.limit} items`)
        break
      case 'uniqueItems':
        add(e.instancePath, 'must not repeat items')
        break
      default: {
        // pattern, format: the schema's description says what is expected.
        const description = (at as { description?: string } | undefined)?.description
        add(e.instancePath, description ? `must be ${description}` : e.message)
      }
    }
  }
  return [...byPath].map(([path, message]) => ({ path, message }))
}

const article = (type: string) =>
  type === 'integer' || type === 'object' || type === 'array' ? `an ${type}` : `a ${type}`

const escapePointer = (name: string) => name.replaceAll('~', '~0').replaceAll('/', '~1')

function schemaAt(root: TSchema, schemaPath: string): Record<string, unknown> | undefined {
  let node: unknown = root
  for (const part of schemaPath.replace(/^#\/?/, '').split('/').filter(Boolean)) {
    node = (node as Record<string, unknown> | undefined)?.[part.replaceAll('~1', '/').replaceAll('~0', '~')]
  }
  return node as Record<string, unknown> | undefined
}

/**
 * Whether `value` holds a string findUnstorableStrings would refuse: the look
 * every body gets, which builds no pointer (a batch's body has thousands of
 * members, and almost every body has no such string).
 */
function hasUnstorableString(value: unknown): boolean {
  if (typeof value === 'string') return value.includes('\u0000') || !value.isWellFormed()
  if (value === null || typeof value !== 'object') return false
  for (const key of Object.keys(value)) {
    if (hasUnstorableString(key) || hasUnstorableString((value as Record<string, unknown>)[key])) return true
  }
  return false
}

/**
 * Strings PostgreSQL cannot store as text (U+0000) or that are not Unicode
 * (lone surrogates, which would be silently replaced on the way to UTF-8).
 * Checked for every string, member names included, before the schema.
 */
function findUnstorableStrings(value: unknown, path = ''): FieldError[] {
  if (typeof value === 'string') {
    if (value.includes('\u0000')) return [{ path, message: 'must not contain NUL characters' }]
    if (!value.isWellFormed()) return [{ path, message: 'must be valid Unicode (no lone surrogates)' }]
    return []
  }
  if (value === null || typeof value !== 'object') return []
  const found: FieldError[] = []
  for (const [key, member] of Object.entries(value)) {
    const memberPath = `${path}/${escapePointer(key)}`
    if (key.includes('\u0000') || !key.isWellFormed())
      found.push({ path: memberPath, message: 'member name must be valid Unicode without NUL' })
    else found.push(...findUnstorableStrings(member, memberPath))
  }
  return found
}
