import assert from 'node:assert/strict'
import { before, test } from 'node:test'
import { startServer } from './helpers/server.js'

// Filter values that mean something to SQL or inside a PostgreSQL array
// literal (an IN list travels as one array parameter): quotes, backslashes,
// braces, NULL, SQL text. Each must select exactly the rows that hold it.

const api = await startServer()
const { sql } = api

const awkward = ['a"b', 'c\\d', '{x}', '{', '}', 'NULL', 'null', '"', '\\', '\\"{}', "'; DROP TABLE products; --", '$1', ' ', 'x y', 'é', 'a,b']
const inListable = awkward.filter((v) => !v.includes(',')) // an IN list is comma-separated
let products: Array<{ id: number; name: string }> = []

before(async () => {
  const rows = [...awkward, 'plain', 'other'].map((name, i) => ({ sku: `AWK-${i}`, name, price: i, currency: 'EUR' }))
  products = await sql<Array<{ id: number; name: string }>>`INSERT INTO products ${sql(rows)} RETURNING id, name`
  await sql`INSERT INTO users (name, email) VALUES ('Quote', ${`o'brien"{1}@Example.COM`}), ('Brace', ${'x\\y}@example.com'})`
})

const ids = (body: Array<{ id: number }>) => body.map((r) => r.id).sort((a, b) => a - b)
const idsNamed = (names: string[]) => products.filter((p) => names.includes(p.name)).map((p) => p.id).sort((a, b) => a - b)

test('name=<value> selects exactly the product with that name, for values with quotes, backslashes, braces, NULL and SQL', async () => {
  for (const v of awkward) {
    const res = await api.request('GET', `/products?name=${encodeURIComponent(v)}`)
    assert.equal(res.status, 200, `${v}: ${res.text}`)
    assert.deepEqual(ids(res.body), idsNamed([v]), v)
  }
})

test('name[in]=<values> selects exactly those products, one value or all of them', async () => {
  for (const v of inListable) {
    const res = await api.request('GET', `/products?name[in]=${encodeURIComponent(v)},plain`)
    assert.equal(res.status, 200, `${v}: ${res.text}`)
    assert.deepEqual(ids(res.body), idsNamed([v, 'plain']), v)
  }
  const all = await api.request('GET', `/products?name[in]=${inListable.map(encodeURIComponent).join(',')}&limit=200&count=true`)
  assert.equal(all.status, 200, all.text)
  assert.deepEqual(ids(all.body), idsNamed(inListable))
  assert.equal(all.headers.get('x-total-count'), String(inListable.length))
})

test('e-mail IN lists with quotes and braces stay caseless', async () => {
  const res = await api.request('GET', `/users?email[in]=${encodeURIComponent(`O'BRIEN"{1}@example.com`)},${encodeURIComponent('X\\Y}@EXAMPLE.COM')}`)
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
