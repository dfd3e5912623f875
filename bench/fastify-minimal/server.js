// A peer of the service for `make bench`: the benchmarked endpoints as the
// minimal idiomatic Fastify 5 server a user would write in an afternoon.
// Route schemas (Fastify's defaults: Ajv for params, query strings and
// bodies, fast-json-stringify for the responses), @fastify/jwt verifying the
// service's HS256 JWT, the published postgres.js, and nothing else: no
// request log (Fastify's default), no request ids, no ETags or If-Match, no
// Link headers, no API keys, no revocation or session check, no events.
// bench/fastify is the other Fastify peer, the one that does the service's
// work; this one is what users compare the service with.
//
// What it must share with the service is the answers to the benchmark's
// requests: the same rows with the same JSON members, byte for byte
// (bench/peers-check.ts checks the requests this server serves), and the
// same authorization (scopes and roles from the token). A password given to
// POST /users is hashed as the service hashes it (src/auth/password.ts:
// scrypt N=2^15, r=8, p=3, 16-byte salt, 32-byte key, node:crypto), so a
// write with a password costs both the same hashing.
//
// Start: `npm ci` in this folder, then `node bench/fastify-minimal/server.js`.
// Environment: PORT, HOST (127.0.0.1), DATABASE_URL (a `host=/dir` query
// parameter names a Unix socket folder), DATABASE_POOL_MAX (10),
// BENCH_JWT_SECRET (the UTF-8 secret), JWT_ISSUER
// and JWT_AUDIENCE (users-products-api).

import { randomBytes, scrypt } from 'node:crypto'
import { promisify } from 'node:util'
import fastifyJwt from '@fastify/jwt'
import Fastify from 'fastify'
import postgres from 'postgres'

const env = process.env
if (!env.BENCH_JWT_SECRET || !env.DATABASE_URL) {
  process.stderr.write('fastify-minimal peer: BENCH_JWT_SECRET and DATABASE_URL are required\n')
  process.exit(2)
}
const issuer = env.JWT_ISSUER || 'users-products-api'

// A `host` query parameter is a Unix socket folder (the local cluster); int8 ids and prices as numbers.
const url = new URL(env.DATABASE_URL)
const socketDir = url.searchParams.get('host')
if (socketDir) url.searchParams.delete('host')
const sql = postgres(url.toString(), {
  ...(socketDir ? { host: socketDir } : {}),
  max: Number(env.DATABASE_POOL_MAX || 10),
  onnotice: () => {},
  connection: { application_name: 'upa-bench-fastify-minimal' },
  types: { int8: { to: 20, from: [20], serialize: (x) => String(x), parse: (x) => Number(x) } },
})

const app = Fastify()
app.addContentTypeParser(
  'application/merge-patch+json',
  { parseAs: 'string' },
  app.getDefaultJsonParser('error', 'error'),
)
await app.register(fastifyJwt, {
  secret: env.BENCH_JWT_SECRET,
  verify: { algorithms: ['HS256'], allowedIss: issuer, allowedAud: env.JWT_AUDIENCE || issuer },
})

/**
 * onRequest: a valid token with `scope`, from an admin, or from
 * anyone (`any`), or from the user the path names (`self`).
 */
const allow =
  (scope, who = 'admin') =>
  async (request, reply) => {
    try {
      await request.jwtVerify()
    } catch {
      return reply.code(401).send({ message: 'Unauthorized' })
    }
    const { sub, role, scope: scopes } = request.user
    if (!String(scopes).split(' ').includes(scope)) return reply.code(403).send({ message: 'Forbidden' })
    // (onRequest runs before the params are validated: the id is still the path's text.)
    if (who !== 'any' && role !== 'admin' && !(who === 'self' && request.params.id === sub))
      return reply.code(403).send({ message: 'Forbidden' })
  }

const date = { type: 'string', format: 'date-time' }
const user = {
  type: 'object',
  properties: {
    id: { type: 'integer' },
    name: { type: 'string' },
    email: { type: 'string' },
    role: { type: 'string' },
    email_verified_at: { type: ['string', 'null'], format: 'date-time' },
    created_at: date,
    updated_at: date,
  },
}
const product = {
  type: 'object',
  properties: {
    id: { type: 'integer' },
    sku: { type: 'string' },
    name: { type: 'string' },
    description: { type: 'string' },
    price: { type: 'integer' },
    currency: { type: 'string' },
    stock: { type: 'integer' },
    created_at: date,
    updated_at: date,
  },
}
const byId = { type: 'object', properties: { id: { type: 'integer', minimum: 1 } } }
const page = (item) => ({
  type: 'object',
  properties: {
    limit: { type: 'integer', minimum: 1, maximum: 200, default: 50 },
    'id[gt]': { type: 'integer', default: 0 },
    fields: {
      type: 'string',
      pattern: `^(${Object.keys(item.properties).join('|')})(,(${Object.keys(item.properties).join('|')}))*$`,
    },
  },
})
const only = (fields) => (row) => Object.fromEntries(fields.split(',').map((f) => [f, row[f]]))

const USER = sql`id, name, email, role, email_verified_at, created_at, updated_at`
const PRODUCT = sql`id, sku, name, description, price, currency, stock, created_at, updated_at`

app.get('/healthz', async () => ({ status: 'ok' }))

app.get(
  '/users/:id',
  { onRequest: allow('users:read', 'self'), schema: { params: byId, response: { 200: user } } },
  async (request, reply) => {
    const [row] = await sql`SELECT ${USER} FROM users WHERE id = ${request.params.id}`
    return row ?? reply.code(404).send({ message: 'Not Found' })
  },
)

app.get(
  '/users',
  {
    onRequest: allow('users:read'),
    schema: { querystring: page(user), response: { 200: { type: 'array', items: user } } },
  },
  async (request) => {
    const q = request.query
    const rows = await sql`SELECT ${USER} FROM users WHERE id > ${q['id[gt]']} ORDER BY id LIMIT ${q.limit}`
    return q.fields ? rows.map(only(q.fields)) : rows
  },
)

const hashPassword = async (password) => {
  const salt = randomBytes(16)
  const N = 2 ** 15,
    r = 8,
    p = 3
  const key = await promisify(scrypt)(password.normalize('NFC'), salt, 32, { N, r, p, maxmem: 256 * N * r })
  return `scrypt$${N}$${r}$${p}$${salt.toString('base64')}$${key.toString('base64')}`
}

const newUser = {
  type: 'object',
  required: ['name', 'email'],
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 200 },
    email: { type: 'string', format: 'email', maxLength: 254 },
    role: { type: 'string', enum: ['admin', 'user'], default: 'user' },
    password: { type: 'string', minLength: 8, maxLength: 256 },
  },
}

app.post(
  '/users',
  { onRequest: allow('users:write'), schema: { body: newUser, response: { 201: user } } },
  async (request, reply) => {
    const { name, email, role, password } = request.body
    const passwordHash = password === undefined ? null : await hashPassword(password)
    try {
      const [row] = await sql`INSERT INTO users (name, email, role, password_hash) VALUES
          (${name}, ${email}, ${role}, ${passwordHash}) RETURNING ${USER}`
      return reply.code(201).send(row)
    } catch (err) {
      if (err.code === '23505') return reply.code(409).send({ message: 'E-mail address already in use' })
      throw err
    }
  },
)

app.get(
  '/products/:id',
  { onRequest: allow('products:read', 'any'), schema: { params: byId, response: { 200: product } } },
  async (request, reply) => {
    const [row] = await sql`SELECT ${PRODUCT} FROM products WHERE id = ${request.params.id}`
    return row ?? reply.code(404).send({ message: 'Not Found' })
  },
)

app.get(
  '/products',
  {
    onRequest: allow('products:read', 'any'),
    schema: { querystring: page(product), response: { 200: { type: 'array', items: product } } },
  },
  async (request) => {
    const q = request.query
    const rows = await sql`SELECT ${PRODUCT} FROM products WHERE id > ${q['id[gt]']} ORDER BY id LIMIT ${q.limit}`
    return q.fields ? rows.map(only(q.fields)) : rows
  },
)

const newProduct = {
  type: 'object',
  required: ['sku', 'name', 'price', 'currency'],
  properties: {
    sku: { type: 'string', minLength: 1, maxLength: 64 },
    name: { type: 'string', minLength: 1, maxLength: 200 },
    description: { type: 'string', maxLength: 10000 },
    price: { type: 'integer', minimum: 0 },
    currency: { type: 'string', minLength: 3, maxLength: 3 },
    stock: { type: 'integer', minimum: 0 },
  },
}

const insertProduct = (db, { sku, name, description = '', price, currency, stock = 0 }) =>
  db`INSERT INTO products (sku, name, description, price, currency, stock)
      VALUES (${sku}, ${name}, ${description}, ${price}, ${currency}, ${stock}) RETURNING ${PRODUCT}`

app.post(
  '/products',
  { onRequest: allow('products:write'), schema: { body: newProduct, response: { 201: product } } },
  async (request, reply) => {
    try {
      const [row] = await insertProduct(sql, request.body)
      return reply.code(201).send(row)
    } catch (err) {
      if (err.code === '23505') return reply.code(409).send({ message: 'SKU already in use' })
      throw err
    }
  },
)

// Product creations in one transaction: all or none.
const batch = {
  type: 'object',
  required: ['operations'],
  properties: {
    operations: {
      type: 'array',
      minItems: 1,
      maxItems: 100,
      items: {
        type: 'object',
        required: ['method', 'path', 'body'],
        properties: { method: { const: 'POST' }, path: { const: '/products' }, body: newProduct },
      },
    },
  },
}
const results = {
  type: 'object',
  properties: {
    results: { type: 'array', items: { type: 'object', properties: { status: { type: 'integer' }, body: product } } },
  },
}

app.post(
  '/batch',
  {
    onRequest: allow('products:write'),
    bodyLimit: 10 * 1024 * 1024,
    schema: { body: batch, response: { 200: results } },
  },
  async (request, reply) => {
    try {
      const rows = await sql.begin(async (tx) => {
        const out = []
        for (const op of request.body.operations) out.push((await insertProduct(tx, op.body))[0])
        return out
      })
      return { results: rows.map((row) => ({ status: 201, body: row })) }
    } catch (err) {
      if (err.code === '23505') return reply.code(409).send({ message: 'SKU already in use' })
      throw err
    }
  },
)

const productChanges = {
  type: 'object',
  minProperties: 1,
  properties: {
    sku: { type: 'string', minLength: 1, maxLength: 64 },
    name: { type: 'string', minLength: 1, maxLength: 200 },
    description: { type: 'string', maxLength: 10000 },
    price: { type: 'integer', minimum: 0 },
    currency: { type: 'string', minLength: 3, maxLength: 3 },
    stock: { type: 'integer', minimum: 0 },
  },
}

app.patch(
  '/products/:id',
  { onRequest: allow('products:write'), schema: { params: byId, body: productChanges, response: { 200: product } } },
  async (request, reply) => {
    const changes = request.body
    const [row] = await sql`UPDATE products
        SET ${sql(changes, Object.keys(changes))}, updated_at = now()
          WHERE id = ${request.params.id} RETURNING ${PRODUCT}`
    return row ?? reply.code(404).send({ message: 'Not Found' })
  },
)

await app.listen({ port: Number(env.PORT || 3200), host: env.HOST || '127.0.0.1' })

for (const signal of ['SIGTERM', 'SIGINT']) {
  process.once(signal, async () => {
    await app.close()
    await sql.end({ timeout: 5 })
    process.exit(0)
  })
}
