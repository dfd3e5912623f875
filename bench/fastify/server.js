// A peer of the service for `make bench`: the endpoints the benchmark measures
// as an idiomatic Fastify 5 application. Route JSON schemas validate params,
// query strings and bodies (Ajv) and serialize responses (fast-json-stringify);
// @fastify/jwt checks the HS256 JWT; postgres.js is the published 3.4.9,
// unpatched. It shares no code with the service; what it must share is the
// answers: byte for byte the same bodies and statuses for the benchmark's
// requests (bench/peers-check.ts checks this), and comparable work per request:
// the same SQL, a JWT verified on every request, and one JSON log line per
// request on stdout (pino, from an onResponse hook).
//
// Start: `npm ci` in this folder, then `node bench/fastify/server.js`.
// Environment: PORT, HOST (127.0.0.1), DATABASE_URL (a `host=/dir` query
// parameter names a Unix socket folder), DATABASE_POOL_MAX (10),
// BENCH_JWT_SECRET (the UTF-8 secret), BENCH_JWT_KID (bench), JWT_ISSUER and
// JWT_AUDIENCE (users-products-api).

import { createHash, randomUUID } from 'node:crypto'
import fastifyJwt from '@fastify/jwt'
import Fastify, { LogController } from 'fastify'
import postgres from 'postgres'

const env = process.env

function required(name) {
  const value = env[name]
  if (!value) {
    process.stderr.write(`fastify peer: ${name} is required\n`)
    process.exit(2)
  }
  return value
}

const jwtSecret = required('BENCH_JWT_SECRET')
const jwtKid = env.BENCH_JWT_KID || 'bench'
const issuer = env.JWT_ISSUER || 'users-products-api'
const audience = env.JWT_AUDIENCE || 'users-products-api'

// ---- database ----------------------------------------------------------------

// The pool settings of the service (src/core/db/connect.ts): a `host` query
// parameter is a Unix socket folder, which postgres.js would otherwise send to
// the server as a setting; int8 columns (ids, prices) come back as numbers.
const url = new URL(required('DATABASE_URL'))
const socketDir = url.searchParams.get('host')
if (socketDir) url.searchParams.delete('host')
const sql = postgres(url.toString(), {
  ...(socketDir ? { host: socketDir } : {}),
  max: Number(env.DATABASE_POOL_MAX || 10),
  connect_timeout: 5,
  idle_timeout: 60,
  max_lifetime: 60 * 30,
  onnotice: () => {},
  connection: { application_name: 'upa-bench-fastify', statement_timeout: 5000 },
  types: { int8: { to: 20, from: [20], serialize: (x) => String(x), parse: (x) => Number(x) } },
})

// ---- the application -----------------------------------------------------------

const CLIENT_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/
const httpError = (statusCode, message) => Object.assign(new Error(message), { statusCode })

const app = Fastify({
  // pino, configured for the same line shape as the service's log: ISO time,
  // the level as a word, no pid/hostname. Request logging is ours (onResponse).
  logger: {
    level: 'info',
    base: null,
    timestamp: () => `,"time":"${new Date().toISOString()}"`,
    formatters: { level: (label) => ({ level: label }) },
  },
  // (Fastify 5.12's place for the `disableRequestLogging: true` and
  // `requestIdLogLabel` options, which are deprecated at the top level.)
  logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: 'request_id' }),
  // The client's X-Request-Id when it is a sane one, else a UUID, as the service does.
  genReqId: (req) => {
    const given = req.headers['x-request-id']
    return typeof given === 'string' && CLIENT_REQUEST_ID.test(given) ? given : randomUUID()
  },
  keepAliveTimeout: 65_000,
  // Unknown query parameters and body members are refused (400), as by the
  // service's schemas, rather than silently dropped (Fastify's default).
  ajv: { customOptions: { removeAdditional: false } },
})

// A JSON API: bodies are JSON (415 otherwise, as the service answers), and
// merge patches (RFC 7396) are JSON under their own media type.
app.removeContentTypeParser('text/plain')
app.addContentTypeParser(
  'application/merge-patch+json',
  { parseAs: 'string' },
  app.getDefaultJsonParser('error', 'error'),
)

// The JWT: HS256 only; signature (timingSafeEqual), exp, iss and aud checked
// by fast-jwt on every request (its verification cache is off, the default;
// the bare peer verifies every request too). The key is looked up by the
// header's kid, as with key rotation; a token without kid gets the one key.
await app.register(fastifyJwt, {
  secret: (request, token, done) =>
    token.header.kid === undefined || token.header.kid === jwtKid
      ? done(null, jwtSecret)
      : done(httpError(401, 'unknown kid')),
  decode: { complete: true },
  verify: {
    algorithms: ['HS256'],
    allowedIss: issuer,
    allowedAud: audience,
    requiredClaims: ['exp', 'sub', 'role', 'scope'],
  },
})

// ---- credentials -------------------------------------------------------------

const API_KEY = /^upa_ak_[A-Za-z0-9_-]{43}$/

/** last_used_at is kept to the minute: this process sends the UPDATE at most once a minute per key. */
const keyWrittenAt = new Map()

// The service's SQL for an API key (src/auth/api-keys/credential.ts), statement for statement.
async function apiKeyCaller(key) {
  if (!API_KEY.test(key)) throw httpError(401, 'The credential is invalid, expired or revoked.')
  const hash = createHash('sha256').update(key).digest()
  const [row] = await sql`
      SELECT u.id AS user_id, u.role, k.scopes, k.expires_at, k.id AS api_key_id
      FROM api_keys k JOIN users u ON u.id = k.user_id
      WHERE k.key_hash = ${hash} AND (k.expires_at IS NULL OR k.expires_at > now())`
  if (!row) throw httpError(401, 'The credential is invalid, expired or revoked.')
  const now = Date.now()
  if (!(now - (keyWrittenAt.get(row.api_key_id) ?? -Infinity) < 60_000)) {
    keyWrittenAt.set(row.api_key_id, now)
    await sql`UPDATE api_keys SET last_used_at = now() WHERE id = ${row.api_key_id} AND (last_used_at IS NULL
      OR last_used_at < now() - interval '1 minute')`
  }
  return { userId: String(row.user_id), role: row.role, scopes: row.scopes }
}

/**
 * An onRequest hook for a route: the caller (X-API-Key or a Bearer JWT) must
 * have `scope` (null: any scope, the route authorizes further itself), and be
 * an admin unless `who` is 'any' (or 'admin-or-self' and the path's id is its
 * own). Runs before the body is read, as in the service.
 */
function guard(scope, who) {
  return async function authorize(request) {
    const apiKey = request.headers['x-api-key']
    if (apiKey !== undefined && request.headers.authorization !== undefined)
      throw httpError(400, 'Send one credential, not both Authorization and X-API-Key.')
    let caller
    if (typeof apiKey === 'string') {
      caller = await apiKeyCaller(apiKey.trim())
    } else {
      const claims = await request.jwtVerify()
      if (typeof claims.scope !== 'string' || typeof claims.role !== 'string' || typeof claims.sub !== 'string')
        throw httpError(401, 'The credential is invalid.')
      caller = { userId: claims.sub, role: claims.role, scopes: claims.scope.split(' ') }
    }
    request.caller = caller
    permit(caller, scope, who, request.params.id)
  }
}

/** The caller must have `scope` (unless null) and be an admin, unless `who` lets others in. */
function permit(caller, scope, who, id) {
  if (scope !== null && !caller.scopes.includes(scope))
    throw httpError(403, `This credential lacks the scope ${scope}.`)
  if (!(caller.role === 'admin' || who === 'any' || (who === 'admin-or-self' && id === caller.userId)))
    throw httpError(403, 'This credential may not do this.')
}
app.decorateRequest('caller', null)
/** POST /batch: the operations it ran, for its log line (as the service logs them). */
app.decorateRequest('operations', null)

// ---- logging -------------------------------------------------------------------

app.addHook('onRequest', async (request, reply) => {
  reply.header('x-request-id', request.id)
})

// One line per request, the fields the service logs; request_id comes from the request's child logger.
app.addHook('onResponse', async (request, reply) => {
  request.log.info(
    {
      method: request.method,
      route: request.routeOptions.url ?? null,
      status: reply.statusCode,
      duration_ms: reply.elapsedTime,
      user_id: request.caller?.userId ?? null,
      client: request.ip,
      ...(request.operations !== null ? { operations: request.operations } : {}),
    },
    'request',
  )
})

// The service's statuses where Fastify's defaults differ: a malformed id cannot
// name a resource (404, as the service's router answers); a body that is JSON
// but breaks the schema is 422 (malformed JSON stays 400).
app.setErrorHandler((error, request, reply) => {
  if (error.validation && error.validationContext === 'params')
    return reply.code(404).send({ statusCode: 404, error: 'Not Found', message: 'Not found.' })
  if (error.validation && error.validationContext === 'body') error.statusCode = 422
  // @fastify/jwt maps only some of fast-jwt's refusals to 401 (a token of another algorithm would be a 500).
  if (typeof error.code === 'string' && (error.code.startsWith('FAST_JWT_') || error.code.startsWith('FST_JWT_')))
    error.statusCode = 401
  // With request logging off, the default handler no longer logs failures: a 500 is logged here.
  if (!(error.statusCode < 500)) request.log.error({ err: error }, 'unhandled error')
  throw error
})

// ---- schemas -------------------------------------------------------------------

// Representations: the members of the service's, in the same order
// (fast-json-stringify writes them in schema order). Timestamps are Dates from
// postgres.js, written as toISOString() gives them.
const timestamp = { type: 'string', format: 'date-time' }
const userMembers = {
  id: { type: 'integer' },
  name: { type: 'string' },
  email: { type: 'string' },
  role: { type: 'string', enum: ['admin', 'user'] },
  email_verified_at: { type: ['string', 'null'], format: 'date-time' },
  created_at: timestamp,
  updated_at: timestamp,
}
const productMembers = {
  id: { type: 'integer' },
  sku: { type: 'string' },
  name: { type: 'string' },
  description: { type: 'string' },
  price: { type: 'integer', minimum: 0 },
  currency: { type: 'string' },
  stock: { type: 'integer', minimum: 0 },
  created_at: timestamp,
  updated_at: timestamp,
}
const userSchema = { type: 'object', properties: userMembers, required: Object.keys(userMembers) }
const productSchema = { type: 'object', properties: productMembers, required: Object.keys(productMembers) }
// Page items may leave members out (`fields`).
const userPage = { type: 'array', items: { type: 'object', properties: userMembers } }
const productPage = { type: 'array', items: { type: 'object', properties: productMembers } }

const idParams = {
  type: 'object',
  properties: { id: { type: 'string', pattern: '^[1-9][0-9]{0,18}$' } },
  required: ['id'],
}

/** `fields`: comma-separated members of the representation. */
const fieldsOf = (members) => {
  const one = `(${Object.keys(members).join('|')})`
  return { type: 'string', maxLength: 500, pattern: `^${one}(,${one})*$` }
}

const MAX_SAFE = Number.MAX_SAFE_INTEGER
/**
 * A list's query: page size, offset, member selection, sort, the `id[gt]`
 * filter, and `after` (the next-page cursor of our Link header: the last row's
 * sort keys). `after` and `offset` exclude each other.
 */
const listQuery = (members, sorts) => ({
  type: 'object',
  additionalProperties: false,
  properties: {
    limit: { type: 'integer', minimum: 1, maximum: 200, default: 50 },
    offset: { type: 'integer', minimum: 0, maximum: 100_000 },
    fields: fieldsOf(members),
    sort: { type: 'string', enum: sorts, default: 'id' },
    'id[gt]': { type: 'integer', minimum: -MAX_SAFE, maximum: MAX_SAFE },
    after: { type: 'string', pattern: '^[0-9]{1,16}(,[0-9]{1,16})?$' },
  },
  not: { required: ['after', 'offset'] },
})

// The rules of the service's schemas (src/users/resource.ts, src/products/resource.ts, src/core/resources/common.ts).
const nameRule = {
  type: 'string',
  minLength: 1,
  maxLength: 200,
  pattern: '^(?=[\\s\\S]*[^\\s])[^\\u0000-\\u001f\\u007f-\\u009f]*$',
}
const userCreate = {
  type: 'object',
  additionalProperties: false,
  required: ['name', 'email'],
  properties: {
    name: nameRule,
    email: {
      type: 'string',
      maxLength: 254,
      pattern:
        "^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$",
    },
    role: { type: 'string', enum: ['admin', 'user'] },
  },
}
// A new product: what the service requires and accepts (null: the member's default).
const productCreate = {
  type: 'object',
  additionalProperties: false,
  required: ['sku', 'name', 'price', 'currency'],
  properties: {
    sku: { type: 'string', pattern: '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' },
    name: nameRule,
    description: {
      type: ['string', 'null'],
      maxLength: 10000,
      pattern: '^[^\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f]*$',
    },
    price: { type: 'integer', minimum: 0, maximum: 1_000_000_000_000 },
    currency: { type: 'string', enum: Intl.supportedValuesOf('currency') },
    stock: { type: ['integer', 'null'], minimum: 0, maximum: 2_147_483_647 },
  },
}
// A merge patch: every member optional, null puts description and stock back to their defaults; read-only members may
// be echoed.
const productPatch = {
  type: 'object',
  additionalProperties: false,
  properties: {
    sku: { type: 'string', pattern: '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' },
    name: nameRule,
    description: {
      type: ['string', 'null'],
      maxLength: 10000,
      pattern: '^[^\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f]*$',
    },
    price: { type: 'integer', minimum: 0, maximum: 1_000_000_000_000 },
    currency: { type: 'string', enum: Intl.supportedValuesOf('currency') },
    stock: { type: ['integer', 'null'], minimum: 0, maximum: 2_147_483_647 },
    id: { type: 'integer', minimum: 1 },
    created_at: { type: 'string', maxLength: 64 },
    updated_at: { type: 'string', maxLength: 64 },
  },
}
const PRODUCT_WRITABLE = ['sku', 'name', 'description', 'price', 'currency', 'stock']
const PRODUCT_DEFAULTS = { description: '', stock: 0 }

const etag = (version) => `"v${version}"`

/** The columns of a new product: those given, null meaning the column's default. */
function newProduct(body) {
  const row = { sku: body.sku, name: body.name, price: body.price, currency: body.currency }
  for (const k of ['description', 'stock'])
    if (body[k] !== undefined) row[k] = body[k] === null ? PRODUCT_DEFAULTS[k] : body[k]
  return row
}

/** Inserts a product on `db` (the pool or a transaction): the row, or 409 for a SKU in use. */
async function insertProduct(db, body) {
  try {
    const [row] = await db`INSERT INTO products ${db(newProduct(body))} RETURNING *`
    return row
  } catch (err) {
    if (err.code === '23505' && err.constraint_name === 'products_sku_key')
      throw httpError(409, 'A product with this sku already exists.')
    throw err
  }
}

/** If-Match with the strong comparison (RFC 9110 §13.1.1), as the service checks it. */
function ifMatchHolds(header, version) {
  if (header === undefined) return true
  const current = etag(version)
  return header.split(',').some((t) => {
    const tag = t.trim()
    return tag === '*' || tag === current
  })
}

/** The Link to the next page: the same query, with `after` the last row's sort keys. */
function nextLink(request, after) {
  const params = new URLSearchParams(request.query)
  params.delete('offset')
  params.set('after', after)
  return `<${request.routeOptions.url}?${params}>; rel="next"`
}

/** Only the members `fields` asks for; the response schema writes them in representation order. */
function pick(fields) {
  const wanted = fields.split(',')
  return (row) => {
    const out = {}
    for (const f of wanted) out[f] = row[f]
    return out
  }
}

// ---- routes ----------------------------------------------------------------------

app.get('/healthz', async () => ({ status: 'ok' }))

app.get(
  '/users',
  {
    onRequest: guard('users:read', 'admin'),
    schema: { querystring: listQuery(userMembers, ['id']), response: { 200: userPage } },
  },
  async (request, reply) => {
    const q = request.query
    const idGt = q['id[gt]']
    const after = q.after?.split(',').map(Number)
    if (after && after.length !== 1) throw httpError(400, 'after: is not a cursor of this sort')
    // The service's statement for sort=id: the representation's columns, one row more than the page to know if there is
    // a next one.
    const rows = await sql`
    SELECT id, name, email, role, email_verified_at, created_at, updated_at FROM users
    WHERE true ${idGt !== undefined ? sql`AND id > ${idGt}` : sql``} ${after ? sql`AND id > ${after[0]}` : sql``}
    ORDER BY id ASC LIMIT ${q.limit + 1} ${q.offset ? sql`OFFSET ${q.offset}` : sql``}`
    if (rows.length > q.limit) {
      rows.pop()
      reply.header('link', nextLink(request, rows[rows.length - 1].id))
    }
    return q.fields ? rows.map(pick(q.fields)) : rows
  },
)

app.post(
  '/users',
  {
    onRequest: guard('users:write', 'admin'),
    schema: { body: userCreate, response: { 201: userSchema } },
  },
  async (request, reply) => {
    const { name, email, role = 'user' } = request.body
    try {
      const [row] = await sql`INSERT INTO users ${sql({ name, email, role })} RETURNING *`
      return reply.code(201).header('etag', etag(row.version)).header('location', `/users/${row.id}`).send(row)
    } catch (err) {
      if (err.code === '23505' && err.constraint_name === 'users_email_key')
        throw httpError(409, 'A user with this email already exists.')
      throw err
    }
  },
)

app.get(
  '/users/:id',
  {
    onRequest: guard('users:read', 'admin-or-self'),
    schema: { params: idParams, response: { 200: userSchema } },
  },
  async (request, reply) => {
    const [row] = await sql`SELECT * FROM users WHERE id = ${request.params.id}`
    if (!row) throw httpError(404, 'Not found.')
    reply.header('etag', etag(row.version))
    return row
  },
)

app.get(
  '/products',
  {
    onRequest: guard('products:read', 'any'),
    schema: { querystring: listQuery(productMembers, ['id', '-price']), response: { 200: productPage } },
  },
  async (request, reply) => {
    const q = request.query
    const byPrice = q.sort === '-price'
    const idGt = q['id[gt]']
    const after = q.after?.split(',').map(Number)
    if (after && after.length !== (byPrice ? 2 : 1)) throw httpError(400, 'after: is not a cursor of this sort')
    // The service's statements for sort=id and sort=-price (ties by id, in the same direction).
    const rows = await sql`
    SELECT id, sku, name, description, price, currency, stock, created_at, updated_at FROM products
    WHERE true ${idGt !== undefined ? sql`AND id > ${idGt}` : sql``}
      ${after ? (byPrice ? sql`AND (price, id) < (${after[0]}, ${after[1]})` : sql`AND id > ${after[0]}`) : sql``}
    ORDER BY ${
      byPrice
        ? sql`price DESC, id
      DESC`
        : sql`id ASC`
    } LIMIT ${q.limit + 1} ${q.offset ? sql`OFFSET ${q.offset}` : sql``}`
    if (rows.length > q.limit) {
      rows.pop()
      const last = rows[rows.length - 1]
      reply.header('link', nextLink(request, byPrice ? `${last.price},${last.id}` : last.id))
    }
    return q.fields ? rows.map(pick(q.fields)) : rows
  },
)

app.post(
  '/products',
  {
    onRequest: guard('products:write', 'admin'),
    schema: { body: productCreate, response: { 201: productSchema } },
  },
  async (request, reply) => {
    const row = await insertProduct(sql, request.body)
    return reply.code(201).header('etag', etag(row.version)).header('location', `/products/${row.id}`).send(row)
  },
)

// POST /batch as the service runs it (docs/api.md, "Batches") for the operations this peer serves, product
// creations: in order, in one transaction, each authorized and validated as POST /products alone would be; all succeed
// (200, one result per operation) or the first failure answers with its status and index and rolls all back.
const MAX_OPERATIONS = 100
const batchBody = {
  type: 'object',
  additionalProperties: false,
  required: ['operations'],
  properties: {
    operations: {
      type: 'array',
      minItems: 1,
      maxItems: MAX_OPERATIONS,
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['method', 'path'],
        properties: {
          method: { type: 'string', enum: ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'] },
          path: { type: 'string', minLength: 1, maxLength: 2048, pattern: '^/[\\x21-\\x7e]*$' },
          body: {},
          if_match: { type: 'string', minLength: 1, maxLength: 1024 },
        },
      },
    },
  },
}
const batchResults = {
  type: 'object',
  properties: {
    results: {
      type: 'array',
      items: {
        type: 'object',
        properties: {
          status: { type: 'integer' },
          location: { type: 'string' },
          etag: { type: 'string' },
          body: productSchema,
        },
        required: ['status'],
      },
    },
  },
  required: ['results'],
}
/** An operation's refusal: its status, with its index in the message; a failure of the database passes as it is. */
const ofOperation = (err, index) =>
  err.statusCode === undefined ? err : Object.assign(err, { message: `operation ${index}: ${err.message}` })

app.post(
  '/batch',
  {
    onRequest: guard(null, 'any'),
    // The service's bound: ten times a request's body (BODY_LIMIT, 1 MiB).
    bodyLimit: 10 * 1024 * 1024,
    schema: { body: batchBody, response: { 200: batchResults } },
  },
  async (request) => {
    const { operations } = request.body
    const validate = request.compileValidationSchema(productCreate, 'body')
    const results = await sql.begin(async (tx) => {
      const out = []
      for (const [index, op] of operations.entries()) {
        try {
          if (op.method !== 'POST' || op.path !== '/products')
            throw httpError(422, `${op.method} ${op.path} is not an operation this server batches.`)
          permit(request.caller, 'products:write', 'admin')
          if (!validate(op.body)) throw httpError(422, `body: ${validate.errors?.[0]?.message ?? 'invalid'}`)
          const row = await insertProduct(tx, op.body)
          out.push({ status: 201, location: `/products/${row.id}`, etag: etag(row.version), body: row })
        } catch (err) {
          throw ofOperation(err, index)
        } finally {
          request.operations = index + 1
        }
      }
      return out
    })
    return { results }
  },
)

app.get(
  '/products/:id',
  {
    onRequest: guard('products:read', 'any'),
    schema: { params: idParams, response: { 200: productSchema } },
  },
  async (request, reply) => {
    const [row] = await sql`SELECT * FROM products WHERE id = ${request.params.id}`
    if (!row) throw httpError(404, 'Not found.')
    reply.header('etag', etag(row.version))
    return row
  },
)

app.patch(
  '/products/:id',
  {
    onRequest: guard('products:write', 'admin'),
    schema: { params: idParams, body: productPatch, response: { 200: productSchema } },
  },
  async (request, reply) => {
    const { id } = request.params
    const body = request.body
    if (body.id !== undefined && String(body.id) !== id) throw httpError(422, 'id: must equal the id in the path')
    const ifMatch = request.headers['if-match']
    // Lock the row, compare its version with If-Match, write only what changes:
    // concurrent writers queue on the lock and the second one sees the first's version.
    const row = await sql.begin(async (tx) => {
      const [current] = await tx`SELECT * FROM products WHERE id = ${id} FOR UPDATE`
      if (!current) throw httpError(404, 'Not found.')
      if (!ifMatchHolds(ifMatch, current.version)) {
        reply.header('etag', etag(current.version))
        throw httpError(412, 'If-Match does not match the ETag.')
      }
      const changes = {}
      for (const k of PRODUCT_WRITABLE) {
        if (body[k] === undefined) continue
        const value = body[k] === null ? PRODUCT_DEFAULTS[k] : body[k]
        if (value !== current[k]) changes[k] = value
      }
      if (Object.keys(changes).length === 0) return current
      // now() is the start of the transaction, which may predate the previous write if we waited on its lock.
      const [updated] = await tx`
      UPDATE products SET ${tx(changes, Object.keys(changes))}, version = version + 1,
        updated_at = greatest(clock_timestamp(), updated_at + interval '1 millisecond')
      WHERE id = ${current.id} RETURNING *`
      return updated
    })
    reply.header('etag', etag(row.version))
    return row
  },
)

// ---- start and stop ----------------------------------------------------------------

await app.listen({ port: Number(env.PORT || 3100), host: env.HOST || '127.0.0.1' })

let stopping = false
async function stop() {
  if (stopping) return
  stopping = true
  try {
    await app.close()
    await sql.end({ timeout: 5 })
    process.exit(0)
  } catch (err) {
    process.stderr.write(`fastify peer: ${err?.stack ?? String(err)}\n`)
    process.exit(1)
  }
}
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
