// A JSON parser (RFC 8259) that refuses what JSON.parse quietly accepts but a
// careful API must not: duplicate member names (which one wins differs between
// parsers, a classic smuggling vector) and `__proto__` members (prototype
// pollution once the object is spread or merged). It also caps nesting so a
// body of 100,000 `[` cannot exhaust the stack. Strings and numbers are decoded
// by JSON.parse itself on their exact source text, so escapes and number
// rounding match the platform (strings only when they hold an escape).

export class JsonSyntaxError extends Error {}

const MAX_DEPTH = 64

export function parseStrictJson(text: string): unknown {
  let pos = 0

  const fail = (what: string): never => {
    throw new JsonSyntaxError(`${what} at position ${pos}`)
  }
  const skipWhitespace = () => {
    for (;;) {
      const c = text.charCodeAt(pos)
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) pos++
      else return
    }
  }
  const parseString = (): string => {
    const start = pos
    let escaped = false
    pos++ // opening quote
    for (;;) {
      const c = text.charCodeAt(pos)
      if (c === 0x22) break
      if (c === 0x5c) {
        escaped = true
        pos += 2
      } else if (Number.isNaN(c)) fail('unterminated string')
      else if (c < 0x20) fail('control character in string')
      else pos++
    }
    pos++
    // Without an escape, the text between the quotes is the string itself (control characters were refused above):
    // JSON.parse is needed only to decode escapes, and a call per string was most of a body's parse.
    if (!escaped) return text.slice(start + 1, pos - 1)
    try {
      return JSON.parse(text.slice(start, pos)) as string
    } catch {
      return fail('invalid escape in string')
    }
  }
  const numberPattern = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y
  const parseNumber = (): number => {
    numberPattern.lastIndex = pos
    const match = numberPattern.exec(text)
    if (!match) return fail('invalid number')
    pos += match[0].length
    return Number(match[0])
  }
  const parseLiteral = <T>(word: string, value: T): T => {
    if (!text.startsWith(word, pos)) fail('unexpected token')
    pos += word.length
    return value
  }
  const parseValue = (depth: number): unknown => {
    skipWhitespace()
    const c = text[pos]
    // `depth` is the number of arrays and objects already open. Counting only
    // containers (a scalar adds no level) makes the limit exact: 64 nested
    // levels parse, a 65th is refused. (Counting every value would make the
    // limit depend on whether the innermost level holds a scalar.)
    if ((c === '{' || c === '[') && depth >= MAX_DEPTH) fail(`nesting deeper than ${MAX_DEPTH}`)
    if (c === '{') return parseObject(depth)
    if (c === '[') return parseArray(depth)
    if (c === '"') return parseString()
    if (c === 't') return parseLiteral('true', true)
    if (c === 'f') return parseLiteral('false', false)
    if (c === 'n') return parseLiteral('null', null)
    if (c === '-' || (c !== undefined && c >= '0' && c <= '9')) return parseNumber()
    return fail(c === undefined ? 'unexpected end of input' : 'unexpected token')
  }
  const parseArray = (depth: number): unknown[] => {
    pos++
    const out: unknown[] = []
    skipWhitespace()
    if (text[pos] === ']') return (pos++, out)
    for (;;) {
      out.push(parseValue(depth + 1))
      skipWhitespace()
      if (text[pos] === ',') pos++
      else if (text[pos] === ']') return (pos++, out)
      else fail("expected ',' or ']'")
    }
  }
  const parseObject = (depth: number): Record<string, unknown> => {
    pos++
    const out: Record<string, unknown> = {}
    skipWhitespace()
    if (text[pos] === '}') return (pos++, out)
    for (;;) {
      skipWhitespace()
      if (text[pos] !== '"') fail('expected a member name')
      const key = parseString()
      if (key === '__proto__') fail('member "__proto__" is not allowed')
      if (Object.hasOwn(out, key)) fail(`duplicate member ${JSON.stringify(key)}`)
      skipWhitespace()
      if (text[pos] !== ':') fail("expected ':'")
      pos++
      out[key] = parseValue(depth + 1)
      skipWhitespace()
      if (text[pos] === ',') pos++
      else if (text[pos] === '}') return (pos++, out)
      else fail("expected ',' or '}'")
    }
  }

  const value = parseValue(0)
  skipWhitespace()
  if (pos !== text.length) fail('unexpected data after the JSON value')
  return value
}
