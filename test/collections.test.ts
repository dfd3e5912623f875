import assert from 'node:assert/strict'
import { before, test } from 'node:test'
import type { Row } from 'postgres'
import { cursorKey, decodeCursor, encodeCursor } from '../src/core/collections/cursor.js'
import { listStatements, type ListRequest } from '../src/core/collections/list-sql.js'
import { products as productsResource } from '../src/products/resource.js'
import { users as usersResource } from '../src/users/resource.js'
import { ListShapes } from '../src/core/collections/list-sql.js'
import { startServer, type TestResponse } from './helpers/server.js'

// The one list mechanism, through GET /users and GET /products: filters,
// search, sort, limit, offset, count, fields, and keyset paging with opaque
// cursors. A few thousand rows with many ties in every sort key are written
// straight into the tables; every walk is compared with what PostgreSQL's own
// ORDER BY returns. This file only reads through the API, so the data set
// (and with it every expectation) stays fixed for all its tests.

const api = await startServer()
// The data set below is the whole users table: remove the admin the helper
// created, with triggers off (session_replication_role = replica), so that no
// revocation is recorded and its JWT, checked in memory, still authorizes:
// as if the token were of a user that was never in the table.
await api.sql.begin(async (tx) => {
  await tx`SET LOCAL session_replication_role = replica`
  await tx`DELETE FROM users WHERE id = ${api.admin.id}`
})
const { sql } = api
const prefix = api.deps.config.apiPrefix

const N_PRODUCTS = 3000
const N_USERS = 2500
const BASE_TIME = Date.UTC(2025, 0, 1, 8, 0, 0)

// ------------------------------------------------------------------- data set

/** A small seeded PRNG (mulberry32), so the data set, and a failure, are reproducible. */
function prng(seed: number) {
  let s = seed >>> 0
  return () => {
    s = (s + 0x6d2b79f5) >>> 0
    let t = s
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}
const random = prng(20260101)
const pick = <T>(values: readonly T[]): T => values[Math.floor(random() * values.length)]!
function shuffle<T>(values: T[]): T[] {
  for (let i = values.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1))
    ;[values[i], values[j]] = [values[j]!, values[i]!]
  }
  return values
}
// Few distinct values per sort key, so that ties (and the id tie-break) are everywhere.
const timePool = Array.from({ length: 40 }, (_, k) => new Date(BASE_TIME + k * 3_600_000 + k * 7))
const productNames = [
  'Widget',
  'widget',
  'Gadget',
  'Gizmo',
  'Sprocket',
  'Flange',
  'Bolt',
  'bolt',
  'Nut',
  'Washer',
  'Zebra clip',
  'Alpha',
  'alpha',
  'Omega',
  'Äpfel',
  'Ørsted',
  'Lever',
  'Spring',
]
const prices = [0, 1, 99, 100, 250, 999, 1000, 1999, 2500, 5000, 9999, 10000, 25000, 123456, 999999, 1_000_000_000_000]
const currencies = ['EUR', 'EUR', 'EUR', 'USD', 'USD', 'GBP', 'JPY', 'CHF']
const stocks = [0, 0, 0, 1, 2, 5, 10, 100, 2_147_483_647]
const descriptions = ['', 'Plain.', 'Line one\nline two', 'Made of steel', 'Tab\tseparated']
const userNames = [
  'Alice',
  'alice',
  'Bob',
  'bob',
  'Carol',
  'Dave',
  'Eve',
  'Mallory',
  'Zoë',
  'Ängel',
  'Trent',
  'Peggy',
  'Victor',
  'Walter',
  ' Sybil',
]

/** Rows the search tests look for; no bulk row has %, _, \ or "findme" (bulk SKUs do contain digits like 50). */
const specialProducts = [
  { sku: 'SPECIAL-1', name: 'Discount 50% off', description: '' },
  { sku: 'SPECIAL-2', name: 'Model 500', description: 'Fifty-ish' },
  { sku: 'SPECIAL-3', name: 'Big 5000 thing', description: 'price 150 today' },
  { sku: 'SPECIAL-4', name: 'snake_case', description: '' },
  { sku: 'SPECIAL-5', name: 'snakeXcase', description: '' },
  { sku: 'SPECIAL-6', name: 'Plain', description: 'now 50% cheaper' },
  { sku: 'SPECIAL-7', name: 'back\\slash', description: '' },
  { sku: 'FINDME-sku', name: 'Gizmo', description: '' },
  { sku: 'SPECIAL-8', name: 'Gizmo', description: 'hidden FindMe in text' },
]
const specialUsers = [
  { name: 'Percent 50% user', email: 'pct@example.com' },
  { name: 'User 500', email: 'five@example.com' },
  { name: 'Case Person', email: 'Mixed.Case@Example.COM' },
  { name: 'under_score', email: 'us@example.com' },
]

interface ProductRow {
  id: number
  sku: string
  name: string
  description: string
  price: number
  currency: string
  stock: number
  created_at: string
  updated_at: string
}
interface UserRow {
  id: number
  name: string
  email: string
  role: string
  email_verified_at: string | null
  created_at: string
  updated_at: string
}
let products: ProductRow[] = []
let users: UserRow[] = []

async function insertInChunks(table: 'products' | 'users', rows: Array<Record<string, unknown>>) {
  for (let i = 0; i < rows.length; i += 1000) await sql`INSERT INTO ${sql(table)} ${sql(rows.slice(i, i + 1000))}`
}

before(async () => {
  const productRows = Array.from({ length: N_PRODUCTS - specialProducts.length }, (_, i) => {
    const created = pick(timePool)
    return {
      sku: `P${String(i).padStart(5, '0')}-${pick(['a', 'B', 'c'])}`,
      name: pick(productNames),
      description: pick(descriptions),
      price: pick(prices),
      currency: pick(currencies),
      stock: pick(stocks),
      created_at: created,
      updated_at: new Date(created.getTime() + pick([0, 0, 1000, 86_400_000])),
    }
  })
  for (const s of specialProducts)
    productRows.push({
      ...s,
      price: pick(prices),
      currency: pick(currencies),
      stock: pick(stocks),
      created_at: pick(timePool),
      updated_at: pick(timePool),
    })
  await insertInChunks('products', shuffle(productRows))

  const userRows = Array.from({ length: N_USERS - specialUsers.length }, (_, i) => {
    const created = pick(timePool)
    return {
      name: pick(userNames),
      email:
        `${pick(['a', 'B', 'z', 'M'])}${pick(['x', 'Y', 'q'])}.${i}@` +
        pick(['example.com', 'Example.org', 'mail.test']),
      role: random() < 0.15 ? 'admin' : 'user',
      created_at: created,
      updated_at: new Date(created.getTime() + pick([0, 5000])),
    }
  })
  for (const s of specialUsers)
    userRows.push({ ...s, role: 'user', created_at: pick(timePool), updated_at: pick(timePool) })
  await insertInChunks('users', shuffle(userRows))
  await sql`ANALYZE products`
  await sql`ANALYZE users`

  products = await sql<
    ProductRow[]
  >`SELECT id, sku, name, description, price, currency, stock, created_at, updated_at FROM products ORDER BY id`
  users = await sql<
    UserRow[]
  >`SELECT id, name, email, role, email_verified_at, created_at, updated_at FROM users ORDER BY id`
})

// -------------------------------------------------------------------- helpers

const get = (path: string) => api.request('GET', path)

function assertProblem(res: TestResponse, status: number, code: string, path?: string, what = '') {
  assert.equal(res.status, status, `${what}: ${res.text}`)
  assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/, what)
  assert.equal(res.body.code, code, `${what}: ${res.text}`)
  if (path !== undefined) assert.equal(res.body.errors?.[0]?.path, path, `${what}: ${res.text}`)
}

/** The path (API prefix removed) of the Link rel="next" target, or undefined when there is none. */
function nextPath(res: TestResponse): string | undefined {
  const link = res.headers.get('link')
  if (link === null) return undefined
  const m = /^<([^>]+)>; rel="next"$/.exec(link)
  assert.ok(m, `malformed Link header: ${link}`)
  assert.ok(m[1]!.startsWith(`${prefix}/`), link)
  return m[1]!.slice(prefix.length)
}
const cursorOf = (res: TestResponse): string => new URL(`http://x${nextPath(res)!}`).searchParams.get('cursor')!

interface Walk {
  rows: Array<Record<string, unknown>>
  pages: TestResponse[]
}
/** Follows rel="next" from `path` to the end. */
async function walk(path: string): Promise<Walk> {
  const rows: Array<Record<string, unknown>> = []
  const pages: TestResponse[] = []
  let next: string | undefined = path
  while (next !== undefined) {
    assert.ok(pages.length < 500, 'the walk does not end')
    const res = await get(next)
    assert.equal(res.status, 200, `${next}: ${res.text}`)
    assert.ok(Array.isArray(res.body), next)
    pages.push(res)
    rows.push(...res.body)
    next = nextPath(res)
  }
  return { rows, pages }
}

/** Ids in the same order, reported at the first difference rather than as a 3000-line diff. */
function assertSameIds(actual: number[], expected: number[], what: string) {
  const first = expected.findIndex((id, i) => actual[i] !== id)
  assert.ok(
    first === -1 && actual.length === expected.length,
    `${what}: ${actual.length} ids ` +
      `vs ${expected.length} expected; first difference ` +
      `at ${first}: got ${actual.slice(Math.max(0, first - 2), first + 3)} ` +
      `want ${expected.slice(Math.max(0, first - 2), first + 3)}`,
  )
}

const oracleIds = async (table: string, where: string, order: string): Promise<number[]> =>
  (await sql.unsafe<Row[]>(`SELECT id FROM ${table} WHERE ${where} ORDER BY ${order}`)).map((r) => r.id as number)

const PRODUCT_MEMBERS = ['id', 'sku', 'name', 'description', 'price', 'currency', 'stock', 'created_at', 'updated_at']
const USER_MEMBERS = ['id', 'name', 'email', 'role', 'email_verified_at', 'created_at', 'updated_at']
const BASE64URL = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'

const time = (k: number) => timePool[k]!.toISOString()
const includesCaseless = (haystack: string, needle: string) => haystack.toLowerCase().includes(needle.toLowerCase())

// ------------------------------------------------------------------- the data

test('the data set has many ties in every sort key (so the id tie-break matters)', async () => {
  assert.equal(products.length, N_PRODUCTS)
  assert.equal(users.length, N_USERS)
  const [p] = await sql`SELECT count(DISTINCT name)::int AS name, count(DISTINCT price)::int AS price, count(DISTINCT
      currency)::int AS currency,
    count(DISTINCT stock)::int AS stock, count(DISTINCT created_at)::int AS created_at, count(DISTINCT
    updated_at)::int AS updated_at FROM products`
  for (const [k, n] of Object.entries(p!)) assert.ok((n as number) < 200, `products.${k}: ${n} distinct values`)
  const [u] = await sql`SELECT count(DISTINCT name)::int AS name, count(DISTINCT role)::int AS role, count(DISTINCT
      created_at)::int AS created_at FROM users`
  for (const [k, n] of Object.entries(u!)) assert.ok((n as number) < 200, `users.${k}: ${n} distinct values`)
  // Ids are not in the order of any key: a walk that ignored the sort would fail.
  const byPrice = await oracleIds('products', 'true', 'price, id')
  assert.notDeepEqual(
    byPrice,
    [...byPrice].sort((a, b) => a - b),
  )
})

// ------------------------------------------------------------ THE BIG WALKS

interface WalkCase {
  table: 'products' | 'users'
  query: string
  /** The same selection, written independently in SQL. */
  where: string
  /** The order the API promises: the keys given, then id in the direction of the last key. */
  order: string
  limit: number
  /** When `fields` restricts the output, the members each row must have. */
  fields?: string[]
}
const lower = (col: string, needle: string) => `position('${needle}' in lower(${col})) > 0`
const walkCases: WalkCase[] = [
  {
    table: 'products',
    query: 'sort=price&currency=EUR&price[gte]=100',
    where: `currency = 'EUR' AND price >= 100`,
    order: 'price ASC, id ASC',
    limit: 200,
  },
  {
    table: 'products',
    query: 'sort=-price&currency=EUR&price[gte]=100',
    where: `currency = 'EUR' AND price >= 100`,
    order: 'price DESC, id DESC',
    limit: 200,
  },
  { table: 'products', query: 'sort=name,-id', where: 'true', order: 'name ASC, id DESC', limit: 200 },
  { table: 'products', query: 'sort=-name', where: 'true', order: 'name DESC, id DESC', limit: 200 },
  {
    table: 'products',
    query: 'sort=currency,-price&stock[lt]=100',
    where: 'stock < 100',
    order: 'currency ASC, price DESC, id DESC',
    limit: 200,
  },
  {
    table: 'products',
    query: `sort=-created_at&price[in]=0,100,999,1999,1000000000000`,
    where: 'price IN (0, 100, 999, 1999, 1000000000000)',
    order: 'created_at DESC, id DESC',
    limit: 200,
  },
  {
    table: 'products',
    query: 'sort=stock,-name,price&currency[ne]=JPY',
    where: `currency <> 'JPY'`,
    order: 'stock ASC, name DESC, price ASC, id ASC',
    limit: 137,
  },
  {
    table: 'products',
    query: `sort=-updated_at,sku&fields=id&created_at[lt]=${time(30)}`,
    where: `created_at < '${time(30)}'`,
    order: 'updated_at DESC, sku ASC, id ASC',
    limit: 200,
    fields: ['id'],
  },
  {
    table: 'products',
    query: 'q=widget',
    where: `(${lower('name', 'widget')} OR ${lower('sku', 'widget')} OR ${lower('description', 'widget')})`,
    order: 'id ASC',
    limit: 50,
  },
  {
    table: 'products',
    query: 'sort=-id&price[lte]=9999&price[gt]=0',
    where: 'price <= 9999 AND price > 0',
    order: 'id DESC',
    limit: 200,
  },
  {
    table: 'products',
    query: 'sort=-stock,created_at&currency[in]=USD,GBP&fields=id,stock',
    where: `currency IN ('USD', 'GBP')`,
    order: 'stock DESC, created_at ASC, id ASC',
    limit: 99,
    fields: ['id', 'stock'],
  },
  { table: 'users', query: 'sort=email', where: 'true', order: 'email ASC, id ASC', limit: 200 },
  { table: 'users', query: 'sort=-name', where: 'true', order: 'name DESC, id DESC', limit: 200 },
  {
    table: 'users',
    query: `sort=role,name&created_at[gte]=${time(5)}`,
    where: `created_at >= '${time(5)}'`,
    order: 'role ASC, name ASC, id ASC',
    limit: 200,
  },
  {
    table: 'users',
    query: 'sort=-role,created_at&q=X',
    where: `(${lower('name', 'x')} OR ${lower('email', 'x')})`,
    order: 'role DESC, created_at ASC, id ASC',
    limit: 77,
  },
  {
    table: 'users',
    query: 'sort=-created_at,-name&role=user',
    where: `role = 'user'`,
    order: 'created_at DESC, name DESC, id DESC',
    limit: 200,
  },
  {
    table: 'users',
    query: 'sort=-email&email[ne]=mixed.case@example.com',
    where: `lower(email) <> 'mixed.case@example.com'`,
    order: 'email DESC, id DESC',
    limit: 200,
  },
]

for (const c of walkCases) {
  test(
    `walking /${c.table}?${c.query} page by page gives exactly ORDER ` +
      `BY ${c.order}: no duplicates, no gaps, no rel=next at the end`,
    async () => {
      const expected = await oracleIds(c.table, c.where, c.order)
      assert.ok(expected.length > 2 * c.limit, `the case must span several pages (${expected.length} rows)`)
      const { rows, pages } = await walk(`/${c.table}?${c.query}&limit=${c.limit}&count=true`)
      const ids = rows.map((r) => r.id as number)

      assert.equal(new Set(ids).size, ids.length, 'no row appears twice')
      assertSameIds(ids, expected, c.query)
      assert.equal(pages.length, Math.ceil(expected.length / c.limit))
      pages.forEach((page, i) => {
        const last = i === pages.length - 1
        assert.equal(page.body.length, last ? expected.length - c.limit * i : c.limit, `page ${i + 1} size`)
        assert.equal(page.headers.get('link') === null, last, `page ${i + 1}: rel=next iff not the last page`)
        assert.equal(page.headers.get('x-total-count'), String(expected.length), `page ${i + 1}: X-Total-Count`)
        for (const row of page.body) {
          assert.deepEqual(
            Object.keys(row).sort(),
            [...(c.fields ?? (c.table === 'products' ? PRODUCT_MEMBERS : USER_MEMBERS))].sort(),
          )
        }
      })
      // Each next link repeats the request's parameters, with a cursor added.
      const wanted = new URLSearchParams(`${c.query}&limit=${c.limit}&count=true`)
      for (const page of pages.slice(0, -1)) {
        const params = new URL(`http://x${nextPath(page)!}`).searchParams
        assert.ok(params.get('cursor'))
        params.delete('cursor')
        assert.deepEqual([...params].sort(), [...wanted].sort())
      }
    },
  )
}

test('each page of a walk shows the rows as they are stored', async () => {
  const { rows } = await walk('/products?sort=-price&limit=200&currency=GBP')
  const byId = new Map(products.map((p) => [p.id, p]))
  for (const row of rows) {
    const stored = byId.get(row.id as number)!
    assert.deepEqual(row, stored)
  }
  const userRows = (await walk('/users?limit=200&role=admin')).rows
  const usersById = new Map(users.map((u) => [u.id, u]))
  for (const row of userRows) {
    const stored = usersById.get(row.id as number)!
    assert.deepEqual(row, stored)
    assert.ok(!('password_hash' in row) && !('version' in row))
  }
})

test('a collection whose size is an exact multiple of limit ends without an empty page', async () => {
  const [{ id: cut }] = (await sql`SELECT id FROM products ORDER BY id OFFSET 399 LIMIT 1`) as unknown as [
    { id: number },
  ]
  const { pages, rows } = await walk(`/products?id[lte]=${cut}&limit=200`)
  assert.equal(pages.length, 2)
  assert.equal(rows.length, 400)
  assert.equal(pages[1]!.headers.get('link'), null)
})

test('ORDER BY price DESC, id DESC LIMIT 51 on products is a (backward) scan of products_price_id_idx', async () => {
  const plan = await sql.unsafe('EXPLAIN (FORMAT JSON) SELECT * FROM products ORDER BY price DESC, id DESC LIMIT 51')
  const text = JSON.stringify(plan)
  assert.match(text, /"Index Name":"products_price_id_idx"/, text)
  assert.match(text, /"Node Type":"Index Scan"/, text)
  assert.doesNotMatch(text, /"Node Type":"Sort"/, text)
  // And a keyset page after a cursor is an index range, not a scan and sort.
  const keyset = JSON.stringify(
    await sql.unsafe(
      'EXPLAIN (FORMAT JSON) SELECT * FROM products WHERE (price, id) < (5000, 1500) ORDER BY price DESC, id DESC ' +
        'LIMIT 51',
    ),
  )
  assert.match(keyset, /"Index Name":"products_price_id_idx"/, keyset)
  assert.doesNotMatch(keyset, /"Node Type":"Sort"/, keyset)
})

// ---------------------------------------------------------- defaults, limit

test('GET /products without parameters: 50 rows by id, a rel=next link, no X-Total-Count', async () => {
  const res = await get('/products')
  assert.equal(res.status, 200)
  assert.match(res.headers.get('content-type') ?? '', /^application\/json/)
  assert.deepEqual(
    res.body.map((r: { id: number }) => r.id),
    products.slice(0, 50).map((p) => p.id),
  )
  const next = nextPath(res)
  assert.ok(next)
  assert.match(next, /^\/products\?cursor=[A-Za-z0-9_-]+$/)
  assert.equal(res.headers.get('x-total-count'), null)
  const second = await get(next)
  assert.deepEqual(
    second.body.map((r: { id: number }) => r.id),
    products.slice(50, 100).map((p) => p.id),
  )
})

test('limit takes 1 to 200', async () => {
  for (const limit of [1, 2, 199, 200]) {
    const res = await get(`/users?limit=${limit}`)
    assert.equal(res.status, 200)
    assert.deepEqual(
      res.body.map((r: { id: number }) => r.id),
      users.slice(0, limit).map((u) => u.id),
    )
    assert.ok(nextPath(res))
  }
})

// ------------------------------------------------------------------ filters

interface FilterCase<R> {
  query: string
  keep: (r: R) => boolean
  empty?: boolean
}
const t = (k: number) => timePool[k]!.getTime()
const productFilters: Array<FilterCase<ProductRow>> = [
  { query: 'price=1999', keep: (p) => p.price === 1999 },
  { query: 'price[ne]=1999', keep: (p) => p.price !== 1999 },
  { query: 'price[gt]=9999', keep: (p) => p.price > 9999 },
  { query: 'price[gte]=9999', keep: (p) => p.price >= 9999 },
  { query: 'price[lt]=100', keep: (p) => p.price < 100 },
  { query: 'price[lte]=100', keep: (p) => p.price <= 100 },
  { query: 'price[in]=0,1,1000000000000', keep: (p) => [0, 1, 1e12].includes(p.price) },
  { query: 'price=1000000000000', keep: (p) => p.price === 1e12 },
  {
    query: 'price[gte]=100&price[lt]=1000&currency=EUR',
    keep: (p) => p.price >= 100 && p.price < 1000 && p.currency === 'EUR',
  },
  { query: 'currency=GBP', keep: (p) => p.currency === 'GBP' },
  { query: 'currency[in]=GBP,CHF', keep: (p) => p.currency === 'GBP' || p.currency === 'CHF' },
  { query: 'currency=gbp', keep: () => false, empty: true },
  { query: 'stock=0', keep: (p) => p.stock === 0 },
  { query: 'stock=2147483647', keep: (p) => p.stock === 2_147_483_647 },
  { query: 'name=Widget', keep: (p) => p.name === 'Widget' },
  { query: 'name[in]=bolt,Nut', keep: (p) => p.name === 'bolt' || p.name === 'Nut' },
  { query: 'name[ne]=Widget', keep: (p) => p.name !== 'Widget' },
  { query: 'sku=FINDME-sku', keep: (p) => p.sku === 'FINDME-sku' },
  { query: `created_at=${time(3)}`, keep: (p) => Date.parse(p.created_at) === t(3) },
  { query: `created_at[gt]=${time(20)}`, keep: (p) => Date.parse(p.created_at) > t(20) },
  {
    query: `created_at[lte]=${encodeURIComponent('2025-01-01T10:00:00.014+02:00')}`,
    keep: (p) => Date.parse(p.created_at) <= t(0),
  },
  { query: `updated_at[gte]=${time(39)}`, keep: (p) => Date.parse(p.updated_at) >= t(39) },
  { query: `id[in]=1,2,3,${N_PRODUCTS}`, keep: (p) => [1, 2, 3, N_PRODUCTS].includes(p.id) },
  { query: 'id[gt]=2990', keep: (p) => p.id > 2990 },
  { query: 'id=9223372036854775807', keep: () => false, empty: true },
  { query: 'id[in]=1,9223372036854775807', keep: (p) => p.id === 1 },
  // q: case-insensitive substring of name, sku or description; % _ \ are literal.
  { query: 'q=WIDGET', keep: (p) => [p.name, p.sku, p.description].some((s) => includesCaseless(s, 'widget')) },
  { query: 'q=findme', keep: (p) => [p.name, p.sku, p.description].some((s) => includesCaseless(s, 'findme')) },
  { query: 'q=50%25', keep: (p) => [p.name, p.sku, p.description].some((s) => s.includes('50%')) },
  { query: 'q=50', keep: (p) => [p.name, p.sku, p.description].some((s) => s.includes('50')) },
  { query: 'q=e_c', keep: (p) => [p.name, p.sku, p.description].some((s) => s.toLowerCase().includes('e_c')) },
  { query: 'q=_', keep: (p) => [p.name, p.sku, p.description].some((s) => s.includes('_')) },
  { query: 'q=%25', keep: (p) => [p.name, p.sku, p.description].some((s) => s.includes('%')) },
  { query: 'q=%5C', keep: (p) => [p.name, p.sku, p.description].some((s) => s.includes('\\')) },
  { query: 'q=line+two', keep: (p) => includesCaseless(p.description, 'line two') },
  { query: 'q=eur', keep: () => false, empty: true }, // currency is not searched
  { query: 'q=widget&price[lt]=1000&sort=-price', keep: (p) => includesCaseless(p.name, 'widget') && p.price < 1000 },
]
const userFilters: Array<FilterCase<UserRow>> = [
  { query: 'email=mixed.case@example.com', keep: (u) => u.email === 'Mixed.Case@Example.COM' },
  { query: 'email=MIXED.CASE@EXAMPLE.COM', keep: (u) => u.email === 'Mixed.Case@Example.COM' },
  {
    query: 'email[in]=MIXED.case@example.com,PCT@example.COM',
    keep: (u) => u.email === 'Mixed.Case@Example.COM' || u.email === 'pct@example.com',
  },
  { query: 'email[ne]=MIXED.CASE@example.com', keep: (u) => u.email !== 'Mixed.Case@Example.COM' },
  { query: 'role=admin', keep: (u) => u.role === 'admin' },
  { query: 'role[ne]=admin', keep: (u) => u.role !== 'admin' },
  { query: 'role[in]=admin', keep: (u) => u.role === 'admin' },
  { query: 'name=alice', keep: (u) => u.name === 'alice' },
  {
    query: `created_at[lt]=${time(10)}&role=admin`,
    keep: (u) => Date.parse(u.created_at) < t(10) && u.role === 'admin',
  },
  { query: 'q=50%25', keep: (u) => u.name.includes('50%') || u.email.includes('50%') },
  { query: 'q=r_s', keep: (u) => u.name.toLowerCase().includes('r_s') || u.email.toLowerCase().includes('r_s') },
  { query: 'q=EXAMPLE.ORG', keep: (u) => includesCaseless(u.email, 'example.org') },
  { query: 'q=alice', keep: (u) => includesCaseless(u.name, 'alice') || includesCaseless(u.email, 'alice') },
  { query: 'q=admin', keep: () => false, empty: true }, // role is not searched
]

async function checkFilter<R extends { id: number }>(table: string, all: R[], c: FilterCase<R>) {
  const sorted = /(^|&)sort=/.test(c.query)
  const { rows } = await walk(`/${table}?${c.query}&limit=200`)
  const expected = all.filter(c.keep)
  if (c.empty) assert.equal(expected.length, 0)
  else
    assert.ok(
      expected.length > 0 && expected.length < all.length,
      `${c.query}: the case must select some rows, not all (${expected.length})`,
    )
  const ids = rows.map((r) => r.id as number)
  if (sorted) ids.sort((a, b) => a - b)
  assertSameIds(
    ids,
    expected.map((r) => r.id),
    `/${table}?${c.query}`,
  )
}

for (const c of productFilters) {
  test(`GET /products?${c.query} selects exactly the matching products`, () => checkFilter('products', products, c))
}
for (const c of userFilters) {
  test(`GET /users?${c.query} selects exactly the matching users`, () => checkFilter('users', users, c))
}

test('q=50% matches "50%" literally, not "500"; q=_ matches "_" literally', async () => {
  const names = (await walk('/products?q=50%25&limit=200')).rows.map((r) => r.name)
  assert.ok(names.includes('Discount 50% off'))
  assert.ok(names.includes('Plain'))
  assert.ok(!names.includes('Model 500') && !names.includes('Big 5000 thing'), names.join())
  const snakes = (await get('/products?q=e_c&limit=200')).body.map((r: { name: string }) => r.name)
  assert.deepEqual(snakes, ['snake_case'])
  const userNames = (await get('/users?q=50%25')).body.map((r: { name: string }) => r.name)
  assert.deepEqual(userNames, ['Percent 50% user'])
})

// ----------------------------------------------------------- refused queries

const invalidParameters: Array<[string, string, string]> = [
  // [collection, query, parameter named in errors[0].path]
  ['products', 'price=abc', 'price'],
  ['products', 'price[gt]=1.5', 'price[gt]'],
  ['products', 'price=1e3', 'price'],
  ['products', 'price=', 'price'],
  ['products', 'price=+5', 'price'],
  ['products', 'price[in]=1,abc', 'price[in]'],
  ['products', 'price[in]=', 'price[in]'],
  ['products', 'price[in]=1,,2', 'price[in]'],
  ['products', `price[in]=${Array.from({ length: 101 }, (_, i) => i).join(',')}`, 'price[in]'],
  ['products', 'stock=2147483648', 'stock'],
  ['products', 'stock[gt]=-2147483649', 'stock[gt]'],
  ['products', 'price[lt]=-9223372036854775809', 'price[lt]'],
  ['products', 'id=9223372036854775808', 'id'],
  ['products', 'id=99999999999999999999', 'id'],
  ['products', 'created_at[gt]=yesterday', 'created_at[gt]'],
  ['products', 'created_at=2025-02-30T00:00:00Z', 'created_at'],
  ['products', 'created_at=2025-13-01T00:00:00Z', 'created_at'],
  ['products', 'created_at=2025-01-01', 'created_at'],
  ['products', 'created_at=2025-01-01T00:00:00', 'created_at'],
  ['products', 'updated_at[lt]=1700000000', 'updated_at[lt]'],
  ['products', 'price=1&price=2', 'price'],
  ['products', 'limit=0', 'limit'],
  ['products', 'limit=201', 'limit'],
  ['products', 'limit=abc', 'limit'],
  ['products', 'limit=', 'limit'],
  ['products', 'limit=-1', 'limit'],
  ['products', 'limit=1.5', 'limit'],
  ['products', 'offset=-1', 'offset'],
  ['products', 'offset=100001', 'offset'],
  ['products', 'offset=abc', 'offset'],
  ['products', 'count=yes', 'count'],
  ['products', 'count=1', 'count'],
  ['products', 'q=', 'q'],
  ['products', `q=${'x'.repeat(201)}`, 'q'],
  ['products', 'q=%FF', 'q'],
  ['products', 'q=a%00b', 'q'],
  ['users', 'role=boss', 'role'],
  ['users', 'role=Admin', 'role'],
  ['users', 'role[in]=admin,boss', 'role[in]'],
  ['users', 'created_at[gt]=yesterday', 'created_at[gt]'],
  ['users', 'limit=500', 'limit'],
]
// Comparisons with values no row holds are fair questions: the operand may be
// anything the column's type holds; only limit and offset have ranges as rules.
const legitimateOperands: Array<[string, string, string]> = [
  // [collection, query, the same selection in SQL]
  ['users', 'id[gt]=0', 'id > 0'],
  ['users', 'id=0', 'id = 0'],
  ['users', 'id[gte]=-9223372036854775808', 'true'],
  ['products', 'id[in]=1,0,-5', 'id IN (1, 0, -5)'],
  ['products', 'price[gt]=-1', 'price > -1'],
  ['products', 'price[lt]=1000000000001', 'price < 1000000000001'],
  ['products', 'price=-1', 'false'],
  ['products', 'stock[ne]=-1', 'stock <> -1'],
  ['products', 'stock[lte]=2147483647', 'true'],
  ['products', 'stock[gte]=-2147483648&stock[lt]=0', 'false'],
]
test(
  "a comparison operand outside a member's range but within its column's type selects what SQL would: 200, never " +
    '400',
  async () => {
    for (const [table, query, where] of legitimateOperands) {
      const res = await get(`/${table}?${query}&limit=200&count=true`)
      assert.equal(res.status, 200, `/${table}?${query}: ${res.text}`)
      const [{ n }] = await sql.unsafe(`SELECT count(*)::int AS n FROM ${table} WHERE ${where}`)
      assert.equal(Number(res.headers.get('x-total-count')), n, `/${table}?${query}`)
    }
  },
)

test(
  'a filter, limit, offset, count or q value of the wrong type is 400 invalid_parameter naming the ' + 'parameter',
  async () => {
    for (const [table, query, param] of invalidParameters) {
      assertProblem(await get(`/${table}?${query}`), 400, 'invalid_parameter', param, `/${table}?${query}`)
    }
  },
)

const unknownParameters: Array<[string, string, string]> = [
  ['users', 'password=x', 'password'],
  ['users', 'password_hash=x', 'password_hash'],
  ['users', 'version=1', 'version'],
  ['users', 'sku=x', 'sku'],
  ['products', 'price[like]=1', 'price[like]'],
  ['products', 'price[eq]=1', 'price[eq]'],
  ['products', 'price[]=1', 'price[]'],
  ['products', 'limt=5', 'limt'],
  ['products', 'description=x', 'description'],
  ['products', 'PRICE=1', 'PRICE'],
  ['products', 'email=a@b.c', 'email'],
  ['products', 'page=2', 'page'],
]
test('an unknown parameter is 400 unknown_parameter naming it', async () => {
  for (const [table, query, param] of unknownParameters) {
    assertProblem(await get(`/${table}?${query}`), 400, 'unknown_parameter', param, `/${table}?${query}`)
  }
})

// --------------------------------------------------------------------- sort

test('an unknown, repeated or empty sort member is 400 invalid_parameter on sort', async () => {
  const cases: Array<[string, string]> = [
    ['users', 'sort=password_hash'],
    ['users', 'sort=sku'],
    ['products', 'sort=description'],
    ['products', 'sort=Price'],
    ['products', 'sort=price,-price'],
    ['products', 'sort=id,id'],
    ['products', 'sort=-name,name'],
    ['products', 'sort='],
    ['products', 'sort=price,'],
    ['products', 'sort=,price'],
    ['products', 'sort=--price'],
    ['products', 'sort=+price'],
    ['products', 'sort=price%20'],
  ]
  for (const [table, query] of cases)
    assertProblem(await get(`/${table}?${query}`), 400, 'invalid_parameter', 'sort', `/${table}?${query}`)
})

test('sort=id and no sort give the same order; sort=-id the reverse', async () => {
  const asc = (await get('/users?sort=id&limit=200')).body.map((r: { id: number }) => r.id)
  assert.deepEqual(
    asc,
    (await get('/users?limit=200')).body.map((r: { id: number }) => r.id),
  )
  assert.deepEqual(
    asc,
    users.slice(0, 200).map((u) => u.id),
  )
  const desc = (await get('/users?sort=-id&limit=200')).body.map((r: { id: number }) => r.id)
  assert.deepEqual(
    desc,
    users
      .slice(-200)
      .map((u) => u.id)
      .reverse(),
  )
})

// ------------------------------------------------------------------- offset

test('offset skips that many rows of the sorted selection; the next link continues after them', async () => {
  const expected = await oracleIds('products', `currency = 'USD'`, 'price DESC, id DESC')
  const res = await get('/products?sort=-price&currency=USD&offset=10&limit=5')
  assert.equal(res.status, 200)
  assert.deepEqual(
    res.body.map((r: { id: number }) => r.id),
    expected.slice(10, 15),
  )
  const next = nextPath(res)!
  assert.ok(!/offset=/.test(next), next)
  const second = await get(next)
  assert.deepEqual(
    second.body.map((r: { id: number }) => r.id),
    expected.slice(15, 20),
  )

  assert.deepEqual(
    (await get('/products?offset=0&limit=3')).body.map((r: { id: number }) => r.id),
    products.slice(0, 3).map((p) => p.id),
  )
  const far = await get('/products?offset=100000')
  assert.equal(far.status, 200)
  assert.deepEqual(far.body, [])
  assert.equal(far.headers.get('link'), null)
})

test('offset together with cursor is 400', async () => {
  const cursor = cursorOf(await get('/products?limit=5'))
  const res = await get(`/products?limit=5&offset=5&cursor=${cursor}`)
  assert.equal(res.status, 400)
  assert.equal(res.body.code, 'invalid_parameter')
  assert.ok(['offset', 'cursor'].includes(res.body.errors?.[0]?.path), res.text)
})

// -------------------------------------------------------------------- count

test('count=true gives X-Total-Count for the whole filtered selection; without it there is no header', async () => {
  const cases: Array<[string, number]> = [
    ['/products?count=true', N_PRODUCTS],
    ['/products?count=true&limit=1', N_PRODUCTS],
    [
      '/products?count=true&currency=EUR&price[gte]=1000',
      products.filter((p) => p.currency === 'EUR' && p.price >= 1000).length,
    ],
    ['/products?count=true&q=widget', products.filter((p) => includesCaseless(p.name, 'widget')).length],
    ['/products?count=true&price=3', 0],
    ['/users?count=true&role=admin', users.filter((u) => u.role === 'admin').length],
    ['/users?count=true&email=MIXED.case@example.com', 1],
  ]
  for (const [path, n] of cases) {
    const res = await get(path)
    assert.equal(res.status, 200, path)
    assert.equal(res.headers.get('x-total-count'), String(n), path)
  }
  for (const path of ['/products', '/products?count=false', '/users?role=admin']) {
    const res = await get(path)
    assert.equal(res.status, 200, path)
    assert.equal(res.headers.get('x-total-count'), null, path)
  }
})

// ------------------------------------------------------------------- fields

test('fields returns only the members named', async () => {
  const cases: Array<[string, string[]]> = [
    ['/products?fields=id,name', ['id', 'name']],
    ['/products?fields=name,id', ['id', 'name']],
    ['/products?fields=description', ['description']],
    ['/products?fields=price,price', ['price']],
    ['/users?fields=email,role', ['email', 'role']],
  ]
  for (const [path, members] of cases) {
    const res = await get(`${path}&limit=20`)
    assert.equal(res.status, 200, path)
    assert.equal(res.body.length, 20)
    for (const row of res.body) assert.deepEqual(Object.keys(row).sort(), [...members].sort(), path)
  }
  const named = await get('/products?fields=id,name&limit=3')
  assert.deepEqual(
    named.body,
    products.slice(0, 3).map((p) => ({ id: p.id, name: p.name })),
  )
})

test('an unknown field is 400 invalid_parameter on fields', async () => {
  for (const path of [
    '/products?fields=id,nope',
    '/products?fields=version',
    '/products?fields=',
    '/products?fields=id,',
    '/users?fields=password_hash',
    '/users?fields=sku',
  ]) {
    assertProblem(await get(path), 400, 'invalid_parameter', 'fields', path)
  }
})

// ------------------------------------------------------------------- cursor

test(
  'a cursor of a page sorted by e-mail shows no e-mail address: not in the URL, not in base64 (they land in ' +
    'access logs)',
  async () => {
    const res = await get('/users?sort=email&limit=5')
    const last = res.body.at(-1).email as string
    const link = res.headers.get('link')!
    const cursor = cursorOf(res)
    assert.ok(!decodeURIComponent(link).includes(last) && !link.includes(encodeURIComponent(last)), link)
    const local = last.split('@')[0]!
    for (let shift = 0; shift < 3; shift++) {
      const encoded = Buffer.from('x'.repeat(shift) + local)
        .toString('base64url')
        .slice(4, 4 + Math.max(4, Math.floor((local.length * 4) / 3) - 4))
      if (encoded.length >= 4) assert.ok(!cursor.includes(encoded), `base64 of ${local} at alignment ${shift}`)
    }
    assert.ok(!Buffer.from(cursor, 'base64url').includes(local), 'nor in the decoded bytes')
  },
)

test('a tampered, garbage or foreign cursor is 400 invalid_parameter on cursor', async () => {
  const base = '/products?sort=price&currency=EUR&limit=10'
  const cursor = cursorOf(await get(base))
  const flip = (s: string, i: number) => s.slice(0, i) + (s[i] === 'A' ? 'B' : 'A') + s.slice(i + 1)
  // The last character may carry spare bits: another spelling of the same bytes.
  const bytes = Buffer.from(cursor, 'base64url')
  const spareChanged = [...BASE64URL]
    .map((c) => cursor.slice(0, -1) + c)
    .find((c) => c !== cursor && Buffer.from(c, 'base64url').equals(bytes))
  const other = cursorOf(await get(`${base}&cursor=${cursor}`))
  const payload = decodeCursor(cursor, api.deps.cursorKeys)!
  assert.ok(payload, 'the API makes cursors the module decodes')
  const bad: Array<[string, string]> = [
    ['first character changed', flip(cursor, 0)],
    ['middle changed', flip(cursor, Math.floor(cursor.length / 2))],
    ['last character changed', flip(cursor, cursor.length - 1)],
    ...(spareChanged ? [['last character changed in its spare bits only', spareChanged] as [string, string]] : []),
    ['the nonce of another cursor', other.slice(0, 16) + cursor.slice(16)],
    [
      'the plaintext in the clear',
      Buffer.from(JSON.stringify([payload.sort, payload.filter, payload.after])).toString('base64url'),
    ],
    ['sealed with another key', encodeCursor(payload, cursorKey(Buffer.alloc(32, 7)))],
    ['garbage', 'abc'],
    ['empty', ''],
    ['dot only', '.'],
    ['JSON', encodeURIComponent('{"after":[1]}')],
    ['truncated', cursor.slice(0, -3)],
  ]
  for (const [what, c] of bad) {
    assertProblem(await get(`${base}&cursor=${c}`), 400, 'invalid_parameter', 'cursor', what)
  }
  // The cursor itself is fine with the request it was made for.
  assert.equal((await get(`${base}&cursor=${cursor}`)).status, 200)
})

test('a cursor used with a different sort, filter or collection is 400 invalid_parameter on cursor', async () => {
  const cursor = cursorOf(await get('/products?sort=price&currency=EUR&limit=10'))
  const elsewhere = [
    '/products?sort=-price&currency=EUR',
    '/products?currency=EUR',
    '/products?sort=price,id&currency=EUR&stock=0',
    '/products?sort=price',
    '/products?sort=price&currency=USD',
    '/products?sort=price&currency[in]=EUR',
    '/products?sort=price&currency=EUR&q=widget',
    '/products?sort=name&currency=EUR',
  ]
  for (const path of elsewhere)
    assertProblem(await get(`${path}&cursor=${cursor}`), 400, 'invalid_parameter', 'cursor', path)

  // /users and /products share the cursor key and, with no filter, the sort `id`.
  const usersCursor = cursorOf(await get('/users?limit=10'))
  assertProblem(
    await get(`/products?limit=10&cursor=${usersCursor}`),
    400,
    'invalid_parameter',
    'cursor',
    'users cursor on products',
  )
  const productsCursor = cursorOf(await get('/products?limit=10'))
  assertProblem(
    await get(`/users?limit=10&cursor=${productsCursor}`),
    400,
    'invalid_parameter',
    'cursor',
    'products cursor on users',
  )
  assert.deepEqual(
    (await get(`/users?limit=3&cursor=${usersCursor}`)).body.map((u: { id: number }) => u.id),
    users.slice(10, 13).map((u) => u.id),
  )
})

test('a cursor stays valid with another limit, count or fields (they do not select rows)', async () => {
  const expected = await oracleIds('products', `currency = 'EUR'`, 'price ASC, id ASC')
  const cursor = cursorOf(await get('/products?sort=price&currency=EUR&limit=10'))
  const res = await get(`/products?currency=EUR&sort=price&limit=7&count=true&fields=id&cursor=${cursor}`)
  assert.equal(res.status, 200, res.text)
  assert.deepEqual(
    res.body,
    expected.slice(10, 17).map((id) => ({ id })),
  )
  assert.equal(res.headers.get('x-total-count'), String(expected.length))
})

// ------------------------------------------------- compiled SQL (list-sql.ts)

test(
  'an IN filter takes up to 100 values: 100 ids (missing ones and the bigint maximum among them) select exactly ' +
    'those that exist',
  async () => {
    const wanted = [
      ...products.slice(0, 60).map((p) => p.id),
      ...Array.from({ length: 39 }, (_, i) => N_PRODUCTS + 1000 + i),
      9223372036854775807n,
    ]
    assert.equal(wanted.length, 100)
    const res = await get(`/products?id[in]=${wanted.map(String).reverse().join(',')}&limit=200&count=true`)
    assert.equal(res.status, 200, res.text)
    assert.deepEqual(
      res.body.map((r: { id: number }) => r.id),
      products.slice(0, 60).map((p) => p.id),
    )
    assert.equal(res.headers.get('x-total-count'), '60')
  },
)

test('an IN filter of e-mail addresses in other case selects those users, through lower(email)', async () => {
  const chosen = users.slice(100, 140)
  const value = chosen.map((u) => u.email.toUpperCase()).join(',')
  assert.ok(value.length <= 1000, 'within the length of a parameter value')
  const list = value.split(',').map(encodeURIComponent).join(',')
  const { rows } = await walk(`/users?email[in]=${list}&limit=30`)
  assertSameIds(
    rows.map((r) => r.id as number),
    chosen.map((u) => u.id),
    'email[in]',
  )
})

test('an IN filter on timestamps matches the instants, whatever offset they are written with', async () => {
  const plus2 = (k: number) => new Date(t(k) + 2 * 3_600_000).toISOString().replace('Z', '+02:00')
  const { rows } = await walk(`/products?created_at[in]=${encodeURIComponent(`${plus2(5)},${time(7)}`)}&limit=200`)
  assertSameIds(
    rows.map((r) => r.id as number),
    products.filter((p) => [t(5), t(7)].includes(Date.parse(p.created_at))).map((p) => p.id),
    'created_at[in]',
  )
})

test('an IN filter on text matches spaces, backslashes and non-ASCII letters exactly', async () => {
  const names = ['back\\slash', 'Zebra clip', 'Äpfel', 'Ørsted']
  const { rows } = await walk(`/products?name[in]=${names.map(encodeURIComponent).join(',')}&limit=200`)
  assertSameIds(
    rows.map((r) => r.id as number),
    products.filter((p) => names.includes(p.name)).map((p) => p.id),
    'name[in]',
  )
  const people = (await walk(`/users?name[in]=${encodeURIComponent(' Sybil')},Zo%C3%AB&limit=200`)).rows
  assertSameIds(
    people.map((r) => r.id as number),
    users.filter((u) => u.name === ' Sybil' || u.name === 'Zoë').map((u) => u.id),
    'users name[in]',
  )
})

test(
  "the order of the parameters does not matter: the same page, and each one's cursor works for the " + 'other',
  async () => {
    const a = await get('/products?currency=EUR&sort=-price&price[gte]=100&stock[lt]=100&limit=20')
    const b = await get('/products?stock[lt]=100&limit=20&price[gte]=100&sort=-price&currency=EUR')
    assert.equal(a.status, 200, a.text)
    assert.deepEqual(b.body, a.body)
    const fromA = await get(
      `/products?stock[lt]=100&limit=20&price[gte]=100&sort=-price&currency=EUR&cursor=${cursorOf(a)}`,
    )
    const fromB = await get(
      `/products?currency=EUR&sort=-price&price[gte]=100&stock[lt]=100&limit=20&cursor=${cursorOf(b)}`,
    )
    assert.equal(fromA.status, 200, fromA.text)
    assert.deepEqual(fromB.body, fromA.body)
    const expected = await oracleIds(
      'products',
      `currency = 'EUR' AND price >= 100 AND stock < 100`,
      'price DESC, id DESC',
    )
    assert.deepEqual(
      fromA.body.map((r: { id: number }) => r.id),
      expected.slice(20, 40),
    )
  },
)

test(
  'of two wrong filter values, the one named is the first in declaration order, whatever the order of the ' + 'query',
  async () => {
    for (const query of [
      'price=abc&stock=2147483648',
      'stock=2147483648&price=abc',
      'stock[lt]=x&id=abc',
      'id=abc&stock[lt]=x',
    ]) {
      const first = query.includes('id=abc') ? 'id' : 'price'
      assertProblem(await get(`/products?${query}`), 400, 'invalid_parameter', first, query)
    }
  },
)

test(
  'the compiled statements are index scans: first page, cursor page, sort=-price, e-mail IN ' + '(lower(email))',
  async () => {
    const id = { member: 'id', descending: false }
    const cases: Array<{ collection: typeof usersResource.collection; request: ListRequest; index: string }> = [
      { collection: usersResource.collection, request: { filters: [], sort: [id], limit: 50 }, index: 'users_pkey' },
      {
        collection: usersResource.collection,
        request: { filters: [], sort: [id], after: [users[2000]!.id], limit: 50 },
        index: 'users_pkey',
      },
      {
        collection: productsResource.collection,
        request: {
          filters: [],
          sort: [
            { member: 'price', descending: true },
            { member: 'id', descending: true },
          ],
          limit: 50,
        },
        index: 'products_price_id_idx',
      },
      {
        collection: usersResource.collection,
        request: {
          filters: [{ member: 'email', op: 'in', values: ['PCT@example.com', 'x@y.z'] }],
          sort: [id],
          limit: 50,
        },
        index: 'users_email_key',
      },
    ]
    for (const c of cases) {
      // As a request lists them: the live rows (users and products have a trash).
      const { text, values } = listStatements(c.collection, { ...c.request, trash: 'live' }, new ListShapes()).page
      const plan = JSON.stringify(await sql.unsafe(`EXPLAIN (FORMAT JSON) ${text}`, values))
      assert.match(plan, new RegExp(`"Index Name":"${c.index}"`), `${text}: ${plan}`)
      assert.doesNotMatch(plan, /"Node Type":"Seq Scan"/, `${text}: ${plan}`)
    }
  },
)
