import assert from 'node:assert/strict'
import { test } from 'node:test'
import Type from 'typebox'
import { isoTimestamp } from '../src/core/db/timestamps.js'
import { products } from '../src/products/resource.js'
import { compileSerializer } from '../src/core/resources/serializer.js'
import { users } from '../src/users/resource.js'

// The compiled serializer must write exactly what JSON.stringify writes for
// the same members in the same order, whatever the values hold.

const representation = Type.Object({
  id: Type.Integer(),
  name: Type.String(),
  role: Type.Union([Type.Literal('admin'), Type.Literal('user')]),
  stock: Type.Union([Type.Integer(), Type.Null()]),
  tags: Type.Array(Type.String()),
  created_at: Type.String({ format: 'date-time' }),
})
const serializer = compileSerializer(representation)
const order = Object.keys(representation.properties)
const reference = (row: Record<string, unknown>, fields = order) =>
  JSON.stringify(Object.fromEntries(fields.map((f) => [f, row[f]])))

const hostile = [
  'plain',
  '',
  'quote " backslash \\ slash /',
  'control \u0000 \u0001 \u001f \n \r \t \b \f',
  'line separators \u2028 \u2029',
  'lone surrogates \ud800 \udfff and a pair \ud83d\ude00',
  '<script>alert(1)</script>',
  'ünïcödé 日本語',
  'x'.repeat(100_000),
]
const row = (name: string, extra: Record<string, unknown> = {}) => ({
  id: 7,
  name,
  role: 'admin',
  stock: 3,
  tags: [name, 'b'],
  created_at: '2026-11-22T10:15:30.120Z',
  version: 9,
  password_hash: 'secret',
  ...extra,
})

test('one row: the same text as JSON.stringify for every hostile string, and only the declared members', () => {
  for (const name of hostile) {
    const r = row(name)
    assert.equal(serializer.one(r), reference(r))
    assert.deepEqual(JSON.parse(serializer.one(r)), JSON.parse(reference(r)))
    assert.doesNotMatch(serializer.one(r), /secret|version/)
  }
})

test('values not of the declared type are written as JSON.stringify writes them', () => {
  const odd = [
    { stock: null },
    { stock: undefined },
    { id: Number.NaN },
    { id: Infinity },
    { id: -0 },
    { id: 2 ** 53 + 2 },
    { created_at: new Date('2026-11-22T10:15:30.120Z') },
    { created_at: null },
    { role: 'user' },
    { tags: [] },
    { name: 42 },
  ]
  for (const extra of odd) {
    const r = row('n', extra)
    // undefined becomes null (a member is never dropped), as JSON.stringify writes it inside an array.
    const expected = reference({
      ...r,
      ...Object.fromEntries(Object.entries(extra).map(([k, v]) => [k, v === undefined ? null : v])),
    })
    assert.equal(serializer.one(r), expected, JSON.stringify(Object.keys(extra)))
  }
})

test('a page: every row, or only the chosen fields in the schema order; an empty page is []', () => {
  const rows = hostile.map((name, i) => row(name, { id: i + 1 }))
  assert.equal(serializer.page(rows), `[${rows.map((r) => reference(r)).join(',')}]`)
  assert.equal(serializer.page([]), '[]')
  assert.equal(
    serializer.page(rows, ['id', 'created_at']),
    `[${rows.map((r) => reference(r, ['id', 'created_at'])).join(',')}]`,
  )
  assert.equal(serializer.page(rows.slice(0, 1), ['name']), `[${reference(rows[0]!, ['name'])}]`)
  assert.throws(() => serializer.page(rows, ['password_hash']), /not a member/)
})

test('a member name that needs escaping is written escaped, and cannot inject code', () => {
  const odd = compileSerializer(Type.Object({ 'a"b': Type.String(), "c'); throw 1; ('": Type.Integer() }))
  const r = { 'a"b': 'x', "c'); throw 1; ('": 1 }
  assert.equal(odd.one(r), JSON.stringify(r))
  assert.equal(compileSerializer(Type.Object({})).one({ a: 1 }), '{}')
})

test("the resources' serializers write their representations as JSON.stringify of present()", () => {
  const user = {
    id: 1,
    name: 'A "quoted" name',
    email: 'a@example.com',
    role: 'user',
    email_verified_at: null,
    created_at: '2026-01-02T03:04:05.006Z',
    updated_at: '2026-01-02T03:04:05.006Z',
    password_hash: 'x',
    credential_epoch: 3,
    version: 2,
  }
  assert.equal(users.serializer.one(user), JSON.stringify(users.present(user)))
  const product = {
    id: 2,
    sku: 'SKU-1',
    name: 'n',
    description: 'd\n',
    price: 100,
    currency: 'EUR',
    stock: null,
    created_at: '2026-01-02T03:04:05.006Z',
    updated_at: '2026-01-02T03:04:05.006Z',
    version: 1,
  }
  assert.equal(products.serializer.one(product), JSON.stringify(products.present(product)))
})

test("timestamps: PostgreSQL's UTC text becomes RFC 3339 with milliseconds, as Date#toISOString writes it", () => {
  const cases: Array<[string, string]> = [
    ['2026-11-22 10:15:30.12+00', '2026-11-22T10:15:30.120Z'],
    ['2026-11-22 10:15:30+00', '2026-11-22T10:15:30.000Z'],
    ['2026-11-22 10:15:30.123456+00', '2026-11-22T10:15:30.123Z'],
    ['2026-11-22 10:15:30.9999+00', '2026-11-22T10:15:30.999Z'],
    ['2026-11-22 10:15:30.5+00', '2026-11-22T10:15:30.500Z'],
  ]
  for (const [text, iso] of cases) {
    assert.equal(isoTimestamp(text), iso)
    // Date truncates to milliseconds the same way.
    assert.equal(new Date(text.replace(' ', 'T').replace('+00', 'Z')).toISOString(), iso)
  }
  // Not in the fast form (another zone, a far year): through Date, still the same instant.
  assert.equal(isoTimestamp('2026-11-22 11:15:30.12+01'), '2026-11-22T10:15:30.120Z')
  assert.equal(isoTimestamp('infinity'), 'infinity')
})
