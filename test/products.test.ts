import assert from 'node:assert/strict'
import { test } from 'node:test'
import { startServer, type TestResponse } from './helpers/server.js'

// /products and /products/{id}: create, read, replace, merge-patch, delete,
// conditional requests, concurrency, and hostile input on every write.

const api = await startServer()
const { sql } = api

let serial = 0
const uniqueSku = (prefix = 'SKU') => `${prefix}-${process.pid}-${++serial}`

const validProduct = (over: Record<string, unknown> = {}) => ({
  sku: uniqueSku(),
  name: 'Blue widget',
  description: 'A widget.\nIt is blue.',
  price: 1999,
  currency: 'EUR',
  stock: 5,
  ...over,
})

interface DbProduct {
  id: number
  sku: string
  name: string
  description: string
  price: number
  currency: string
  stock: number
  version: number
  created_at: string
  updated_at: string
}

// Live rows: a deleted product waits in the trash (test/trash.test.ts).
const dbRow = async (id: number): Promise<DbProduct | undefined> =>
  (await sql<DbProduct[]>`SELECT * FROM products WHERE id = ${id} AND deleted_at IS NULL`)[0]
const productCount = async () =>
  (await sql<[{ n: number }]>`SELECT count(*)::int AS n FROM products WHERE deleted_at IS NULL`)[0].n

async function create(over: Record<string, unknown> = {}): Promise<{ res: TestResponse; id: number; etag: string }> {
  const res = await api.request('POST', '/products', { body: validProduct(over) })
  assert.equal(res.status, 201, res.text)
  return { res, id: res.body.id, etag: res.headers.get('etag')! }
}

function assertProblem(res: TestResponse, status: number, code: string, path?: string) {
  assert.equal(res.status, status, res.text)
  assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/)
  assert.equal(res.body.code, code, res.text)
  if (path !== undefined) assert.equal(res.body.errors?.[0]?.path, path, res.text)
}

const MEMBERS = ['id', 'sku', 'name', 'description', 'price', 'currency', 'stock', 'created_at', 'updated_at']

// ---------------------------------------------------------------- create/read

test('POST /products creates a product: 201, Location, ETag, the representation, and the row', async () => {
  const input = validProduct({ price: 1_000_000_000_000, stock: 2_147_483_647, currency: 'JPY' })
  const res = await api.request('POST', '/products', { body: input })
  assert.equal(res.status, 201, res.text)
  const id = res.body.id
  assert.ok(Number.isInteger(id) && id > 0)
  assert.equal(res.headers.get('location'), `/products/${id}`)
  assert.equal(res.headers.get('etag'), '"v1"')
  assert.match(res.headers.get('content-type') ?? '', /^application\/json/)
  assert.deepEqual(Object.keys(res.body).sort(), [...MEMBERS].sort())
  const { id: _id, created_at, updated_at, ...rest } = res.body
  assert.deepEqual(rest, input)
  assert.equal(created_at, updated_at)
  assert.ok(Math.abs(Date.parse(created_at) - Date.now()) < 60_000)

  const row = await dbRow(id)
  assert.ok(row)
  assert.equal(row.sku, input.sku)
  assert.equal(row.price, 1_000_000_000_000)
  assert.equal(row.stock, 2_147_483_647)
  assert.equal(row.version, 1)
  assert.equal(row.created_at, created_at)
})

test('POST /products without description and stock stores their defaults ("" and 0)', async () => {
  const { sku, name, price, currency } = validProduct()
  const res = await api.request('POST', '/products', { body: { sku, name, price, currency } })
  assert.equal(res.status, 201, res.text)
  assert.equal(res.body.description, '')
  assert.equal(res.body.stock, 0)
  const row = await dbRow(res.body.id)
  assert.equal(row?.description, '')
  assert.equal(row?.stock, 0)
})

test('POST /products accepts every boundary value of the contract', async () => {
  const cases: Array<[string, Record<string, unknown>]> = [
    ['price 0', { price: 0 }],
    ['price 1,000,000,000,000', { price: 1_000_000_000_000 }],
    ['stock 0', { stock: 0 }],
    ['stock 2147483647', { stock: 2_147_483_647 }],
    ['one-character sku', { sku: 'q' }],
    ['64-character sku of every allowed character', { sku: `9Az.-_${process.pid}`.padEnd(64, 'x') }],
    ['sku starting with a digit', { sku: `0${uniqueSku()}` }],
    ['200-character name', { name: 'n'.repeat(200) }],
    ['name with inner and outer spaces and non-ASCII', { name: '  Grüne Äpfel – 🍏 ' }],
    ['10000-character description with tabs and line breaks', { description: 'a\tb\r\nc\n'.repeat(1250) }],
    ['empty description', { description: '' }],
    ['currency JPY', { currency: 'JPY' }],
    ['currency CHF', { currency: 'CHF' }],
  ]
  for (const [what, over] of cases) {
    const body = validProduct(over)
    const res = await api.request('POST', '/products', { body })
    assert.equal(res.status, 201, `${what}: ${res.text}`)
    const row = await dbRow(res.body.id)
    for (const [k, v] of Object.entries(body)) assert.deepEqual(row?.[k as keyof DbProduct], v, `${what}: ${k}`)
  }
})

test('GET /products/{id} returns the product with its ETag; If-None-Match with it gives 304', async () => {
  const { res: created, id, etag } = await create()
  const res = await api.request('GET', `/products/${id}`)
  assert.equal(res.status, 200)
  assert.equal(res.headers.get('etag'), etag)
  assert.deepEqual(res.body, created.body)

  for (const inm of [etag, `W/${etag}`, `"nope", ${etag}`, '*']) {
    const cached = await api.request('GET', `/products/${id}`, { headers: { 'if-none-match': inm } })
    assert.equal(cached.status, 304, inm)
    assert.equal(cached.headers.get('etag'), etag)
    assert.equal(cached.text, '')
  }
  const stale = await api.request('GET', `/products/${id}`, { headers: { 'if-none-match': '"v999"' } })
  assert.equal(stale.status, 200)
  assert.deepEqual(stale.body, created.body)
})

test('GET /products/{id} of a missing or malformed id is 404 not_found', async () => {
  const { id } = await create()
  for (const path of [
    `/products/${id + 100000}`,
    '/products/0',
    '/products/-1',
    '/products/abc',
    '/products/1.5',
    '/products/99999999999999999999',
    '/products/9223372036854775807',
  ]) {
    const res = await api.request('GET', path)
    assertProblem(res, 404, 'not_found')
  }
})

test('POST /products with a SKU in use is 409 sku_taken and creates nothing', async () => {
  const { res: first } = await create()
  const before = await productCount()
  const res = await api.request('POST', '/products', { body: validProduct({ sku: first.body.sku, name: 'Other' }) })
  assertProblem(res, 409, 'sku_taken')
  assert.equal(await productCount(), before)
  const rows = await sql`SELECT name FROM products WHERE sku = ${first.body.sku}`
  assert.deepEqual(
    rows.map((r) => r.name),
    ['Blue widget'],
  )
})

// ------------------------------------------------------------- hostile input

/** A member's hostile value, as JSON text (so that 1e400 and lone surrogates arrive exactly). */
interface Hostile {
  what: string
  member: string
  json: string
}
const J = (v: unknown) => JSON.stringify(v)
const hostile: Hostile[] = [
  { what: 'price as a string', member: 'price', json: J('100') },
  { what: 'price fractional', member: 'price', json: '1.5' },
  { what: 'price negative', member: 'price', json: '-1' },
  { what: 'price 1e400 (Infinity)', member: 'price', json: '1e400' },
  { what: 'price above 10^12', member: 'price', json: '1000000000001' },
  { what: 'price boolean', member: 'price', json: 'true' },
  { what: 'price an array', member: 'price', json: '[100]' },
  { what: 'stock negative', member: 'stock', json: '-1' },
  { what: 'stock above int4', member: 'stock', json: '2147483648' },
  { what: 'stock fractional', member: 'stock', json: '0.5' },
  { what: 'stock as a string', member: 'stock', json: J('3') },
  { what: 'sku with a space', member: 'sku', json: J('AB 12') },
  { what: 'sku starting with -', member: 'sku', json: J('-AB12') },
  { what: 'sku starting with .', member: 'sku', json: J('.AB12') },
  { what: 'sku of 65 characters', member: 'sku', json: J('S'.repeat(65)) },
  { what: 'sku empty', member: 'sku', json: J('') },
  { what: 'sku with a slash', member: 'sku', json: J('AB/12') },
  { what: 'sku non-ASCII', member: 'sku', json: J('ÄB12') },
  { what: 'sku with a trailing line feed', member: 'sku', json: J('AB12\n') },
  { what: 'sku a number', member: 'sku', json: '12' },
  { what: 'name empty', member: 'name', json: J('') },
  { what: 'name only white space', member: 'name', json: J(' \u00a0 ') },
  { what: 'name of 201 characters', member: 'name', json: J('n'.repeat(201)) },
  { what: 'name with NUL', member: 'name', json: J('a\u0000b') },
  { what: 'name with a control character', member: 'name', json: J('a\u0007b') },
  { what: 'name with a line feed', member: 'name', json: J('a\nb') },
  { what: 'name with DEL', member: 'name', json: J('a\u007fb') },
  { what: 'name with a lone surrogate', member: 'name', json: '"a\\ud800b"' },
  { what: 'description of 10001 characters', member: 'description', json: J('d'.repeat(10001)) },
  { what: 'description with NUL', member: 'description', json: J('a\u0000b') },
  { what: 'description with a bell', member: 'description', json: J('a\u0007b') },
  { what: 'description with escape', member: 'description', json: J('a\u001bb') },
  { what: 'description with a lone low surrogate', member: 'description', json: '"x\\udc00"' },
  { what: 'description a number', member: 'description', json: '1' },
  { what: 'currency not a real code', member: 'currency', json: J('XYZ') },
  { what: 'currency lower case', member: 'currency', json: J('eur') },
  { what: 'currency four letters', member: 'currency', json: J('EURO') },
  { what: 'currency empty', member: 'currency', json: J('') },
  { what: 'currency a number', member: 'currency', json: '978' },
  { what: 'currency with white space', member: 'currency', json: J(' EUR') },
]
/** Members a client may not send at all: 422 on every write method. */
const unknownMembers: Hostile[] = [
  { what: 'an unknown member', member: 'colour', json: J('red') },
  { what: 'version', member: 'version', json: '7' },
  { what: 'a member differing only in case', member: 'Price', json: '100' },
]
/** Read-only members: 422 on POST (PUT and PATCH may echo them). */
const readOnlyOnPost: Hostile[] = [
  { what: 'id', member: 'id', json: '12345' },
  { what: 'created_at', member: 'created_at', json: J('2020-01-01T00:00:00.000Z') },
  { what: 'updated_at', member: 'updated_at', json: J('2020-01-01T00:00:00.000Z') },
]

/** The JSON text of `base` with `member` set to the raw JSON `json`. */
function bodyWith(base: Record<string, unknown>, member: string, json: string): string {
  const rest = { ...base }
  delete rest[member]
  const inner = J(rest).slice(1, -1)
  return `{${inner}${inner ? ',' : ''}${J(member)}:${json}}`
}

test(
  'POST /products refuses hostile input with 422 validation_failed naming the member, and creates ' + 'nothing',
  async () => {
    const before = await productCount()
    for (const h of [...hostile, ...unknownMembers, ...readOnlyOnPost]) {
      const base = validProduct()
      const res = await api.request('POST', '/products', {
        body: bodyWith(base, h.member, h.json),
        headers: { 'content-type': 'application/json' },
      })
      assertProblem(res, 422, 'validation_failed', `/${h.member}`)
      assert.equal((await sql`SELECT 1 FROM products WHERE sku = ${base.sku}`).length, 0, h.what)
    }
    assert.equal(await productCount(), before)
  },
)

test('POST /products refuses a body that lacks a required member or is not an object', async () => {
  const before = await productCount()
  for (const member of ['sku', 'name', 'price', 'currency']) {
    const body: Record<string, unknown> = validProduct()
    delete body[member]
    assertProblem(await api.request('POST', '/products', { body }), 422, 'validation_failed', `/${member}`)
    assertProblem(
      await api.request('POST', '/products', { body: { ...validProduct(), [member]: null } }),
      422,
      'validation_failed',
      `/${member}`,
    )
  }
  for (const body of ['[]', 'null', '"product"', '42', '{}']) {
    const res = await api.request('POST', '/products', { body, headers: { 'content-type': 'application/json' } })
    assertProblem(res, 422, 'validation_failed')
  }
  assert.equal(await productCount(), before)
})

test('PUT /products/{id} refuses hostile input with 422 and leaves the product unchanged', async () => {
  const { id } = await create()
  const before = await dbRow(id)
  for (const h of [...hostile, ...unknownMembers]) {
    const res = await api.request('PUT', `/products/${id}`, {
      body: bodyWith(validProduct({ sku: before!.sku }), h.member, h.json),
      headers: { 'content-type': 'application/json' },
    })
    assertProblem(res, 422, 'validation_failed', `/${h.member}`)
  }
  assert.deepEqual(await dbRow(id), before)
})

test('PATCH /products/{id} refuses hostile input with 422 and leaves the product unchanged', async () => {
  const { id } = await create()
  const before = await dbRow(id)
  for (const h of [...hostile, ...unknownMembers]) {
    const res = await api.request('PATCH', `/products/${id}`, {
      body: bodyWith({}, h.member, h.json),
      headers: { 'content-type': 'application/merge-patch+json' },
    })
    assertProblem(res, 422, 'validation_failed', `/${h.member}`)
  }
  assert.deepEqual(await dbRow(id), before)
})

test('PATCH with null on a required member (sku, name, price, currency) is 422 and changes nothing', async () => {
  const { id } = await create()
  const before = await dbRow(id)
  for (const member of ['sku', 'name', 'price', 'currency']) {
    const res = await api.request('PATCH', `/products/${id}`, { body: { [member]: null } })
    assertProblem(res, 422, 'validation_failed', `/${member}`)
  }
  assert.deepEqual(await dbRow(id), before)
})

// ------------------------------------------------------------------- replace

test('PUT replaces every writable member; description and stock left out get their defaults', async () => {
  const { id } = await create({ description: 'Long text', stock: 42 })
  const replacement = { sku: uniqueSku('NEW'), name: 'Red widget', price: 5, currency: 'USD' }
  const res = await api.request('PUT', `/products/${id}`, { body: replacement })
  assert.equal(res.status, 200, res.text)
  assert.equal(res.headers.get('etag'), '"v2"')
  assert.deepEqual(
    { ...res.body, id: undefined, created_at: undefined, updated_at: undefined },
    { ...replacement, description: '', stock: 0, id: undefined, created_at: undefined, updated_at: undefined },
  )
  const row = await dbRow(id)
  assert.deepEqual(
    {
      sku: row?.sku,
      name: row?.name,
      description: row?.description,
      price: row?.price,
      currency: row?.currency,
      stock: row?.stock,
      version: row?.version,
    },
    { ...replacement, description: '', stock: 0, version: 2 },
  )
  const got = await api.request('GET', `/products/${id}`)
  assert.deepEqual(got.body, res.body)
  assert.equal(got.headers.get('etag'), '"v2"')
})

test('PUT of a GET representation round-trips: echoed id, created_at and updated_at are ignored', async () => {
  const { res: created, id } = await create()
  const original = await dbRow(id)
  const echoed = {
    ...created.body,
    name: 'Renamed',
    created_at: '1999-01-01T00:00:00.000Z',
    updated_at: 'not even a date',
  }
  await new Promise((r) => setTimeout(r, 5)) // so that a new updated_at is a later millisecond
  const res = await api.request('PUT', `/products/${id}`, { body: echoed })
  assert.equal(res.status, 200, res.text)
  assert.equal(res.body.name, 'Renamed')
  assert.equal(res.body.id, id)
  assert.equal(res.body.created_at, created.body.created_at)
  assert.notEqual(res.body.updated_at, 'not even a date')
  const row = await dbRow(id)
  assert.equal(row?.created_at, original?.created_at)
  assert.equal(row?.name, 'Renamed')
  assert.ok(Date.parse(row!.updated_at) > Date.parse(original!.updated_at), 'a write moves updated_at forward')
  assert.equal(res.body.updated_at, row?.updated_at)
  assert.equal(row?.version, 2)
})

test('PUT with an id differing from the path is 422 and changes nothing', async () => {
  const { id } = await create()
  const { id: other } = await create()
  const before = await dbRow(id)
  const otherBefore = await dbRow(other)
  const res = await api.request('PUT', `/products/${id}`, {
    body: { ...validProduct({ sku: before!.sku, name: 'Hijack' }), id: other },
  })
  assertProblem(res, 422, 'validation_failed', '/id')
  assert.deepEqual(await dbRow(id), before)
  assert.deepEqual(await dbRow(other), otherBefore)
})

test('PUT of the same content changes nothing: same ETag, version and updated_at', async () => {
  const { res: created, id, etag } = await create()
  const before = await dbRow(id)
  const res = await api.request('PUT', `/products/${id}`, { body: created.body })
  assert.equal(res.status, 200, res.text)
  assert.equal(res.headers.get('etag'), etag)
  assert.deepEqual(await dbRow(id), before)
})

test('PUT to a product that does not exist is 404 and creates nothing', async () => {
  const before = await productCount()
  const body = validProduct()
  const res = await api.request('PUT', '/products/987654321', { body })
  assertProblem(res, 404, 'not_found')
  assert.equal(await productCount(), before)
  assert.equal((await sql`SELECT 1 FROM products WHERE sku = ${body.sku}`).length, 0)
})

test('PUT or PATCH to a SKU another product has is 409 sku_taken and changes nothing', async () => {
  const { res: a } = await create()
  const { id: b } = await create()
  const before = await dbRow(b)
  assertProblem(
    await api.request('PUT', `/products/${b}`, { body: validProduct({ sku: a.body.sku }) }),
    409,
    'sku_taken',
  )
  assertProblem(await api.request('PATCH', `/products/${b}`, { body: { sku: a.body.sku } }), 409, 'sku_taken')
  assert.deepEqual(await dbRow(b), before)
})

// --------------------------------------------------------------------- patch

test('PATCH changes only the members it names and bumps the version', async () => {
  const { res: created, id } = await create({ stock: 3 })
  const res = await api.request('PATCH', `/products/${id}`, { body: { price: 2500, name: 'Cheaper widget' } })
  assert.equal(res.status, 200, res.text)
  assert.equal(res.headers.get('etag'), '"v2"')
  assert.deepEqual(
    { ...res.body, updated_at: undefined },
    { ...created.body, price: 2500, name: 'Cheaper widget', updated_at: undefined },
  )
  const row = await dbRow(id)
  assert.equal(row?.price, 2500)
  assert.equal(row?.name, 'Cheaper widget')
  assert.equal(row?.stock, 3)
  assert.equal(row?.description, created.body.description)
  assert.equal(row?.version, 2)
})

test('PATCH accepts application/json as well as application/merge-patch+json', async () => {
  const { id } = await create()
  const res = await api.request('PATCH', `/products/${id}`, {
    body: { stock: 9 },
    headers: { 'content-type': 'application/json' },
  })
  assert.equal(res.status, 200, res.text)
  assert.equal((await dbRow(id))?.stock, 9)
})

test('PATCH with null on description or stock resets it to its default', async () => {
  const { id } = await create({ description: 'Something', stock: 17 })
  const res = await api.request('PATCH', `/products/${id}`, { body: { description: null, stock: null } })
  assert.equal(res.status, 200, res.text)
  assert.equal(res.body.description, '')
  assert.equal(res.body.stock, 0)
  const row = await dbRow(id)
  assert.equal(row?.description, '')
  assert.equal(row?.stock, 0)
  assert.equal(row?.version, 2)
})

test('PATCH {} changes nothing: same ETag, version and updated_at', async () => {
  const { id, etag } = await create()
  const before = await dbRow(id)
  await new Promise((r) => setTimeout(r, 5)) // a new updated_at would differ
  const res = await api.request('PATCH', `/products/${id}`, { body: {} })
  assert.equal(res.status, 200, res.text)
  assert.equal(res.headers.get('etag'), etag)
  assert.equal(res.body.updated_at, before!.updated_at)
  assert.deepEqual(await dbRow(id), before)
})

test('PATCH setting members to their current values changes nothing', async () => {
  const { res: created, id, etag } = await create()
  const before = await dbRow(id)
  const res = await api.request('PATCH', `/products/${id}`, {
    body: { name: created.body.name, price: created.body.price, id, created_at: 'ignored' },
  })
  assert.equal(res.status, 200, res.text)
  assert.equal(res.headers.get('etag'), etag)
  assert.deepEqual(await dbRow(id), before)
})

test('PATCH with an id differing from the path is 422; to a missing product 404', async () => {
  const { id } = await create()
  const before = await dbRow(id)
  assertProblem(
    await api.request('PATCH', `/products/${id}`, { body: { id: id + 1, name: 'x' } }),
    422,
    'validation_failed',
    '/id',
  )
  assert.deepEqual(await dbRow(id), before)
  assertProblem(await api.request('PATCH', '/products/987654321', { body: { name: 'x' } }), 404, 'not_found')
})

// -------------------------------------------------------------- conditionals

test('If-Match with a stale ETag is 412 on PUT, PATCH and DELETE, and nothing changes', async () => {
  const { id } = await create()
  assert.equal((await api.request('PATCH', `/products/${id}`, { body: { stock: 1 } })).status, 200) // now v2
  const before = await dbRow(id)
  const attempts: Array<[string, unknown]> = [
    ['PUT', validProduct({ sku: before!.sku, name: 'Stale put' })],
    ['PATCH', { name: 'Stale patch' }],
    ['DELETE', undefined],
  ]
  for (const stale of ['"v1"', 'W/"v2"', '"v3"', '"something"']) {
    for (const [method, body] of attempts) {
      const res = await api.request(method, `/products/${id}`, { body, headers: { 'if-match': stale } })
      assertProblem(res, 412, 'precondition_failed')
      assert.equal(res.headers.get('etag'), '"v2"', `${method} ${stale}`)
    }
  }
  assert.deepEqual(await dbRow(id), before)
})

test('If-Match with the current ETag (or *) lets the write through', async () => {
  const { id, etag } = await create()
  const res = await api.request('PATCH', `/products/${id}`, { body: { stock: 2 }, headers: { 'if-match': etag } })
  assert.equal(res.status, 200, res.text)
  assert.equal(res.headers.get('etag'), '"v2"')
  const put = await api.request('PUT', `/products/${id}`, {
    body: validProduct({ sku: res.body.sku, stock: 3 }),
    headers: { 'if-match': `"v1", "v2"` },
  })
  assert.equal(put.status, 200, put.text)
  const star = await api.request('PATCH', `/products/${id}`, { body: { stock: 4 }, headers: { 'if-match': '*' } })
  assert.equal(star.status, 200, star.text)
  const row = await dbRow(id)
  assert.equal(row?.stock, 4)
  assert.equal(row?.version, 4)
  // A list on PATCH: any strong tag of it may be the current one; a weak one never matches, nor does garbage.
  const listed = await api.request('PATCH', `/products/${id}`, {
    body: { stock: 5 },
    headers: { 'if-match': `"v1", W/"v4", "v4", "x"` },
  })
  assert.equal(listed.status, 200, listed.text)
  assert.equal(listed.headers.get('etag'), '"v5"')
  for (const refused of ['W/"v5"', '"v5x"', '"v05"', '"v05 "', `"v${'9'.repeat(20)}"`]) {
    const res = await api.request('PATCH', `/products/${id}`, { body: { stock: 6 }, headers: { 'if-match': refused } })
    assert.equal(res.status, 412, refused)
  }
  assert.equal((await dbRow(id))?.version, 5)
})

// -------------------------------------------------------------------- delete

test('DELETE answers 204 with no body; the product is then 404 and gone from the live ones', async () => {
  const { id, etag } = await create()
  const res = await api.request('DELETE', `/products/${id}`, { headers: { 'if-match': etag } })
  assert.equal(res.status, 204)
  assert.equal(res.text, '')
  assert.equal(await dbRow(id), undefined)
  assertProblem(await api.request('GET', `/products/${id}`), 404, 'not_found')
  assertProblem(await api.request('DELETE', `/products/${id}`), 404, 'not_found')
  assertProblem(await api.request('PATCH', `/products/${id}`, { body: { stock: 1 } }), 404, 'not_found')
})

test('a deleted product frees its SKU', async () => {
  const { res, id } = await create()
  assert.equal((await api.request('DELETE', `/products/${id}`)).status, 204)
  const again = await api.request('POST', '/products', { body: validProduct({ sku: res.body.sku }) })
  assert.equal(again.status, 201, again.text)
  assert.notEqual(again.body.id, id)
})

// --------------------------------------------------------------- concurrency

test('10 concurrent POSTs with one SKU: exactly one 201, the others 409 sku_taken, one row', async () => {
  const sku = uniqueSku('RACE')
  const results = await Promise.all(
    Array.from({ length: 10 }, (_, i) =>
      api.request('POST', '/products', { body: validProduct({ sku, name: `Racer ${i}` }) }),
    ),
  )
  const statuses = results.map((r) => r.status).sort()
  assert.deepEqual(statuses, [201, ...Array(9).fill(409)], results.map((r) => r.text).join('\n'))
  for (const r of results.filter((r) => r.status === 409)) assert.equal(r.body.code, 'sku_taken')
  const winner = results.find((r) => r.status === 201)!
  const rows = await sql<DbProduct[]>`SELECT * FROM products WHERE sku = ${sku}`
  assert.equal(rows.length, 1)
  assert.equal(rows[0]!.id, winner.body.id)
  assert.equal(rows[0]!.name, winner.body.name)
})

test('10 concurrent PATCHes with one If-Match: exactly one 200, the others 412, one new version', async () => {
  const { id, etag } = await create()
  const results = await Promise.all(
    Array.from({ length: 10 }, (_, i) =>
      api.request('PATCH', `/products/${id}`, {
        body: { name: `Writer ${i}`, stock: i },
        headers: { 'if-match': etag },
      }),
    ),
  )
  const statuses = results.map((r) => r.status).sort()
  assert.deepEqual(statuses, [200, ...Array(9).fill(412)], results.map((r) => r.text).join('\n'))
  for (const r of results.filter((r) => r.status === 412)) assert.equal(r.body.code, 'precondition_failed')
  const winner = results.find((r) => r.status === 200)!
  const row = await dbRow(id)
  assert.equal(row?.version, 2)
  assert.equal(row?.name, winner.body.name)
  assert.equal(row?.stock, winner.body.stock)
})
