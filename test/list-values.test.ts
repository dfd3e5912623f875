import assert from 'node:assert/strict'
import { before, test } from 'node:test'
import { startServer } from './helpers/server.js'

// Filter values that mean something to SQL or inside a PostgreSQL array
// literal (an IN list travels as one array parameter): quotes, backslashes,
// braces, NULL, SQL text. Each must select exactly the rows that hold it.

const api = await startServer()
const { sql } = api

const awkward = [
  'a"b',
  'c\\d',
  '{x}',
  '{',
  '}',
  'NULL',
  'null',
  '"',
  '\\',
  '\\"{}',
  "'; DROP TABLE products; --",
  '$1',
  ' ',
  'x y',
  'é',
  'a,b',
]
const inListable = awkward.filter((v) => !v.includes(',')) // an IN list is comma-separated
let products: Array<{ id: number; name: string }> = []

before(async () => {
  const rows = [...awkward, 'plain', 'other'].map((name, i) => ({ sku: `AWK-${i}`, name, price: i, currency: 'EUR' }))
  products = await sql<Array<{ id: number; name: string }>>`INSERT INTO products ${sql(rows)} RETURNING id, name`
  await sql`INSERT INTO users (name, email) VALUES
    ('Quote', ${`o'brien"{1}@Example.COM`}), ('Brace', ${'x\\y}@example.com'})`
})

const ids = (body: Array<{ id: number }>) => body.map((r) => r.id).sort((a, b) => a - b)
const idsNamed = (names: string[]) =>
  products
    .filter((p) => names.includes(p.name))
    .map((p) => p.id)
    .sort((a, b) => a - b)

test(
  'name=<value> selects exactly the product with that name, for values with quotes, backslashes, braces, NULL and ' +
    'SQL',
  async () => {
    for (const v of awkward) {
      const res = await api.request('GET', `/products?name=${encodeURIComponent(v)}`)
      assert.equal(res.status, 200, `${v}: ${res.text}`)
      assert.deepEqual(ids(res.body), idsNamed([v]), v)
    }
  },
)

test('name[in]=<values> selects exactly those products, one value or all of them', async () => {
  for (const v of inListable) {
    const res = await api.request('GET', `/products?name[in]=${encodeURIComponent(v)},plain`)
    assert.equal(res.status, 200, `${v}: ${res.text}`)
    assert.deepEqual(ids(res.body), idsNamed([v, 'plain']), v)
  }
  const all = await api.request(
    'GET',
    `/products?name[in]=${inListable.map(encodeURIComponent).join(',')}&limit=200&count=true`,
  )
  assert.equal(all.status, 200, all.text)
  assert.deepEqual(ids(all.body), idsNamed(inListable))
  assert.equal(all.headers.get('x-total-count'), String(inListable.length))
})

test('e-mail IN lists with quotes and braces stay caseless', async () => {
  const res = await api.request(
    'GET',
    `/users?email[in]=${encodeURIComponent(`O'BRIEN"{1}@example.com`)},${encodeURIComponent('X\\Y}@EXAMPLE.COM')}`,
  )
  assert.equal(res.status, 200, res.text)
  assert.deepEqual(res.body.map((u: { name: string }) => u.name).sort(), ['Brace', 'Quote'])
})

test('q finds quotes, braces and backslashes literally', async () => {
  for (const v of ['"', '{', '\\', "'"]) {
    const res = await api.request('GET', `/products?q=${encodeURIComponent(v)}&limit=200`)
    assert.equal(res.status, 200, `${v}: ${res.text}`)
    assert.deepEqual(ids(res.body), idsNamed(awkward.filter((n) => n.includes(v))), v)
  }
})

// RFC 3339 date-times that are no instant a timestamp holds: refused as any invalid value, never a 500.
const unholdable = [
  '2026-06-30T23:59:60Z',
  '0000-01-01T00:00:00Z',
  '0000-12-31T23:59:59Z',
  '0001-01-01T00:30:00+01:00',
  '9999-12-31T23:59:59-23:59',
  '2026-01-01T00:00:00Z[Europe/Paris]',
]

test(
  'a timestamp filter outside what a timestamp holds (a leap second, year 0, past 9999 in UTC, a zone suffix) is ' +
    '400 invalid_parameter, with every operator, on every collection',
  async () => {
    const paths = ['/products', '/users', '/api-keys', '/events', '/webhooks']
    const filters = [
      'created_at',
      'created_at[gt]',
      'created_at[gte]',
      'created_at[lt]',
      'created_at[lte]',
      'created_at[ne]',
      'created_at[in]',
    ]
    for (const path of paths) {
      const member = path === '/events' ? 'occurred_at' : 'created_at'
      for (const filter of filters) {
        for (const value of unholdable) {
          const operand = filter.endsWith('[in]') ? `2026-01-01T00:00:00Z,${value}` : value
          const res = await api.request(
            'GET',
            `${path}?${filter.replace('created_at', member)}=${encodeURIComponent(operand)}`,
          )
          assert.equal(res.status, 400, `${path} ${filter}=${operand}: ${res.text}`)
          assert.equal(res.body.code, 'invalid_parameter', res.text)
        }
      }
    }
  },
)

test('the first and the last instants a timestamp holds are accepted as filters, in any offset', async () => {
  for (const value of [
    '0001-01-01T00:00:00Z',
    '0001-01-01T01:00:00+01:00',
    '9999-12-31T23:59:59.999Z',
    '9999-12-31T22:59:59-01:00',
  ]) {
    for (const filter of ['created_at[gt]', 'created_at[lt]', 'created_at']) {
      const res = await api.request('GET', `/products?${filter}=${encodeURIComponent(value)}`)
      assert.equal(res.status, 200, `${filter}=${value}: ${res.text}`)
    }
  }
})
