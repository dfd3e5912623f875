import { HttpError, invalidParameter } from './problem.js'
import { UNKNOWN_MEMBER, type Validator } from './validate.js'

/**
 * Splits a raw query string into name → value. Stricter than URLSearchParams,
 * which silently turns bad percent-escapes into U+FFFD and lets the last of
 * several equal names win: here both are a 400, as is a control character.
 */
export function parseQueryString(raw: string): Record<string, string> {
  const out: Record<string, string> = Object.create(null)
  if (raw === '') return out
  for (const pair of raw.split('&')) {
    if (pair === '') continue
    const eq = pair.indexOf('=')
    const name = decode(eq === -1 ? pair : pair.slice(0, eq), 'a parameter name')
    const value = decode(eq === -1 ? '' : pair.slice(eq + 1), name)
    if (name in out) throw invalidParameter(name, 'must be given at most once')
    // eslint-disable-next-line no-control-regex
    if (/[\u0000-\u001f\u007f]/.test(value)) throw invalidParameter(name, 'must not contain control characters')
    out[name] = value
  }
  return out
}

function decode(text: string, what: string): string {
  try {
    const decoded = decodeURIComponent(text.replaceAll('+', ' '))
    if (decoded.isWellFormed()) return decoded
  } catch {
    // fall through
  }
  throw new HttpError('invalid_parameter', `${what}: is not valid percent-encoded UTF-8`, {
    errors: [{ path: what, message: 'is not valid percent-encoded UTF-8' }],
  })
}

/**
 * Applies a route's query schema; body-style field errors become 400s naming
 * the parameter. A parameter (or a list's item) whose schema describes itself
 * is answered with that description, which names the whole rule in a
 * client's words ("an integer from 1 to 200"), whichever part of it failed.
 */
export function checkQuery<Q>(validator: Validator<Q> | undefined, query: Record<string, string>): Q {
  if (!validator) {
    const first = Object.keys(query)[0]
    if (first !== undefined) throw invalidParameter(first, 'is not a parameter of this endpoint', 'unknown_parameter')
    return {} as Q
  }
  const {
    value,
    errors: [first],
  } = validator.check(query)
  if (!first) return value
  // The parameter is the first step of the pointer; an item of a list (`id[in]/3`) is reported as its list.
  const [param = '', item] = first.path.slice(1).split('/')
  const name = param.replaceAll('~1', '/').replaceAll('~0', '~')
  if (first.message === UNKNOWN_MEMBER)
    throw invalidParameter(name, 'is not a parameter of this endpoint', 'unknown_parameter')
  const schema = (validator.schema as { properties?: Record<string, { items?: unknown; description?: string }> })
    .properties?.[name]
  const { description } = ((item === undefined ? schema : schema?.items) ?? {}) as { description?: string }
  throw invalidParameter(name, description ? `must be ${description}` : first.message)
}
