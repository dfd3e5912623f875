import assert from 'node:assert/strict'
import { test } from 'node:test'
import { defineCollection } from '../src/core/collections/declaration.js'
import {
  ListShapes,
  listStatements as compileWith,
  MAX_SHAPES_PER_COLLECTION,
  type ListRequest,
} from '../src/core/collections/list-sql.js'
import { apiKeys } from '../src/auth/api-keys/declaration.js'
import { products } from '../src/products/resource.js'
import { users } from '../src/users/resource.js'

const usersCollection = users.collection
const productsCollection = products.collection
const apiKeysCollection = apiKeys.collection
/** One instance's compiled shapes; the bound tests below make their own. */
let shapes = new ListShapes()
const listStatements = (collection: Parameters<typeof compileWith>[0], request: ListRequest) =>
  compileWith(collection, request, shapes)
const compiledShapes = (collection: Parameters<typeof compileWith>[0]) => shapes.compiledShapes(collection)

// Unit tests of the list SQL: the text compiled for each shape of request,
// the values in parameter order, and the bound on compiled shapes. No server,
// no database (the HTTP tests in collections.test.ts run these statements).

const USERS = 'SELECT "id", "name", "email", "role", "email_verified_at", "created_at", "updated_at" FROM "users"'
const PRODUCTS =
  'SELECT "id", "sku", "name", "description", "price", "currency", "stock", "created_at", "updated_at" FROM "products"'
const asc = (member: string) => ({ member, descending: false })
const desc = (member: string) => ({ member, descending: true })
const at = new Date('2025-01-01T08:00:00.007Z')

interface Case {
  name: string
  collection: typeof usersCollection
  request: ListRequest
  page: string
  pageValues: unknown[]
  count: string
  countValues: unknown[]
}

const cases: Case[] = [
  {
    name: 'a collection with a trash: its live rows',
    collection: productsCollection,
    request: { filters: [], sort: [asc('id')], limit: 50, trash: 'live' },
    page: `${PRODUCTS} WHERE "deleted_at" IS NULL ORDER BY "id" ASC LIMIT $1`,
    pageValues: [51],
    count: 'SELECT count(*)::int8 AS total FROM "products" WHERE "deleted_at" IS NULL',
    countValues: [],
  },
  {
    name: 'trashed=true: the trash, each row with its deleted_at, filtered as the live list',
    collection: productsCollection,
    request: {
      filters: [{ member: 'currency', op: 'eq', values: ['EUR'] }],
      sort: [asc('id')],
      limit: 50,
      trash: 'trashed',
    },
    page:
      PRODUCTS.replace('"updated_at" FROM', '"updated_at", "deleted_at" FROM') +
      ' WHERE "deleted_at" IS NOT NULL AND "currency" = $1 ORDER BY "id" ASC LIMIT $2',
    pageValues: ['EUR', 51],
    count: 'SELECT count(*)::int8 AS total FROM "products" WHERE "deleted_at" IS NOT NULL AND "currency" = $1',
    countValues: ['EUR'],
  },
  {
    name: 'default: sort by id, limit + 1 rows',
    collection: usersCollection,
    request: { filters: [], sort: [asc('id')], limit: 50 },
    page: `${USERS} ORDER BY "id" ASC LIMIT $1`,
    pageValues: [51],
    count: 'SELECT count(*)::int8 AS total FROM "users"',
    countValues: [],
  },
  {
    name: 'sort=-price: the tie-break on id runs the same way',
    collection: productsCollection,
    request: { filters: [], sort: [desc('price'), desc('id')], limit: 50 },
    page: `${PRODUCTS} ORDER BY "price" DESC, "id" DESC LIMIT $1`,
    pageValues: [51],
    count: 'SELECT count(*)::int8 AS total FROM "products"',
    countValues: [],
  },
  {
    name: 'a cursor page, one direction: a row comparison',
    collection: usersCollection,
    request: { filters: [], sort: [asc('id')], after: [90000], limit: 50 },
    page: `${USERS} WHERE ("id") > ($1) ORDER BY "id" ASC LIMIT $2`,
    pageValues: [90000, 51],
    count: 'SELECT count(*)::int8 AS total FROM "users"',
    countValues: [],
  },
  {
    name: 'a cursor page sorted by -price: row comparison with <',
    collection: productsCollection,
    request: { filters: [], sort: [desc('price'), desc('id')], after: [1999, 42], limit: 20 },
    page: `${PRODUCTS} WHERE ("price", "id") < ($1, $2) ORDER BY "price" DESC, "id" DESC LIMIT $3`,
    pageValues: [1999, 42, 21],
    count: 'SELECT count(*)::int8 AS total FROM "products"',
    countValues: [],
  },
  {
    name: 'mixed directions with a filter and a cursor: the OR expansion, each cursor value one parameter',
    collection: productsCollection,
    request: {
      filters: [{ member: 'currency', op: 'eq', values: ['EUR'] }],
      sort: [asc('currency'), desc('price'), desc('id')],
      after: ['EUR', 1999, 42],
      limit: 50,
    },
    page:
      `${PRODUCTS} WHERE "currency" = $1 AND ("currency" > $2 OR ("currency" = $2 AND "price" < $3) OR ("currency" = ` +
      `$2 AND "price" = $3 AND "id" < $4))` +
      ' ORDER BY "currency" ASC, "price" DESC, "id" DESC LIMIT $5',
    pageValues: ['EUR', 'EUR', 1999, 42, 51],
    count: 'SELECT count(*)::int8 AS total FROM "products" WHERE "currency" = $1',
    countValues: ['EUR'],
  },
  {
    name: 'a timestamp cursor keeps its Date (postgres.js sends it as timestamptz)',
    collection: usersCollection,
    request: { filters: [], sort: [desc('created_at'), desc('id')], after: [at, 7], limit: 10 },
    page: `${USERS} WHERE ("created_at", "id") < ($1, $2) ORDER BY "created_at" DESC, "id" DESC LIMIT $3`,
    pageValues: [at, 7, 11],
    count: 'SELECT count(*)::int8 AS total FROM "users"',
    countValues: [],
  },
  {
    name: 'every comparison operator',
    collection: productsCollection,
    request: {
      filters: [
        { member: 'price', op: 'ne', values: [5] },
        { member: 'price', op: 'gt', values: [1] },
        { member: 'price', op: 'gte', values: [2] },
        { member: 'stock', op: 'lt', values: [3] },
        { member: 'created_at', op: 'lte', values: [at] },
      ],
      sort: [asc('id')],
      limit: 1,
    },
    page:
      `${PRODUCTS} WHERE "price" <> $1 AND "price" > $2 AND "price" >= $3 AND "stock" < $4 AND "created_at" <= ` +
      `$5 ORDER BY "id" ASC LIMIT $6`,
    pageValues: [5, 1, 2, 3, at, 2],
    count:
      'SELECT count(*)::int8 AS total FROM "products" WHERE "price" <> $1 AND "price" > $2 AND "price" >= $3 AND ' +
      '"stock" < $4 AND "created_at" <= $5',
    countValues: [5, 1, 2, 3, at],
  },
  {
    name:
      'IN lists: one array parameter each, cast by member type; timestamps as text; bigints beyond 2^53 as exact ' +
      'text',
    collection: productsCollection,
    request: {
      filters: [
        { member: 'id', op: 'in', values: [1, '9223372036854775807'] },
        { member: 'name', op: 'in', values: ['a"b', 'c\\d', '{x}'] },
        { member: 'created_at', op: 'in', values: [at] },
      ],
      sort: [asc('id')],
      limit: 50,
    },
    page:
      `${PRODUCTS} WHERE "id" = ANY($1::int8[]) AND "name" = ANY($2::text[]) AND "created_at" = ` +
      `ANY($3::timestamptz[]) ORDER BY "id" ASC LIMIT $4`,
    pageValues: [[1, '9223372036854775807'], ['a"b', 'c\\d', '{x}'], ['2025-01-01T08:00:00.007Z'], 51],
    count:
      'SELECT count(*)::int8 AS total FROM "products" WHERE "id" = ANY($1::int8[]) AND "name" = ANY($2::text[]) AND ' +
      '"created_at" = ANY($3::timestamptz[])',
    countValues: [[1, '9223372036854775807'], ['a"b', 'c\\d', '{x}'], ['2025-01-01T08:00:00.007Z']],
  },
  {
    name: 'e-mail equality and IN are caseless (lower(email), values lower-cased); an order comparison is not',
    collection: usersCollection,
    request: {
      filters: [
        { member: 'email', op: 'eq', values: ['Mixed.Case@Example.COM'] },
        { member: 'email', op: 'ne', values: ['X@Y.Z'] },
        { member: 'email', op: 'gt', values: ['M'] },
        { member: 'email', op: 'in', values: ['A@B.C', 'x@y.z'] },
      ],
      sort: [asc('id')],
      limit: 50,
    },
    page:
      `${USERS} WHERE lower("email") = $1 AND lower("email") <> $2 AND "email" > $3 AND lower("email") = ` +
      `ANY($4::text[]) ORDER BY "id" ASC LIMIT $5`,
    pageValues: ['mixed.case@example.com', 'x@y.z', 'M', ['a@b.c', 'x@y.z'], 51],
    count:
      'SELECT count(*)::int8 AS total FROM "users" WHERE lower("email") = $1 AND lower("email") <> $2 AND "email" > ' +
      '$3 AND lower("email") = ANY($4::text[])',
    countValues: ['mixed.case@example.com', 'x@y.z', 'M', ['a@b.c', 'x@y.z']],
  },
  {
    name: 'q: one pattern parameter for every search column, after the filters; % _ \\ escaped',
    collection: usersCollection,
    request: {
      filters: [{ member: 'role', op: 'eq', values: ['admin'] }],
      q: '50%_\\x',
      sort: [asc('name'), asc('id')],
      limit: 50,
    },
    page: `${USERS} WHERE "role" = $1 AND ("name" ILIKE $2 OR "email" ILIKE $2) ORDER BY "name" ASC, "id" ASC LIMIT $3`,
    pageValues: ['admin', '%50\\%\\_\\\\x%', 51],
    count: 'SELECT count(*)::int8 AS total FROM "users" WHERE "role" = $1 AND ("name" ILIKE $2 OR "email" ILIKE $2)',
    countValues: ['admin', '%50\\%\\_\\\\x%'],
  },
  {
    name: 'q with a cursor: the pattern comes before the cursor values',
    collection: productsCollection,
    request: { filters: [], q: 'widget', sort: [asc('name'), desc('id')], after: ['Widget', 9], limit: 5 },
    page:
      `${PRODUCTS} WHERE ("sku" ILIKE $1 OR "name" ILIKE $1 OR "description" ILIKE $1) AND ("name" > $2 OR ` +
      `("name" = $2 AND "id" < $3)) ORDER BY "name" ASC, "id" DESC LIMIT $4`,
    pageValues: ['%widget%', 'Widget', 9, 6],
    count:
      'SELECT count(*)::int8 AS total FROM "products" WHERE ("sku" ILIKE $1 OR "name" ILIKE $1 OR "description" ' +
      'ILIKE $1)',
    countValues: ['%widget%'],
  },
  {
    name: 'offset: its own parameter after the limit',
    collection: productsCollection,
    request: {
      filters: [{ member: 'currency', op: 'eq', values: ['USD'] }],
      sort: [desc('price'), desc('id')],
      offset: 100,
      limit: 5,
    },
    page: `${PRODUCTS} WHERE "currency" = $1 ORDER BY "price" DESC, "id" DESC LIMIT $2 OFFSET $3`,
    pageValues: ['USD', 6, 100],
    count: 'SELECT count(*)::int8 AS total FROM "products" WHERE "currency" = $1',
    countValues: ['USD'],
  },
  {
    name: 'offset=0 is no offset',
    collection: productsCollection,
    request: { filters: [], sort: [asc('id')], offset: 0, limit: 3 },
    page: `${PRODUCTS} ORDER BY "id" ASC LIMIT $1`,
    pageValues: [4],
    count: 'SELECT count(*)::int8 AS total FROM "products"',
    countValues: [],
  },
  {
    name: 'API keys: the output columns only, never key_hash',
    collection: apiKeysCollection,
    request: { filters: [{ member: 'user_id', op: 'eq', values: ['42'] }], sort: [asc('id')], limit: 50 },
    page:
      'SELECT "id", "name", "prefix", "scopes", "created_at", "expires_at", "last_used_at", "user_id" FROM ' +
      '"api_keys" WHERE "user_id" = $1 ORDER BY "id" ASC LIMIT $2',
    pageValues: ['42', 51],
    count: 'SELECT count(*)::int8 AS total FROM "api_keys" WHERE "user_id" = $1',
    countValues: ['42'],
  },
]

for (const c of cases) {
  test(`list SQL, ${c.name}`, () => {
    const { page, count } = listStatements(c.collection, c.request)
    assert.equal(page.text, c.page)
    assert.deepEqual(page.values, c.pageValues)
    assert.equal(count.text, c.count)
    assert.deepEqual(count.values, c.countValues)
    // Compiled once: the same shape gives the very same text again.
    assert.equal(listStatements(c.collection, c.request).page.text, page.text)
  })
}

test('no client value is ever part of the text: hostile values give the same text as plain ones', () => {
  const hostile = [`x'; DROP TABLE users; --`, '$1', '"name"', 'a\\', '\u2028', "' OR '1'='1"]
  const shape = (v: string): ListRequest => ({
    filters: [
      { member: 'name', op: 'eq', values: [v] },
      { member: 'name', op: 'in', values: [v, v] },
      { member: 'email', op: 'ne', values: [v] },
    ],
    q: v,
    sort: [asc('name'), desc('id')],
    after: [v, 1],
    limit: 10,
  })
  const plain = listStatements(usersCollection, shape('plain'))
  for (const v of hostile) {
    const { page, count } = listStatements(usersCollection, shape(v))
    assert.equal(page.text, plain.page.text, v)
    assert.equal(count.text, plain.count.text, v)
    assert.ok(
      page.values.some((x) => x === v),
      v,
    )
  }
})

test('a list selects the output members (and sort keys) only: no password hash, key hash or version', () => {
  for (const collection of [usersCollection, productsCollection, apiKeysCollection]) {
    const { text } = listStatements(collection, { filters: [], sort: [asc('id')], limit: 1 }).page
    const selected = /^SELECT (.*) FROM /
      .exec(text)![1]!
      .split(', ')
      .map((c) => c.slice(1, -1))
    assert.deepEqual(selected, [...collection.outputMembers], collection.path)
    for (const secret of ['password_hash', 'key_hash', 'version', '*'])
      assert.ok(!selected.includes(secret), `${collection.path}: ${secret}`)
  }
})

test(
  'filter parameters are looked up in a table built once: member and operator for each name, in declaration ' + 'order',
  () => {
    const params = productsCollection.filterParameters
    assert.equal(params.size, Object.keys(productsCollection.members).length * 7)
    assert.deepEqual(params.get('price'), { member: 'price', op: 'eq', rank: 21 })
    assert.deepEqual(params.get('price[gte]'), { member: 'price', op: 'gte', rank: 24 })
    assert.deepEqual(params.get('created_at[in]'), { member: 'created_at', op: 'in', rank: 48 })
    for (const absent of ['price[eq]', 'price[like]', 'description', 'sort', 'limit', 'q', 'toString', '__proto__'])
      assert.equal(params.get(absent), undefined, absent)
    const ranks = [...params.values()].map((p) => p.rank)
    assert.deepEqual(
      ranks,
      [...ranks].sort((a, b) => a - b),
    )
  },
)

test('defineCollection refuses a name that is not a plain SQL identifier', () => {
  const base = {
    table: 'products' as const,
    path: '/x',
    members: { id: { type: 'integer' as const, minimum: 1, maximum: 10 } },
    searchColumns: ['name'],
    outputMembers: ['id'],
    serializePage: () => '[]',
  }
  for (const bad of ['Name', 'na"me', 'name; --', 'a b', '1a', '']) {
    assert.throws(() => defineCollection({ ...base, outputMembers: ['id', bad] }), /is not a plain SQL identifier/, bad)
    assert.throws(
      () => defineCollection({ ...base, members: { ...base.members, [bad]: { type: 'text' } } }),
      /is not a plain SQL identifier/,
      bad,
    )
  }
})

test(
  'defineCollection refuses a filterable member that is not part of the representation (rows are sent as ' +
    'selected)',
  () => {
    const base = {
      table: 'products' as const,
      path: '/x',
      members: { id: { type: 'integer' as const, minimum: 1, maximum: 10 } },
      searchColumns: ['name'],
      outputMembers: ['id'],
      serializePage: () => '[]',
    }
    assert.throws(
      () => defineCollection({ ...base, members: { ...base.members, secret: { type: 'text' } } }),
      /member "secret" is not one of outputMembers/,
    )
    assert.doesNotThrow(() => defineCollection(base))
  },
)

/** A collection of its own (so a cache of its own) and more distinct shapes of request than the bound. */
function manyShapes() {
  shapes = new ListShapes()
  const collection = defineCollection({
    table: 'products',
    path: '/bounded',
    members: {
      id: { type: 'integer', minimum: 1, maximum: 1e9 },
      name: { type: 'text' },
      price: { type: 'integer', minimum: 0, maximum: 1e9 },
      stock: { type: 'integer', minimum: 0, maximum: 1e9 },
    },
    searchColumns: ['name'],
    serializePage: () => '[]',
    outputMembers: ['id', 'name', 'price', 'stock'],
  })
  const members = Object.keys(collection.members)
  const requests: ListRequest[] = []
  // Every filter parameter alone, under every two-key sort in every direction.
  for (const { member, op } of collection.filterParameters.values()) {
    for (const a of members) {
      for (const b of members) {
        if (a === b) continue
        for (const [da, db] of [
          [false, false],
          [true, true],
          [false, true],
          [true, false],
        ] as const) {
          requests.push({
            filters: [{ member, op, values: [1] }],
            sort: [
              { member: a, descending: da },
              { member: b, descending: db },
            ],
            limit: 10,
          })
        }
      }
    }
  }
  assert.ok(requests.length > 2 * MAX_SHAPES_PER_COLLECTION, `${requests.length} shapes`)
  return { collection, requests }
}

test('the compiled shapes of a collection stay bounded; an IN list of any length is one shape', () => {
  const { collection, requests } = manyShapes()
  for (let n = 1; n <= 100; n++) {
    listStatements(collection, {
      filters: [{ member: 'id', op: 'in', values: Array.from({ length: n }, (_, i) => i + 1) }],
      sort: [asc('id')],
      limit: 10,
    })
  }
  assert.equal(compiledShapes(collection).length, 1)

  const first = listStatements(collection, requests[0]!).page.text
  for (const r of requests) {
    listStatements(collection, r)
    assert.ok(compiledShapes(collection).length <= MAX_SHAPES_PER_COLLECTION)
  }
  assert.equal(compiledShapes(collection).length, MAX_SHAPES_PER_COLLECTION)
  // An evicted shape is compiled again, to the same text.
  assert.equal(listStatements(collection, requests[0]!).page.text, first)
})

test('the least recently used shape is the one evicted: a shape in steady use stays compiled', () => {
  const { collection, requests } = manyShapes()
  const hot: ListRequest = { filters: [], sort: [desc('price'), desc('id')], limit: 50 }
  listStatements(collection, hot)
  const hotShape = compiledShapes(collection)[0]!
  listStatements(collection, requests[0]!)
  const coldShape = compiledShapes(collection).at(-1)!
  for (const r of requests.slice(1)) {
    listStatements(collection, r)
    listStatements(collection, hot)
  }
  assert.ok(compiledShapes(collection).includes(hotShape), 'the shape in use is kept')
  assert.ok(!compiledShapes(collection).includes(coldShape), 'a shape used once is evicted')
})
