// A peer of the service for `make bench`: the endpoints the benchmark measures,
// written on bare node:http and the published postgres.js (3.4.9, unpatched),
// the way a competent developer would without a framework. It shares no code
// with the service; what it must share is the answers: byte for byte the same
// bodies and statuses for the benchmark's requests (bench/peers-check.ts checks
// this), and comparable work per request: the same SQL, an HS256 JWT checked on
// every request, validated input, and one JSON log line per request on stdout.
//
// Start: `npm ci` in this folder, then `node bench/bare/server.js`.
// Environment: PORT, HOST (127.0.0.1), DATABASE_URL (a `host=/dir` query
// parameter names a Unix socket folder), DATABASE_POOL_MAX (10),
// BENCH_JWT_SECRET (the UTF-8 secret), BENCH_JWT_KID (bench), JWT_ISSUER and
// JWT_AUDIENCE (users-products-api).

import { createHash, createHmac, randomUUID, timingSafeEqual } from 'node:crypto'
import { createServer } from 'node:http'
import postgres from 'postgres'

const env = process.env

function required(name) {
  const value = env[name]
  if (!value) {
    process.stderr.write(`bare: ${name} is required\n`)
    process.exit(2)
  }
  return value
}

const jwtSecret = Buffer.from(required('BENCH_JWT_SECRET'), 'utf8')
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
  connection: { application_name: 'upa-bench-bare', statement_timeout: 5000 },
  types: { int8: { to: 20, from: [20], serialize: (x) => String(x), parse: (x) => Number(x) } },
})

// ---- errors and answers ------------------------------------------------------

class HttpError extends Error {
  constructor(status, message, headers = {}) {
    super(message)
    this.status = status
    this.headers = headers
  }
}

const JSON_TYPE = 'application/json; charset=utf-8'

/** Everything a request needs to be answered and logged. */
class Exchange {
  constructor(req, res) {
    this.req = req
    this.res = res
    this.started = process.hrtime.bigint()
    const given = req.headers['x-request-id']
    this.requestId = typeof given === 'string' && /^[A-Za-z0-9._:-]{1,128}$/.test(given) ? given : randomUUID()
    this.route = null
    this.userId = null
    /** POST /batch: the operations it ran, for the log line (as the service logs them). */
    this.operations = undefined
  }

  send(status, body, headers) {
    const payload = JSON.stringify(body)
    const head = {
      'content-type': JSON_TYPE,
      'content-length': Buffer.byteLength(payload),
      'x-request-id': this.requestId,
      ...headers,
    }
    this.res.writeHead(status, head)
    this.res.end(payload)
    this.log(status)
  }

  log(status) {
    // One line per request, as the service writes; stdout is a file during the benchmark.
    process.stdout.write(
      JSON.stringify({
        time: new Date().toISOString(),
        level: 'info',
        msg: 'request',
        request_id: this.requestId,
        method: this.req.method,
        route: this.route,
        status,
        duration_ms: Number(process.hrtime.bigint() - this.started) / 1e6,
        user_id: this.userId,
        client: this.req.socket.remoteAddress ?? null,
        operations: this.operations,
      }) + '\n',
    )
  }
}

const problem = (status, message) => ({ status, message })

// ---- credentials -------------------------------------------------------------

const SEGMENT = /^[A-Za-z0-9_-]+$/
const ID = /^[1-9][0-9]{0,18}$/
const API_KEY = /^upa_ak_[A-Za-z0-9_-]{43}$/
const invalidToken = () =>
  new HttpError(401, 'The credential is invalid, expired or revoked.', {
    'www-authenticate': 'Bearer realm="api", error="invalid_token"',
  })

function decodeSegment(segment) {
  try {
    const value = JSON.parse(Buffer.from(segment, 'base64url').toString('utf8'))
    if (value && typeof value === 'object' && !Array.isArray(value)) return value
  } catch {
    // not JSON: refused below
  }
  throw invalidToken()
}

/** HS256 in the order RFC 8725 asks for: algorithm and key, signature over the text received, then the claims. */
function verifyJwt(token) {
  const parts = token.split('.')
  if (parts.length !== 3 || !parts.every((p) => SEGMENT.test(p))) throw invalidToken()
  const [h, p, s] = parts
  const header = decodeSegment(h)
  if (header.alg !== 'HS256' || (header.kid !== undefined && header.kid !== jwtKid) || header.crit !== undefined)
    throw invalidToken()
  const expected = Buffer.from(createHmac('sha256', jwtSecret).update(`${h}.${p}`).digest('base64url'))
  const given = Buffer.from(s)
  if (expected.length !== given.length || !timingSafeEqual(expected, given)) throw invalidToken()
  const claims = decodeSegment(p)
  if (typeof claims.exp !== 'number' || !(claims.exp > Date.now() / 1000)) throw invalidToken()
  if (
    claims.iss !== issuer ||
    !(claims.aud === audience || (Array.isArray(claims.aud) && claims.aud.includes(audience)))
  )
    throw invalidToken()
  if (
    typeof claims.sub !== 'string' ||
    !ID.test(claims.sub) ||
    typeof claims.role !== 'string' ||
    typeof claims.scope !== 'string'
  )
    throw invalidToken()
  return { userId: claims.sub, role: claims.role, scopes: claims.scope.split(' ') }
}

/** last_used_at is kept to the minute: this process sends the UPDATE at most once a minute per key. */
const keyWrittenAt = new Map()

// The service's SQL for an API key (src/auth/api-keys/credential.ts), statement for statement.
async function verifyApiKey(key) {
  if (!API_KEY.test(key)) throw invalidToken()
  const hash = createHash('sha256').update(key).digest()
  const [row] = await sql`
      SELECT u.id AS user_id, u.role, k.scopes, k.expires_at, k.id AS api_key_id
      FROM api_keys k JOIN users u ON u.id = k.user_id
      WHERE k.key_hash = ${hash} AND (k.expires_at IS NULL OR k.expires_at > now())`
  if (!row) throw invalidToken()
  const now = Date.now()
  if (!(now - (keyWrittenAt.get(row.api_key_id) ?? -Infinity) < 60_000)) {
    keyWrittenAt.set(row.api_key_id, now)
    await sql`UPDATE api_keys SET last_used_at = now() WHERE id = ${row.api_key_id} AND (last_used_at IS NULL
      OR last_used_at < now() - interval '1 minute')`
  }
  return { userId: String(row.user_id), role: row.role, scopes: row.scopes }
}

/**
 * The caller, checked against what the route needs: the scope (null: any, the
 * route checks further), and who may call it ('any', 'admin', or
 * 'admin-or-self' for a user's own record).
 */
async function authorize(x, scope, who, id) {
  const { authorization, 'x-api-key': apiKey } = x.req.headers
  if (authorization !== undefined && apiKey !== undefined)
    throw new HttpError(400, 'Send one credential, not both Authorization and X-API-Key.')
  let caller
  if (typeof apiKey === 'string') {
    caller = await verifyApiKey(apiKey.trim())
  } else if (authorization !== undefined) {
    const m = /^Bearer +([\x21-\x7e]+) *$/i.exec(authorization)
    if (!m) throw invalidToken()
    caller = verifyJwt(m[1])
  } else {
    throw new HttpError(401, 'This endpoint needs a credential.', { 'www-authenticate': 'Bearer realm="api"' })
  }
  x.userId = caller.userId
  permit(caller, scope, who, id)
  return caller
}

function permit(caller, scope, who, id) {
  if (scope !== null && !caller.scopes.includes(scope))
    throw new HttpError(403, `This credential lacks the scope ${scope}.`)
  if (!(caller.role === 'admin' || who === 'any' || (who === 'admin-or-self' && id === caller.userId)))
    throw new HttpError(403, 'This credential may not do this.')
}

// ---- input -------------------------------------------------------------------

const MAX_LIMIT = 200
const MAX_OFFSET = 100_000
const BODY_LIMIT = 1024 * 1024

/** A query parameter as an integer within bounds, or a 400 naming it. */
function integerParam(name, raw, min, max) {
  if (!/^-?[0-9]{1,16}$/.test(raw)) throw new HttpError(400, `${name}: must be an integer from ${min} to ${max}`)
  const value = Number(raw)
  if (value < min || value > max) throw new HttpError(400, `${name}: must be an integer from ${min} to ${max}`)
  return value
}

/**
 * The query of a list request: limit, offset, fields, sort, the `id[gt]` filter,
 * and `after` (the next-page cursor of our Link header: the last row's sort
 * keys). Anything else, or a parameter given twice, is a 400, as in the service.
 */
function listQuery(search, collection) {
  const params = new URLSearchParams(search)
  const q = { limit: 50, offset: 0, fields: undefined, sort: 'id', idGt: undefined, after: undefined }
  const seen = new Set()
  for (const [name, value] of params) {
    if (seen.has(name)) throw new HttpError(400, `${name}: must be given at most once`)
    seen.add(name)
    switch (name) {
      case 'limit':
        q.limit = integerParam(name, value, 1, MAX_LIMIT)
        break
      case 'offset':
        q.offset = integerParam(name, value, 0, MAX_OFFSET)
        break
      case 'id[gt]':
        q.idGt = integerParam(name, value, -Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER)
        break
      case 'sort':
        if (!collection.sorts.includes(value))
          throw new HttpError(400, `sort: must be one of ${collection.sorts.join(', ')}`)
        q.sort = value
        break
      case 'fields': {
        const wanted = new Set(value.split(','))
        for (const f of wanted)
          if (!collection.members.includes(f)) throw new HttpError(400, `fields: "${f}" is not a member`)
        // In the order of the representation, whatever the order asked for: as the service answers.
        q.fields = collection.members.filter((m) => wanted.has(m))
        break
      }
      case 'after':
        q.after = value.split(',').map((v) => integerParam(name, v, 0, Number.MAX_SAFE_INTEGER))
        break
      default:
        throw new HttpError(400, `${name}: is not a parameter of this endpoint`)
    }
  }
  if (q.after && q.offset) throw new HttpError(400, 'offset: cannot be combined with after')
  if (q.after && q.after.length !== (q.sort === '-price' ? 2 : 1))
    throw new HttpError(400, 'after: is not a cursor of this sort')
  return q
}

async function readJson(req, types, limit = BODY_LIMIT) {
  const type = (req.headers['content-type'] ?? '').split(';')[0].trim().toLowerCase()
  if (!types.includes(type)) throw new HttpError(415, `Content-Type must be ${types.join(' or ')}.`)
  if (Number(req.headers['content-length'] ?? 0) > limit)
    throw new HttpError(413, 'The body is too large.', { connection: 'close' })
  const chunks = []
  let size = 0
  for await (const chunk of req) {
    size += chunk.length
    if (size > limit) throw new HttpError(413, 'The body is too large.', { connection: 'close' })
    chunks.push(chunk)
  }
  let body
  try {
    body = JSON.parse(Buffer.concat(chunks).toString('utf8'))
  } catch {
    throw new HttpError(400, 'The body is not valid JSON.')
  }
  if (!body || typeof body !== 'object' || Array.isArray(body))
    throw new HttpError(422, 'The body must be a JSON object.')
  return body
}

// The rules of the service's schemas (src/users/resource.ts, src/products/resource.ts, src/core/resources/common.ts).
const NAME = /^(?=[\s\S]*[^\s])[^\u0000-\u001f\u007f-\u009f]*$/
const EMAIL =
  /^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$/
const SKU = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/
const DESCRIPTION = /^[^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]*$/
const CURRENCIES = new Set(Intl.supportedValuesOf('currency'))

const isName = (v) => typeof v === 'string' && v.length >= 1 && v.length <= 200 && NAME.test(v)
const isInteger = (v, min, max) => Number.isInteger(v) && v >= min && v <= max

/** A body that is JSON but not a valid one: 422, as the service answers (malformed JSON is a 400). */
function invalid(member, rule) {
  return new HttpError(422, `${member}: must be ${rule}`)
}

function checkUserCreate(body) {
  for (const key of Object.keys(body))
    if (!['name', 'email', 'role'].includes(key)) throw invalid(key, 'left out (not a member)')
  if (!isName(body.name)) throw invalid('name', 'a name of 1 to 200 characters')
  if (typeof body.email !== 'string' || body.email.length > 254 || !EMAIL.test(body.email))
    throw invalid('email', 'an e-mail address')
  if (body.role !== undefined && body.role !== 'admin' && body.role !== 'user') throw invalid('role', 'admin or user')
  return { name: body.name, email: body.email, role: body.role ?? 'user' }
}

/** A new product: its columns, null meaning the member's default (the column's). */
function checkProductCreate(body) {
  if (!body || typeof body !== 'object' || Array.isArray(body)) throw new HttpError(422, 'The body must be an object.')
  for (const key of Object.keys(body))
    if (!['sku', 'name', 'description', 'price', 'currency', 'stock'].includes(key))
      throw invalid(key, 'left out (not a member)')
  if (typeof body.sku !== 'string' || !SKU.test(body.sku)) throw invalid('sku', 'a SKU')
  if (!isName(body.name)) throw invalid('name', 'a name of 1 to 200 characters')
  const { description, stock } = body
  if (
    description !== undefined &&
    description !== null &&
    (typeof description !== 'string' || description.length > 10000 || !DESCRIPTION.test(description))
  )
    throw invalid('description', 'a text of at most 10000 characters')
  if (!isInteger(body.price, 0, 1_000_000_000_000)) throw invalid('price', 'an integer from 0 to 1000000000000')
  if (typeof body.currency !== 'string' || !CURRENCIES.has(body.currency))
    throw invalid('currency', 'an ISO 4217 currency code')
  if (stock !== undefined && stock !== null && !isInteger(stock, 0, 2_147_483_647))
    throw invalid('stock', 'an integer from 0 to 2147483647')
  const product = { sku: body.sku, name: body.name, price: body.price, currency: body.currency }
  if (description !== undefined) product.description = description ?? PRODUCT_DEFAULTS.description
  if (stock !== undefined) product.stock = stock ?? PRODUCT_DEFAULTS.stock
  return product
}

/** A merge patch of a product: what it sets, null meaning the member's default; read-only members may be echoed. */
function checkProductPatch(body, id) {
  const changes = {}
  for (const [key, value] of Object.entries(body)) {
    switch (key) {
      case 'sku':
        if (typeof value !== 'string' || !SKU.test(value)) throw invalid(key, 'a SKU')
        break
      case 'name':
        if (!isName(value)) throw invalid(key, 'a name of 1 to 200 characters')
        break
      case 'description':
        if (value !== null && (typeof value !== 'string' || value.length > 10000 || !DESCRIPTION.test(value)))
          throw invalid(key, 'a text of at most 10000 characters')
        break
      case 'price':
        if (!isInteger(value, 0, 1_000_000_000_000)) throw invalid(key, 'an integer from 0 to 1000000000000')
        break
      case 'currency':
        if (typeof value !== 'string' || !CURRENCIES.has(value)) throw invalid(key, 'an ISO 4217 currency code')
        break
      case 'stock':
        if (value !== null && !isInteger(value, 0, 2_147_483_647)) throw invalid(key, 'an integer from 0 to 2147483647')
        break
      case 'id':
        if (!Number.isInteger(value) || String(value) !== id) throw invalid(key, 'the id in the path')
        continue
      case 'created_at':
      case 'updated_at':
        if (typeof value !== 'string' || value.length > 64) throw invalid(key, 'a string (read-only; ignored)')
        continue
      default:
        throw invalid(key, 'left out (not a member)')
    }
    changes[key] = value === null ? PRODUCT_DEFAULTS[key] : value
  }
  return changes
}

const PRODUCT_DEFAULTS = { description: '', stock: 0 }

// ---- representations (the service's outputMembers, in order) ----------------

const USER_MEMBERS = ['id', 'name', 'email', 'role', 'email_verified_at', 'created_at', 'updated_at']
const PRODUCT_MEMBERS = ['id', 'sku', 'name', 'description', 'price', 'currency', 'stock', 'created_at', 'updated_at']

const presentUser = (r) => ({
  id: r.id,
  name: r.name,
  email: r.email,
  role: r.role,
  email_verified_at: r.email_verified_at,
  created_at: r.created_at,
  updated_at: r.updated_at,
})
const presentProduct = (r) => ({
  id: r.id,
  sku: r.sku,
  name: r.name,
  description: r.description,
  price: r.price,
  currency: r.currency,
  stock: r.stock,
  created_at: r.created_at,
  updated_at: r.updated_at,
})

/** Only the members `fields` asks for, in representation order. */
function pick(fields) {
  return (row) => {
    const out = {}
    for (const f of fields) out[f] = row[f]
    return out
  }
}

/** The Link to the next page: the same query, with `after` the last row's sort keys. */
function nextLink(path, search, after) {
  const params = new URLSearchParams(search)
  params.delete('offset')
  params.set('after', after)
  return `<${path}?${params}>; rel="next"`
}

const etag = (version) => `"v${version}"`

/** If-Match with the strong comparison (RFC 9110 §13.1.1), as the service checks it. */
function ifMatchHolds(header, version) {
  if (header === undefined) return true
  const current = etag(version)
  return header.split(',').some((t) => {
    const tag = t.trim()
    return tag === '*' || tag === current
  })
}

// ---- routes ------------------------------------------------------------------

const users = { members: USER_MEMBERS, sorts: ['id'] }
const products = { members: PRODUCT_MEMBERS, sorts: ['id', '-price'] }

async function listUsers(x, search) {
  x.route = '/users'
  await authorize(x, 'users:read', 'admin')
  const q = listQuery(search, users)
  // The service's statement for sort=id: the representation's columns, one row more than the page to know if there is a
  // next one.
  const rows = await sql`
    SELECT id, name, email, role, email_verified_at, created_at, updated_at FROM users
    WHERE true ${q.idGt !== undefined ? sql`AND id > ${q.idGt}` : sql``}
    ${q.after ? sql`AND id > ${q.after[0]}` : sql``}
    ORDER BY id ASC LIMIT ${q.limit + 1} ${q.offset ? sql`OFFSET ${q.offset}` : sql``}`
  const headers = {}
  if (rows.length > q.limit) {
    rows.pop()
    headers.link = nextLink('/users', search, rows[rows.length - 1].id)
  }
  x.send(200, q.fields ? rows.map(pick(q.fields)) : rows.map(presentUser), headers)
}

async function createUser(x) {
  x.route = '/users'
  await authorize(x, 'users:write', 'admin')
  const user = checkUserCreate(await readJson(x.req, ['application/json']))
  let row
  try {
    ;[row] = await sql`INSERT INTO users ${sql(user)} RETURNING *`
  } catch (err) {
    if (err.code === '23505' && err.constraint_name === 'users_email_key')
      throw new HttpError(409, 'A user with this email already exists.')
    throw err
  }
  x.send(201, presentUser(row), { etag: etag(row.version), location: `/users/${row.id}` })
}

async function getUser(x, id) {
  x.route = '/users/{id}'
  await authorize(x, 'users:read', 'admin-or-self', id)
  const [row] = await sql`SELECT * FROM users WHERE id = ${id}`
  if (!row) throw new HttpError(404, 'Not found.')
  x.send(200, presentUser(row), { etag: etag(row.version) })
}

async function listProducts(x, search) {
  x.route = '/products'
  await authorize(x, 'products:read', 'any')
  const q = listQuery(search, products)
  const byPrice = q.sort === '-price'
  // The service's statements for sort=id and sort=-price (ties by id, in the same direction).
  const rows = await sql`
    SELECT id, sku, name, description, price, currency, stock, created_at, updated_at FROM products
    WHERE true ${q.idGt !== undefined ? sql`AND id > ${q.idGt}` : sql``}
      ${
        q.after
          ? byPrice
            ? sql`AND (price, id) <
        (${q.after[0]}, ${q.after[1]})`
            : sql`AND id > ${q.after[0]}`
          : sql``
      }
    ORDER BY ${
      byPrice
        ? sql`price DESC, id
      DESC`
        : sql`id ASC`
    } LIMIT ${q.limit + 1} ${q.offset ? sql`OFFSET ${q.offset}` : sql``}`
  const headers = {}
  if (rows.length > q.limit) {
    rows.pop()
    const last = rows[rows.length - 1]
    headers.link = nextLink('/products', search, byPrice ? `${last.price},${last.id}` : last.id)
  }
  x.send(200, q.fields ? rows.map(pick(q.fields)) : rows.map(presentProduct), headers)
}

/** Inserts a product on `db` (the pool or a transaction): the row, or 409 for a SKU in use. */
async function insertProduct(db, product) {
  try {
    const [row] = await db`INSERT INTO products ${db(product)} RETURNING *`
    return row
  } catch (err) {
    if (err.code === '23505' && err.constraint_name === 'products_sku_key')
      throw new HttpError(409, 'A product with this sku already exists.')
    throw err
  }
}

async function createProduct(x) {
  x.route = '/products'
  await authorize(x, 'products:write', 'admin')
  const row = await insertProduct(sql, checkProductCreate(await readJson(x.req, ['application/json'])))
  x.send(201, presentProduct(row), { etag: etag(row.version), location: `/products/${row.id}` })
}

const MAX_OPERATIONS = 100
const OPERATION_MEMBERS = ['method', 'path', 'body', 'if_match']

/**
 * POST /batch for the operations this server serves, product creations: in
 * order, in one transaction, each authorized and checked as POST /products
 * alone; all succeed (200, a result per operation) or the first refusal
 * answers with its status and index, and the transaction is rolled back.
 */
async function runBatch(x) {
  x.route = '/batch'
  const caller = await authorize(x, null, 'any')
  const body = await readJson(x.req, ['application/json'], 10 * BODY_LIMIT)
  const { operations } = body
  if (Object.keys(body).some((k) => k !== 'operations')) throw invalid('operations', 'the only member')
  if (!Array.isArray(operations) || operations.length < 1 || operations.length > MAX_OPERATIONS)
    throw invalid('operations', `an array of 1 to ${MAX_OPERATIONS} operations`)
  for (const [i, op] of operations.entries()) {
    if (
      !op ||
      typeof op !== 'object' ||
      Array.isArray(op) ||
      Object.keys(op).some((k) => !OPERATION_MEMBERS.includes(k)) ||
      typeof op.method !== 'string' ||
      typeof op.path !== 'string' ||
      (op.if_match !== undefined && typeof op.if_match !== 'string')
    )
      throw invalid(`operations/${i}`, 'an operation: method, path, body, if_match')
  }
  const results = await sql.begin(async (tx) => {
    const out = []
    for (const [index, op] of operations.entries()) {
      x.operations = index + 1
      try {
        if (op.method !== 'POST' || op.path !== '/products')
          throw new HttpError(422, `${op.method} ${op.path} is not an operation this server batches.`)
        permit(caller, 'products:write', 'admin')
        const row = await insertProduct(tx, checkProductCreate(op.body))
        out.push({ status: 201, location: `/products/${row.id}`, etag: etag(row.version), body: presentProduct(row) })
      } catch (err) {
        if (err instanceof HttpError) err.message = `operation ${index}: ${err.message}`
        throw err
      }
    }
    return out
  })
  x.send(200, { results })
}

async function getProduct(x, id) {
  x.route = '/products/{id}'
  await authorize(x, 'products:read', 'any')
  const [row] = await sql`SELECT * FROM products WHERE id = ${id}`
  if (!row) throw new HttpError(404, 'Not found.')
  x.send(200, presentProduct(row), { etag: etag(row.version) })
}

async function patchProduct(x, id) {
  x.route = '/products/{id}'
  await authorize(x, 'products:write', 'admin')
  const patch = checkProductPatch(await readJson(x.req, ['application/merge-patch+json', 'application/json']), id)
  const ifMatch = x.req.headers['if-match']
  // Lock the row, compare its version with If-Match, write only what changes:
  // concurrent writers queue on the lock and the second one sees the first's version.
  const row = await sql.begin(async (tx) => {
    const [current] = await tx`SELECT * FROM products WHERE id = ${id} FOR UPDATE`
    if (!current) throw new HttpError(404, 'Not found.')
    if (!ifMatchHolds(ifMatch, current.version))
      throw new HttpError(412, 'If-Match does not match the ETag.', { etag: etag(current.version) })
    const changes = {}
    for (const [k, v] of Object.entries(patch)) if (v !== current[k]) changes[k] = v
    if (Object.keys(changes).length === 0) return current
    // now() is the start of the transaction, which may predate the previous write if we waited on its lock.
    const [updated] = await tx`
      UPDATE products SET ${tx(changes, Object.keys(changes))}, version = version + 1,
        updated_at = greatest(clock_timestamp(), updated_at + interval '1 millisecond')
      WHERE id = ${current.id} RETURNING *`
    return updated
  })
  x.send(200, presentProduct(row), { etag: etag(row.version) })
}

async function route(x) {
  const { method } = x.req
  const raw = x.req.url ?? '/'
  const at = raw.indexOf('?')
  const path = at === -1 ? raw : raw.slice(0, at)
  const search = at === -1 ? '' : raw.slice(at + 1)
  const [, resource, id, extra] = path.split('/')
  if (extra !== undefined || (id !== undefined && !ID.test(id))) throw new HttpError(404, 'Not found.')
  const allow = (methods) => new HttpError(405, `${method} is not supported here.`, { allow: methods })

  if (resource === 'healthz' && id === undefined) {
    x.route = '/healthz'
    if (method !== 'GET') throw allow('GET')
    return x.send(200, { status: 'ok' })
  }
  if (resource === 'users') {
    if (id === undefined) {
      if (method === 'GET') return listUsers(x, search)
      if (method === 'POST') return createUser(x)
      throw allow('GET, POST')
    }
    if (method === 'GET') return getUser(x, id)
    throw allow('GET')
  }
  if (resource === 'products') {
    if (id === undefined) {
      if (method === 'GET') return listProducts(x, search)
      if (method === 'POST') return createProduct(x)
      throw allow('GET, POST')
    }
    if (method === 'GET') return getProduct(x, id)
    if (method === 'PATCH') return patchProduct(x, id)
    throw allow('GET, PATCH')
  }
  if (resource === 'batch' && id === undefined) {
    if (method === 'POST') return runBatch(x)
    throw allow('POST')
  }
  throw new HttpError(404, 'Not found.')
}

const server = createServer({ keepAliveTimeout: 65_000 }, (req, res) => {
  const x = new Exchange(req, res)
  route(x).catch((err) => {
    if (res.headersSent) return void res.destroy()
    if (err instanceof HttpError) return x.send(err.status, problem(err.status, err.message), err.headers)
    process.stderr.write(`bare: ${err?.stack ?? String(err)}\n`)
    x.send(500, problem(500, 'An unexpected error occurred.'))
  })
})

server.listen(Number(env.PORT || 3100), env.HOST || '127.0.0.1')

let stopping = false
function stop() {
  if (stopping) return
  stopping = true
  server.close()
  server.closeIdleConnections()
  sql.end({ timeout: 5 }).then(
    () => process.exit(0),
    () => process.exit(1),
  )
}
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
