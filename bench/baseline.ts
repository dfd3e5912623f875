import { createHash, createHmac, timingSafeEqual } from 'node:crypto'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import postgres from 'postgres'

// The floor for this stack: node:http + postgres.js + a node:crypto HS256 JWT
// check, running the same SQL as the service for the endpoints `make bench`
// measures, and nothing else: no validation, no logging, no metrics, no
// request ids, no problem bodies. Whatever the service spends beyond this is
// the price of its framework; the benchmark reports it as a ratio.
//
// Not part of the service: it trusts its input (a malformed body is a 400 at
// best, a crash at worst) and answers only the requests the benchmark sends.
//
// Environment: DATABASE_URL (a `host=/dir` query parameter names a Unix
// socket folder, as for the service), PORT, HOST, DATABASE_POOL_MAX,
// BENCH_JWT_SECRET (the UTF-8 secret the service gets in JWT_SECRETS),
// BENCH_JWT_KID, JWT_ISSUER, JWT_AUDIENCE.

const env = process.env
const secret = Buffer.from(required('BENCH_JWT_SECRET'), 'utf8')
const kid = env.BENCH_JWT_KID ?? 'bench'
const issuer = env.JWT_ISSUER ?? 'users-products-api'
const audience = env.JWT_AUDIENCE ?? 'users-products-api'

function required(name: string): string {
  const value = env[name]
  if (!value) throw new Error(`${name} is required`)
  return value
}

// The same pool settings as src/db/connect.ts: Unix socket folder, statement
// time-out, int8 as JS numbers. Only the application name differs, so the
// benchmark can tell the two servers' backends apart.
const url = new URL(required('DATABASE_URL'))
const socketDir = url.searchParams.get('host')
if (socketDir) url.searchParams.delete('host')
const sql = postgres(url.toString(), {
  ...(socketDir ? { host: socketDir } : {}),
  max: Number(env.DATABASE_POOL_MAX ?? 10),
  connect_timeout: 5,
  idle_timeout: 60,
  max_lifetime: 60 * 30,
  onnotice: () => {},
  connection: { application_name: 'upa-bench-baseline', statement_timeout: 5000 },
  types: { int8: { to: 20, from: [20], serialize: (x: number) => String(x), parse: (x: string) => Number(x) } },
})

interface Caller {
  userId: string
  role: string
  scopes: string[]
}

class Refused extends Error {
  constructor(readonly status: number) {
    super(String(status))
  }
}

// ---- credentials ---------------------------------------------------------

function verifyJwt(token: string): Caller {
  const parts = token.split('.')
  if (parts.length !== 3) throw new Refused(401)
  const [h, p, s] = parts as [string, string, string]
  const header = JSON.parse(Buffer.from(h, 'base64url').toString('utf8')) as { alg?: string; kid?: string }
  if (header.alg !== 'HS256' || (header.kid !== undefined && header.kid !== kid)) throw new Refused(401)
  const expected = Buffer.from(createHmac('sha256', secret).update(`${h}.${p}`).digest('base64url'))
  const given = Buffer.from(s)
  if (expected.length !== given.length || !timingSafeEqual(expected, given)) throw new Refused(401)
  const claims = JSON.parse(Buffer.from(p, 'base64url').toString('utf8')) as { sub: string; exp: number; iss: string; aud: string; role: string; scope: string }
  if (!(claims.exp > Date.now() / 1000) || claims.iss !== issuer || claims.aud !== audience) throw new Refused(401)
  return { userId: claims.sub, role: claims.role, scopes: claims.scope.split(' ') }
}

interface KeyRow {
  user_id: number
  role: string
  scopes: string[]
  api_key_id: number
}

// The service's SQL for an API key (src/auth/credentials.ts), statement for statement.
async function verifyApiKey(key: string): Promise<Caller> {
  const hash = createHash('sha256').update(key).digest()
  const [row] = await sql<KeyRow[]>`
      SELECT u.id AS user_id, u.role, k.scopes, k.expires_at, k.id AS api_key_id
      FROM api_keys k JOIN users u ON u.id = k.user_id
      WHERE k.key_hash = ${hash} AND (k.expires_at IS NULL OR k.expires_at > now())`
  if (!row) throw new Refused(401)
  await sql`UPDATE api_keys SET last_used_at = now() WHERE id = ${row.api_key_id} AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')`
  return { userId: String(row.user_id), role: row.role, scopes: row.scopes }
}

async function caller(req: IncomingMessage, scope: string, who: 'any' | 'admin' | 'admin-or-self', id?: string): Promise<Caller> {
  const apiKey = req.headers['x-api-key']
  const authorization = req.headers.authorization
  let c: Caller
  if (typeof apiKey === 'string') c = await verifyApiKey(apiKey)
  else if (authorization?.startsWith('Bearer ')) c = verifyJwt(authorization.slice(7))
  else throw new Refused(401)
  if (!c.scopes.includes(scope)) throw new Refused(403)
  if (!(c.role === 'admin' || who === 'any' || (who === 'admin-or-self' && id === c.userId))) throw new Refused(403)
  return c
}

// ---- representations (as the service's presentUser / presentProduct) -----

interface UserRow {
  id: number
  name: string
  email: string
  role: string
  version: number
  created_at: Date
  updated_at: Date
}
interface ProductRow {
  id: number
  sku: string
  name: string
  description: string
  price: number
  currency: string
  stock: number
  version: number
  created_at: Date
  updated_at: Date
}

const presentUser = (r: UserRow) => ({ id: r.id, name: r.name, email: r.email, role: r.role, created_at: r.created_at, updated_at: r.updated_at })
const presentProduct = (r: ProductRow) => ({
  id: r.id, sku: r.sku, name: r.name, description: r.description, price: r.price, currency: r.currency, stock: r.stock, created_at: r.created_at, updated_at: r.updated_at,
})

function send(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const payload = body === undefined ? '' : JSON.stringify(body)
  res.writeHead(status, { ...headers, 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(payload) })
  res.end(payload)
}

async function readBody(req: IncomingMessage): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = []
  for await (const chunk of req) chunks.push(chunk as Buffer)
  return JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>
}

// ---- routes ----------------------------------------------------------------

const ID = /^[1-9][0-9]{0,18}$/
const PRODUCT_MEMBERS = new Set(['sku', 'name', 'description', 'price', 'currency', 'stock'])

async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
  const raw = req.url ?? '/'
  const q = raw.indexOf('?')
  const path = q === -1 ? raw : raw.slice(0, q)
  const query = new URLSearchParams(q === -1 ? '' : raw.slice(q + 1))
  const [, resource, id, extra] = path.split('/')
  const method = req.method
  if (extra !== undefined || (id !== undefined && !ID.test(id))) return send(res, 404, { status: 404 })

  if (resource === 'healthz') return send(res, 200, { status: 'ok' })

  if (resource === 'users' && id === undefined && method === 'GET') {
    await caller(req, 'users:read', 'admin')
    const limit = Number(query.get('limit') ?? 50)
    const after = query.get('after')
    const offset = query.get('offset')
    // The service's statement for `sort=id` (src/collections/list-query.ts), keyset or offset.
    const rows = await sql<UserRow[]>`
      SELECT * FROM users WHERE true AND ${after ? sql`(id) > (${Number(after)})` : sql`true`}
      ORDER BY id ASC LIMIT ${limit + 1} ${offset ? sql`OFFSET ${Number(offset)}` : sql``}`
    const headers: Record<string, string> = {}
    if (rows.length > limit) {
      rows.pop()
      headers.link = `</users?limit=${limit}&after=${rows[rows.length - 1]!.id}>; rel="next"`
    }
    return send(res, 200, rows.map(presentUser), headers)
  }

  if (resource === 'users' && id === undefined && method === 'POST') {
    await caller(req, 'users:write', 'admin')
    const body = await readBody(req)
    const user = { name: body.name as string, email: body.email as string, role: (body.role as string | undefined) ?? 'user', password_hash: null }
    try {
      const [row] = await sql<UserRow[]>`INSERT INTO users ${sql(user)} RETURNING *`
      return send(res, 201, presentUser(row!), { etag: `"v${row!.version}"`, location: `/users/${row!.id}` })
    } catch (err) {
      if ((err as { code?: string }).code === '23505') return send(res, 409, { status: 409 })
      throw err
    }
  }

  if (resource === 'users' && id !== undefined && method === 'GET') {
    await caller(req, 'users:read', 'admin-or-self', id)
    const [row] = await sql<UserRow[]>`SELECT * FROM users WHERE id = ${id}`
    if (!row) return send(res, 404, { status: 404 })
    return send(res, 200, presentUser(row), { etag: `"v${row.version}"` })
  }

  if (resource === 'products' && id === undefined && method === 'GET') {
    await caller(req, 'products:read', 'any')
    const limit = Number(query.get('limit') ?? 50)
    const byPrice = query.get('sort') === '-price'
    const after = query.get('after')?.split(',').map(Number)
    // The service's statements for `sort=id` and `sort=-price` (ties by id, descending).
    const rows = byPrice
      ? await sql<ProductRow[]>`
          SELECT * FROM products WHERE true AND ${after ? sql`(price, id) < (${after[0]!}, ${after[1]!})` : sql`true`}
          ORDER BY price DESC, id DESC LIMIT ${limit + 1}`
      : await sql<ProductRow[]>`
          SELECT * FROM products WHERE true AND ${after ? sql`(id) > (${after[0]!})` : sql`true`}
          ORDER BY id ASC LIMIT ${limit + 1}`
    const headers: Record<string, string> = {}
    if (rows.length > limit) {
      rows.pop()
      const last = rows[rows.length - 1]!
      headers.link = `</products?limit=${limit}${byPrice ? '&sort=-price' : ''}&after=${byPrice ? `${last.price},` : ''}${last.id}>; rel="next"`
    }
    return send(res, 200, rows.map(presentProduct), headers)
  }

  if (resource === 'products' && id !== undefined && method === 'GET') {
    await caller(req, 'products:read', 'any')
    const [row] = await sql<ProductRow[]>`SELECT * FROM products WHERE id = ${id}`
    if (!row) return send(res, 404, { status: 404 })
    return send(res, 200, presentProduct(row), { etag: `"v${row.version}"` })
  }

  if (resource === 'products' && id !== undefined && method === 'PATCH') {
    await caller(req, 'products:write', 'admin')
    const body = await readBody(req)
    // The service's transaction (src/products/routes.ts): lock, compare, update what changed.
    const row = await sql.begin(async (tx) => {
      const [current] = await tx<ProductRow[]>`SELECT * FROM products WHERE id = ${id} FOR UPDATE`
      if (!current) return undefined
      const changes: Record<string, unknown> = {}
      for (const [k, v] of Object.entries(body)) if (PRODUCT_MEMBERS.has(k) && v !== (current as unknown as Record<string, unknown>)[k]) changes[k] = v
      if (!Object.keys(changes).length) return current
      const [updated] = await tx<ProductRow[]>`
        UPDATE products SET ${tx(changes as Record<string, string | number>, Object.keys(changes))}, version = version + 1,
            updated_at = greatest(clock_timestamp(), updated_at + interval '1 millisecond')
        WHERE id = ${current.id} RETURNING *`
      return updated
    })
    if (!row) return send(res, 404, { status: 404 })
    return send(res, 200, presentProduct(row), { etag: `"v${row.version}"` })
  }

  return send(res, 404, { status: 404 })
}

const server = createServer({ keepAliveTimeout: 65_000 }, (req, res) => {
  route(req, res).catch((err: unknown) => {
    if (err instanceof Refused) return send(res, err.status, { status: err.status })
    process.stderr.write(`baseline: ${err instanceof Error ? err.stack : String(err)}\n`)
    if (!res.headersSent) send(res, 500, { status: 500 })
    else res.destroy()
  })
})

server.listen(Number(env.PORT ?? 3100), env.HOST ?? '127.0.0.1')

const stop = () => {
  server.close()
  server.closeIdleConnections()
  void sql.end({ timeout: 2 }).then(() => process.exit(0))
}
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
