import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { test } from 'node:test'
import {
  cursorKey,
  decodeCursor,
  encodeCursor,
  sealCursor,
  type CursorKey,
  type CursorPayload,
} from '../src/core/collections/cursor.js'

// Unit tests of the collection cursor: unreadable, tamper-evident, and opened
// under any of several keys (rotation). No server, no database.

const key = cursorKey(randomBytes(32))
const otherKey = cursorKey(randomBytes(32))
const BASE64URL = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'

const payload: CursorPayload = {
  sort: '-price,name,id',
  filter: 'AbCdEfGhIjKlMnOp',
  after: [1999, 'Widget "deluxe" ü ✓', 42],
}

/** A cursor sealed right under `key` but whose plaintext is whatever the caller says. */
const sealed = (plaintext: Buffer | string, k: CursorKey = key) =>
  sealCursor(Buffer.isBuffer(plaintext) ? plaintext : Buffer.from(plaintext, 'utf8'), k)

test('a cursor decodes to the payload it was made from', () => {
  const cursor = encodeCursor(payload, key)
  assert.deepEqual(decodeCursor(cursor, [key]), payload)
})

test('round-trips payloads of every value kind a sort key can have', () => {
  const cases: CursorPayload[] = [
    { sort: 'id', filter: '', after: [1] },
    { sort: 'id', filter: 'x', after: [9007199254740991] },
    { sort: 'created_at,id', filter: 'f', after: ['2026-01-02T03:04:05.678Z', 7] },
    { sort: 'name,id', filter: 'f', after: ['', 3] },
    { sort: 'name,id', filter: 'f', after: ['a.b_c-d %2C,&=<>"\\', 3] },
    { sort: 'price,id', filter: 'f', after: [0, 1] },
    { sort: 'name,id', filter: 'f', after: ['x'.repeat(1500), 2] },
  ]
  for (const p of cases) assert.deepEqual(decodeCursor(encodeCursor(p, key), [key]), p, JSON.stringify(p).slice(0, 80))
})

test('a cursor is URL-safe: only base64url characters', () => {
  const cursor = encodeCursor(payload, key)
  assert.match(cursor, /^[A-Za-z0-9_-]+$/)
  assert.equal(encodeURIComponent(cursor), cursor)
})

test('a cursor does not show its values: neither as text nor in base64 at any alignment', () => {
  const secret = { sort: 'email,id', filter: 'f', after: ['alice.secret@example.com', 17] }
  const cursor = encodeCursor(secret, key)
  const bytes = Buffer.from(cursor, 'base64url')
  assert.ok(!cursor.includes('alice') && !bytes.includes('alice') && !bytes.includes('example.com'))
  for (let shift = 0; shift < 3; shift++) {
    const encoded = Buffer.from('x'.repeat(shift) + 'alice.secret')
      .toString('base64url')
      .slice(4, 12)
    assert.ok(!cursor.includes(encoded), `base64 of the e-mail (alignment ${shift})`)
  }
})

test('changing any single character of a cursor makes it invalid', () => {
  const cursor = encodeCursor(payload, key)
  let tried = 0
  for (let i = 0; i < cursor.length; i++) {
    for (const c of BASE64URL + '.') {
      if (c === cursor[i]) continue
      const tampered = cursor.slice(0, i) + c + cursor.slice(i + 1)
      tried++
      assert.equal(decodeCursor(tampered, [key]), undefined, `position ${i} changed to ${c}: ${tampered}`)
    }
  }
  assert.ok(tried > 60 * cursor.length)
})

test('the last character has no spare spellings', () => {
  // The last base64url character may hold bits beyond the last byte; a
  // decoder that ignores them would accept other spellings of the cursor.
  const cursor = encodeCursor(payload, key)
  const last = cursor.at(-1)!
  const accepted = [...BASE64URL].filter(
    (c) => c !== last && decodeCursor(cursor.slice(0, -1) + c, [key]) !== undefined,
  )
  assert.deepEqual(accepted, [])
})

test('removing or adding a character makes a cursor invalid', () => {
  const cursor = encodeCursor(payload, key)
  for (let i = 0; i < cursor.length; i++) {
    assert.equal(decodeCursor(cursor.slice(0, i) + cursor.slice(i + 1), [key]), undefined, `without position ${i}`)
    assert.equal(decodeCursor(cursor.slice(0, i) + 'A' + cursor.slice(i), [key]), undefined, `A inserted at ${i}`)
  }
})

test('a cursor made under another key does not open', () => {
  const cursor = encodeCursor(payload, otherKey)
  assert.equal(decodeCursor(cursor, [key]), undefined)
  assert.equal(decodeCursor(cursor, []), undefined)
})

test('a cursor made under an older key still opens while that key is in the list (rotation)', () => {
  const old = encodeCursor(payload, otherKey)
  assert.deepEqual(decodeCursor(old, [key, otherKey]), payload)
  // And the new first key's cursors verify too.
  assert.deepEqual(decodeCursor(encodeCursor(payload, key), [key, otherKey]), payload)
  // Once the old key is dropped, its cursors stop working.
  assert.equal(decodeCursor(old, [key]), undefined)
})

test('the same payload under the same key gives the same cursor; a different payload a different one', () => {
  assert.equal(encodeCursor(payload, key), encodeCursor({ ...payload, after: [...payload.after] }, key))
  assert.notEqual(
    encodeCursor(payload, key),
    encodeCursor({ ...payload, after: [1999, 'Widget "deluxe" ü ✓', 43] }, key),
  )
  assert.notEqual(encodeCursor(payload, key), encodeCursor({ ...payload, sort: 'price,name,id' }, key))
  assert.notEqual(encodeCursor(payload, key), encodeCursor({ ...payload, filter: 'other' }, key))
})

test('garbage returns undefined without throwing', () => {
  const valid = encodeCursor(payload, key)
  const garbage: Array<[string, string]> = [
    ['empty', ''],
    ['a dot', '.'],
    ['a dot appended', `${valid}.`],
    ['two cursors joined by a dot', `${valid}.${valid}`],
    ['the first character removed', valid.slice(1)],
    ['a character appended', `${valid}A`],
    ['standard base64 characters', `${valid.slice(0, -2)}+/`],
    ['padding', `${valid}==`],
    ['spaces', ` ${valid} `],
    ['non-ASCII', `${valid.slice(0, 10)}ü${valid.slice(10)}`],
    ['NUL', `${valid}\u0000`],
    ['lone surrogate', `${valid}\ud800`],
    ['too short to hold a nonce and a tag', valid.slice(0, 30)],
    ['very long data', 'A'.repeat(5000)],
    ['very long garbage', 'x'.repeat(100_000)],
    ['the word null', 'null'],
    ['JSON text', JSON.stringify(payload)],
    ['percent-encoded', encodeURIComponent(valid + '=')],
  ]
  for (const [what, input] of garbage) {
    assert.doesNotThrow(() => decodeCursor(input, [key]), what)
    assert.equal(decodeCursor(input, [key]), undefined, what)
  }
})

test('a correctly sealed cursor whose payload is not the expected shape returns undefined', () => {
  const shapes: Array<[string, string]> = [
    ['not JSON', 'not json at all'],
    ['truncated JSON', '["id","f",[1'],
    ['null', 'null'],
    ['a number', '42'],
    ['a string', '"id"'],
    ['an object', '{"sort":"id","filter":"f","after":[1]}'],
    ['empty array', '[]'],
    ['sort not a string', '[1,"f",[1]]'],
    ['filter not a string', '["id",null,[1]]'],
    ['after not an array', '["id","f",1]'],
    ['after holds null', '["id","f",[null]]'],
    ['after holds an object', '["id","f",[{"a":1}]]'],
    ['after holds an array', '["id","f",[[1]]]'],
    ['after holds a boolean', '["id","f",[true]]'],
    ['invalid UTF-8', '\u00ff'],
  ]
  for (const [what, json] of shapes) {
    const cursor = sealed(what === 'invalid UTF-8' ? Buffer.from([0xff, 0xfe, 0x22]) : json)
    assert.doesNotThrow(() => decodeCursor(cursor, [key]), what)
    assert.equal(decodeCursor(cursor, [key]), undefined, what)
  }
  // The helper itself makes cursors that open: the cases above fail on their shape, not their tag.
  assert.deepEqual(decodeCursor(sealed('["id","f",[1]]'), [key]), { sort: 'id', filter: 'f', after: [1] })
})
