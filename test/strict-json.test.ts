import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { JsonSyntaxError, parseStrictJson } from '../src/core/http/strict-json.js'

// The strict parser alone: it must agree with JSON.parse on every valid
// document, and refuse what JSON.parse accepts but the API must not.

describe('valid documents', () => {
  const valid = [
    '{}',
    '[]',
    '0',
    '-0',
    '12',
    '-3.25e-2',
    '1E+2',
    '0.5',
    'true',
    'false',
    'null',
    '""',
    '"plain"',
    ' \t\r\n{ "a" : 1 , "b" : [ 1 , 2 ] } \n',
    '{"name":"Ann","tags":["a","b"],"n":null,"ok":true,"nested":{"deep":[{"x":-1.5}]}}',
    String.raw`"\" \\ \/ \b \f \n \r \t"`,
    String.raw`"\u00e9\u20AC\ud83d\ude00"`,
    '"é€😀 raw unicode, DEL \u007f and U+2028 \u2028"',
    String.raw`{"a":"\u0000"}`, // NUL is valid JSON; validation refuses it later
    String.raw`"\ud800"`, // so is a lone surrogate escape
    '{"constructor":1,"toString":2,"hasOwnProperty":3}',
    '{"a":{"a":{"a":1}}}', // the same name at different levels is no duplicate
    '[{"a":1},{"a":2}]',
    '123456789012345678901234567890',
    '1e400', // JSON.parse gives Infinity too; validation turns it into a 422
    '-1e400',
    '['.repeat(64) + ']'.repeat(64), // 64 levels: the most allowed
    '['.repeat(64) + '1' + ']'.repeat(64), // a scalar adds no level
    '{"a":'.repeat(63) + '{}' + '}'.repeat(63),
  ]
  for (const text of valid) {
    test(
      `parses ${JSON.stringify(text.length > 60 ? text.slice(0, 60) + '…' : text)} exactly as JSON.parse ` + `does`,
      () => {
        assert.deepEqual(parseStrictJson(text), JSON.parse(text))
      },
    )
  }

  test('parses 1e400 to Infinity', () => {
    assert.equal(parseStrictJson('{"price":1e400}') instanceof Object, true)
    assert.equal((parseStrictJson('{"price":1e400}') as { price: number }).price, Infinity)
  })

  test('gives objects an ordinary prototype and only own members', () => {
    const value = parseStrictJson('{"toString":"x"}') as Record<string, unknown>
    assert.equal(Object.getPrototypeOf(value), Object.prototype)
    assert.deepEqual(Object.keys(value), ['toString'])
  })
})

describe('refused documents', () => {
  const invalid: Array<[string, string, RegExp?]> = [
    ['empty text', '', /end of input/],
    ['only white space', '  \n ', /end of input/],
    ['duplicate member', '{"a":1,"a":2}', /duplicate member "a"/],
    ['duplicate member spelt with an escape', String.raw`{"a":1,"\u0061":2}`, /duplicate member "a"/],
    ['duplicate member in a nested object', '{"x":{"b":1,"b":1}}', /duplicate/],
    ['__proto__ member', '{"__proto__":{"admin":true}}', /__proto__/],
    ['__proto__ member spelt with an escape', String.raw`{"\u005f_proto__":{}}`, /__proto__/],
    ['nested __proto__ member', '[{"a":{"__proto__":null}}]', /__proto__/],
    ['trailing data', '{"a":1} x', /after the JSON value/],
    ['two documents', '{}{}', /after the JSON value/],
    ['trailing comma in an object', '{"a":1,}', /member name/],
    ['trailing comma in an array', '[1,]', /unexpected token/],
    ['missing colon', '{"a" 1}', /':'/],
    ['missing comma', '[1 2]', /','/],
    ['unquoted member name', '{a:1}', /member name/],
    ['single quotes', "{'a':1}", /member name/],
    ['unterminated string', '"abc', /unterminated/],
    ['unterminated object', '{"a":1', /','|end of input/],
    ['unterminated array', '[1,2', /','|end of input/],
    ['backslash at the end', '"abc\\', /unterminated/],
    ['unknown escape', String.raw`"\x41"`, /escape/],
    ['short unicode escape', String.raw`"\u12"`, /escape/],
    ['non-hex unicode escape', String.raw`"\u12G4"`, /escape/],
    ['escaped raw control character', '"\\\u0001"', /escape/],
    ['raw tab in a string', '"a\tb"', /control character/],
    ['raw line feed in a string', '"a\nb"', /control character/],
    ['raw NUL in a string', '"a\u0000b"', /control character/],
    ['raw control character in a member name', '{"a\u001f":1}', /control character/],
    ['leading zero', '01', /after the JSON value/],
    ['leading zero in an array', '[00]', /','/],
    ['negative leading zero', '-01', /after the JSON value/],
    ['leading plus', '+1', /unexpected token/],
    ['bare minus', '-', /invalid number/],
    ['leading decimal point', '.5', /unexpected token/],
    ['trailing decimal point', '1.', /after the JSON value/],
    ['exponent without digits', '1e', /after the JSON value/],
    ['hexadecimal', '0x10', /after the JSON value/],
    ['NaN', 'NaN', /unexpected token/],
    ['Infinity', 'Infinity', /unexpected token/],
    ['-Infinity', '-Infinity', /invalid number/],
    ['NaN as a value', '{"price":NaN}', /unexpected token/],
    ['truncated literal', 'tru', /unexpected token/],
    ['capitalized literal', 'True', /unexpected token/],
    ['undefined', 'undefined', /unexpected token/],
    ['comment', '{"a":1 /* c */}', /','/],
    ['form feed as white space', '\f{}', /unexpected token/],
    ['no-break space as white space', '\u00a0{}', /unexpected token/],
    ['byte order mark', '\ufeff{}', /unexpected token/],
    ['65 levels of empty arrays', '['.repeat(65) + ']'.repeat(65), /nesting deeper than 64/],
    ['65 levels of arrays around a scalar', '['.repeat(65) + '1' + ']'.repeat(65), /nesting deeper than 64/],
    ['65 levels of objects', '{"a":'.repeat(64) + '{}' + '}'.repeat(64), /nesting deeper than 64/],
  ]
  for (const [what, text, message] of invalid) {
    test(`throws JsonSyntaxError for ${what}`, () => {
      assert.throws(
        () => parseStrictJson(text),
        (err: unknown) => {
          assert.ok(err instanceof JsonSyntaxError, `expected JsonSyntaxError, got ${String(err)}`)
          if (message) assert.match(err.message, message)
          assert.match(err.message, /at position [0-9]+$/)
          return true
        },
      )
    })
  }

  test('throws JsonSyntaxError, not a stack overflow, for 100000 nested arrays', () => {
    for (const text of ['['.repeat(100_000), '['.repeat(100_000) + ']'.repeat(100_000), '{"a":'.repeat(100_000)]) {
      assert.throws(
        () => parseStrictJson(text),
        (err: unknown) => err instanceof JsonSyntaxError && /nesting/.test(err.message),
      )
    }
  })
})
