import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { listCollection, MAX_FILTERS } from '../src/core/collections/list-query.js'
import { MAX_PREPARED_SHAPES, PREPARE_AFTER_USES } from '../src/core/collections/list-sql.js'
import { products } from '../src/products/resource.js'
import { startServer } from './helpers/server.js'

// What a client choosing list shapes can cost the database. Every filter set
// × sort is a statement shape; prepared, a shape stays in the memory of every
// connection that ran it. A client can send thousands of shapes, so only
// shapes used often are prepared, at most MAX_PREPARED_SHAPES per collection,
// and a request combines at most MAX_FILTERS filters.

// Two connections, so that every backend can be inspected.
const api = await startServer({ DATABASE_POOL_MAX: '2' })
await api.sql`
  INSERT INTO products (sku, name, price, currency, stock)
  SELECT 'B-' || g, 'Bound ' || g, g * 10, (ARRAY['EUR', 'USD'])[1 + g % 2], g % 7 FROM generate_series(1, 60) g`

const VALUES: Record<string, [one: string, list: string]> = {
  id: ['5', '1,2,3'],
  sku: ['B-5', 'B-1,B-2'],
  name: ['Bound 5', 'Bound 1,Bound 2'],
  price: ['50', '10,20,30'],
  currency: ['EUR', 'EUR,USD'],
  stock: ['3', '1,2'],
  created_at: ['2020-01-01T00:00:00Z', '2020-01-01T00:00:00Z,2030-01-01T00:00:00Z'],
  updated_at: ['2030-01-01T00:00:00Z', '2020-01-01T00:00:00Z'],
}
const OPS = ['', 'ne', 'gt', 'gte', 'lt', 'lte', 'in']
const PARAMETERS = Object.keys(VALUES).flatMap((member) =>
  OPS.map((op) => [op ? `${member}[${op}]` : member, op === 'in' ? VALUES[member]![1] : VALUES[member]![0]] as const),
)
const SORTS = Object.keys(VALUES).flatMap((m) => [m, `-${m}`])

const PAIRS = PARAMETERS.flatMap((a, i) => PARAMETERS.slice(i + 1).map((b) => [a, b] as const))

/**
 * The n-th distinct shape: two filter parameters (an unordered pair: the order of a query string is not part of a
 * shape) and a sort.
 */
function shape(n: number): Record<string, string> {
  const [a, b] = PAIRS[n % PAIRS.length]!
  return {
    [a[0]]: a[1],
    [b[0]]: b[1],
    sort: SORTS[Math.floor(n / PAIRS.length) % SORTS.length]!,
    ...(n % 2 ? { count: 'true' } : {}),
  }
}

async function preparedPerBackend(): Promise<number[]> {
  const backends = await Promise.all([api.sql.reserve(), api.sql.reserve()])
  try {
    return await Promise.all(
      backends.map(
        async (db) => (await db<[{ n: number }]>`SELECT count(*)::int AS n FROM pg_prepared_statements`)[0].n,
      ),
    )
  } finally {
    for (const db of backends) db.release()
  }
}

describe('list shapes', () => {
  test(
    `more than ${MAX_FILTERS} filter parameters in one request: 400 invalid_parameter naming the first ` +
      `beyond; ${MAX_FILTERS} are served`,
    async () => {
      const eleven = PARAMETERS.filter(([name]) => !name.includes('[in]')).slice(0, MAX_FILTERS + 1)
      const query = (params: ReadonlyArray<readonly [string, string]>) =>
        params.map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join('&')
      const refused = await api.request('GET', `/products?${query(eleven)}`)
      assert.equal(refused.status, 400, refused.text)
      assert.equal(refused.body.code, 'invalid_parameter')
      assert.equal(refused.body.errors[0].path, eleven[MAX_FILTERS]![0])
      assert.equal((await api.request('GET', `/products?${query(eleven.slice(0, MAX_FILTERS))}`)).status, 200)
    },
  )

  test('a shape runs unprepared until used often, then prepared, with the same answer', async () => {
    const query = { 'price[gte]': '100', currency: 'USD', sort: '-stock' }
    const before = api.deps.listShapes.preparedCount(products.collection)
    const first = await api.request('GET', `/products?${new URLSearchParams(query)}`)
    for (let i = 1; i < PREPARE_AFTER_USES; i++) await api.request('GET', `/products?${new URLSearchParams(query)}`)
    assert.equal(api.deps.listShapes.preparedCount(products.collection), before + 1)
    const prepared = await api.request('GET', `/products?${new URLSearchParams(query)}`)
    assert.equal(first.status, 200)
    assert.deepEqual(prepared.body, first.body)
    assert.ok(first.body.length > 0)
  })

  // Three times as many shapes used often as may be prepared, and many more used once: the bound must evict.
  const OFTEN = 3 * MAX_PREPARED_SHAPES
  const SHAPES = 2_000
  test(
    `${SHAPES} distinct ` +
      `shapes, ${OFTEN} of them ` +
      `sent ${PREPARE_AFTER_USES} times: every backend holds a bounded number of prepared statements`,
    async () => {
      const deps = api.deps
      const shapes = Array.from({ length: SHAPES }, (_, n) => shape(n))
      assert.equal(
        new Set(
          shapes.map(
            (q) =>
              JSON.stringify(
                Object.keys(q)
                  .filter((k) => k !== 'count')
                  .sort(),
              ) + q.sort,
          ),
        ).size,
        SHAPES,
        'the shapes are distinct',
      )
      // Listed straight through the list code, with the server's own pool: thousands of requests over HTTP would take
      // long here.
      for (let start = 0; start < shapes.length; start += 100) {
        await Promise.all(
          shapes.slice(start, start + 100).map(async (query, i) => {
            const uses = start + i < OFTEN ? PREPARE_AFTER_USES : 1
            for (let use = 0; use < uses; use++)
              assert.equal(
                (await listCollection(products.collection, checkedQuery(query), { services: deps })).status,
                200,
              )
          }),
        )
      }
      assert.equal(api.deps.listShapes.preparedCount(products.collection), MAX_PREPARED_SHAPES)
      const perBackend = await preparedPerBackend()
      // A shape is two statements (the page and its count); the service's own tagged statements are a few dozen more.
      for (const n of perBackend)
        assert.ok(n <= 2 * MAX_PREPARED_SHAPES + 100, `a backend holds ${n} prepared statements`)
      // And they still answer right, prepared or not.
      const late = await api.request('GET', '/products?stock=3&currency=USD&sort=-price&count=true')
      assert.equal(late.status, 200)
      const [{ n }] = await api.sql<
        [{ n: number }]
      >`SELECT count(*)::int AS n FROM products WHERE stock = 3 AND currency = 'USD'`
      assert.equal(Number(late.headers.get('x-total-count')), n)
    },
  )
})

/** A query as the pipeline hands it to the list code: read from text and checked. */
function checkedQuery(query: Record<string, string>) {
  const { value, errors } = products.collection.queryValidator.check(query)
  assert.deepEqual(errors, [])
  return value
}
