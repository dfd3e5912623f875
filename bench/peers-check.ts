import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { createHmac, randomBytes } from 'node:crypto'
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, statSync } from 'node:fs'
import { createServer } from 'node:net'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import type { Sql } from 'postgres'
import { connect } from '../src/core/db/connect.js'
import { startLocalCluster } from '../src/dev/local-cluster.js'
import { createBenchDatabase, dropBenchDatabase, type Seeded } from './seed.js'

// The peer servers of the benchmark (bench/fastify, bench/fastify-minimal,
// bench/bare) must answer the benchmark's requests with byte for byte the
// bodies and the statuses of the service, or comparing their costs would
// compare different work. The minimal Fastify peer serves less (no API keys,
// ETags, offsets, sorts or merge-patch nulls, Fastify's own refusals): it is
// held to the requests it serves (those not marked `extended`).
//
//   node --import tsx bench/peers-check.ts      (after `make build`)
//
// starts the local cluster, seeds a small benchmark database, starts the
// service and the three peers, sends every request of `standardRequests` to
// each (the minimal peer: those it serves), and prints a diff of the first answer that differs. The runner
// (bench/run.ts) can call `checkSameBodies` itself before measuring, with
// `standardRequests` or requests of its own; `peerServers` and
// `installPeerDependencies` say how to start the peers.

const root = fileURLToPath(new URL('../', import.meta.url))

// ---- the peers -------------------------------------------------------------------

export interface PeerServer {
  /** The entry point, run with plain `node` (no tsx): its folder has its own package.json and lock file. */
  script: string
  /** Its folder, where `npm ci` installs its dependencies. */
  dir: string
  /** application_name of its PostgreSQL connections. */
  appName: string
}

export const peerServers: Record<'fastify' | 'minimal' | 'bare', PeerServer> = {
  fastify: {
    script: join(root, 'bench', 'fastify', 'server.js'),
    dir: join(root, 'bench', 'fastify'),
    appName: 'upa-bench-fastify',
  },
  minimal: {
    script: join(root, 'bench', 'fastify-minimal', 'server.js'),
    dir: join(root, 'bench', 'fastify-minimal'),
    appName: 'upa-bench-fastify-minimal',
  },
  bare: {
    script: join(root, 'bench', 'bare', 'server.js'),
    dir: join(root, 'bench', 'bare'),
    appName: 'upa-bench-bare',
  },
}

/**
 * `npm ci` in each peer's folder when its node_modules is missing or older
 * than its package-lock.json. The peers' postgres.js is the published one:
 * the root install patches only the root's copy.
 */
export function installPeerDependencies(log: (msg: string) => void = () => {}): void {
  for (const peer of Object.values(peerServers)) {
    const marker = join(peer.dir, 'node_modules', '.package-lock.json')
    if (existsSync(marker) && statSync(marker).mtimeMs >= statSync(join(peer.dir, 'package-lock.json')).mtimeMs)
      continue
    log(`npm ci in ${peer.dir}`)
    const r = spawnSync('npm', ['ci', '--no-audit', '--no-fund'], { cwd: peer.dir, encoding: 'utf8' })
    if (r.status !== 0) throw new Error(`npm ci in ${peer.dir} failed:\n${r.stdout}${r.stderr}`)
  }
}

/** The environment a peer reads (see the head of each server.js). */
export function peerEnv(opts: {
  port: number
  databaseUrl: string
  jwtSecret: string
  jwtKid: string
  poolMax?: number
}): Record<string, string> {
  return {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    PORT: String(opts.port),
    HOST: '127.0.0.1',
    DATABASE_URL: opts.databaseUrl,
    DATABASE_POOL_MAX: String(opts.poolMax ?? 10),
    BENCH_JWT_SECRET: opts.jwtSecret,
    BENCH_JWT_KID: opts.jwtKid,
  }
}

// ---- the comparison --------------------------------------------------------------

export interface CheckRequest {
  label: string
  method?: string
  /** The same for every server. */
  path: string
  headers?: Record<string, string>
  /** The body, or a body per server (distinct e-mails for POST /users). */
  body?: string | ((server: string) => string)
  expect: number
  /** Compare bodies (default true); error bodies need not match the service's. */
  compareBody?: boolean
  /**
   * Applied to every body before comparing: values that must differ between servers (a new row's id, the write's time).
   */
  normalize?: (body: string) => string
  /** The ETag every server must send, or true: the same ETag as the reference server. */
  etag?: string | true
  /** Location must be `<this collection>/<id of the body>` (201), e.g. `/users`. */
  location?: string
  /** Run before each server's request (put back a row a PATCH changed). */
  before?: (server: string) => Promise<void>
  /**
   * More to check of each server's answer to it (what a batch left in the database, say): a problem, or undefined.
   * `minimal`: the server is one of the minimal peers, which send no ETags or Locations.
   */
  check?: (server: string, answer: Answer, minimal: boolean) => Promise<string | undefined>
  /**
   * What only the full servers serve (API keys, ETags, offsets, sorts, merge-patch nulls, the service's statuses for
   * bad input): the minimal peer is not asked.
   */
  extended?: true
}

export interface Answer {
  status: number
  headers: Headers
  body: string
}

export class Mismatch extends Error {}

async function send(origin: string, server: string, r: CheckRequest): Promise<Answer> {
  const body = typeof r.body === 'function' ? r.body(server) : r.body
  const res = await fetch(origin + r.path, {
    method: r.method ?? 'GET',
    headers: r.headers ?? {},
    ...(body !== undefined ? { body } : {}),
  })
  return { status: res.status, headers: res.headers, body: await res.text() }
}

/**
 * The first place two texts differ, with some context on either side, and a member-by-member diff when both are JSON
 * arrays or objects.
 */
export function describeDifference(a: string, b: string, names: [string, string]): string {
  let i = 0
  while (i < a.length && i < b.length && a[i] === b[i]) i++
  const from = Math.max(0, i - 120)
  const lines = [
    `  first difference at character ${i} (lengths ${a.length} and ${b.length}):`,
    `  ${names[0].padEnd(8)} …${a.slice(from, i + 120)}…`,
    `  ${names[1].padEnd(8)} …${b.slice(from, i + 120)}…`,
    `  ${' '.repeat(8)}  ${' '.repeat(i - from)}^`,
  ]
  try {
    const [x, y] = [JSON.parse(a) as unknown, JSON.parse(b) as unknown]
    const xs = Array.isArray(x) ? x : [x]
    const ys = Array.isArray(y) ? y : [y]
    if (xs.length !== ys.length) lines.push(`  ${xs.length} items against ${ys.length}`)
    for (let k = 0; k < Math.min(xs.length, ys.length); k++) {
      const [p, q] = [JSON.stringify(xs[k]), JSON.stringify(ys[k])]
      if (p === q) continue
      lines.push(`  item ${k}:`, `    ${names[0].padEnd(8)} ${p}`, `    ${names[1].padEnd(8)} ${q}`)
      const [kp, kq] = [Object.keys((xs[k] ?? {}) as object).join(','), Object.keys((ys[k] ?? {}) as object).join(',')]
      if (kp !== kq) lines.push(`    members: ${kp} against ${kq}`)
      break
    }
  } catch {
    // not JSON: the character diff above says it
  }
  return lines.join('\n')
}

const JSON_TYPE = 'application/json; charset=utf-8'

/**
 * Sends each request to every server in `urls` (name → origin; the first is
 * the reference, the service) one server after the other, and throws a
 * Mismatch naming the request and showing the difference unless every server
 * answers with the expected status, the same body (after `normalize`), JSON
 * as `application/json; charset=utf-8`, and the ETag and Location asked for.
 * The servers named in `minimal` get only the requests not marked
 * `extended`, and are not asked for ETags and Locations.
 * Returns the number of requests sent to the reference server.
 */
export async function checkSameBodies(
  urls: Record<string, string>,
  requests: readonly CheckRequest[],
  minimal: readonly string[] = [],
): Promise<number> {
  const reference = Object.keys(urls)[0]!
  const problems: string[] = []
  for (const r of requests) {
    const names = Object.keys(urls).filter((name) => !(r.extended && minimal.includes(name)))
    const answers = new Map<string, Answer>()
    for (const name of names) {
      await r.before?.(name)
      answers.set(name, await send(urls[name]!, name, r))
    }
    const ref = answers.get(reference)!
    const normalize = r.normalize ?? ((s: string) => s)
    for (const name of names) {
      const a = answers.get(name)!
      const where = `${r.label} (${r.method ?? 'GET'} ${r.path}), ${name}`
      if (a.status !== r.expect) {
        problems.push(`${where}: status ${a.status}, expected ${r.expect}; body ${a.body.slice(0, 300)}`)
        continue
      }
      if (a.body !== '' && r.compareBody !== false && a.headers.get('content-type') !== JSON_TYPE) {
        problems.push(`${where}: Content-Type ${a.headers.get('content-type')}, expected ${JSON_TYPE}`)
      }
      if (r.etag !== undefined && !minimal.includes(name)) {
        const want = r.etag === true ? ref.headers.get('etag') : r.etag
        if (!want || a.headers.get('etag') !== want)
          problems.push(`${where}: ETag ${a.headers.get('etag')}, expected ${want}`)
      }
      if (r.location && !minimal.includes(name)) {
        const id = (JSON.parse(a.body) as { id?: number }).id
        if (a.headers.get('location') !== `${r.location}/${id}`)
          problems.push(`${where}: Location ${a.headers.get('location')}, expected ${r.location}/${id}`)
      }
      const more = await r.check?.(name, a, minimal.includes(name))
      if (more) problems.push(`${where}: ${more}`)
      if (name === reference || r.compareBody === false) continue
      const [x, y] = [normalize(ref.body), normalize(a.body)]
      if (x !== y)
        problems.push(
          `${where}: the body differs from the ${reference}'s\n${describeDifference(x, y, [reference, name])}`,
        )
    }
  }
  if (problems.length) throw new Mismatch(`${problems.length} mismatch(es):\n${problems.join('\n')}`)
  return requests.length
}

// ---- the benchmark's requests ---------------------------------------------------

/** `2026-11-22T10:15:30.123Z`: only this spelling is normalized, so any other shows as a difference. */
const TIMESTAMP = '[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z'
/** Replaces the value of members whose name matches `name` (a pattern) where it matches `value`; the name is kept. */
const replaceMember = (name: string, value: string, by: string) => (s: string) =>
  s.replace(new RegExp(`"(${name})":${value}`, 'g'), `"$1":${by}`)
const pipe =
  (...fs: Array<(s: string) => string>) =>
  (s: string) =>
    fs.reduce((t, f) => f(t), s)

export interface RequestContext {
  /** Rows of the seeded database (users and products 1..rows). */
  rows: number
  /** `Bearer <admin JWT>`. */
  authorization: string
  apiKey: string
  /** A connection to the benchmark database, to put back the row PATCH changes. */
  db: Sql
  /** Distinguishes this run's new e-mail addresses. */
  tag: string
  /** The JWT key: when given, tokens that must be refused (and a plain user's) are checked too. */
  jwt?: { secret: string; kid: string; issuer?: string }
}

/**
 * Every deterministic request of `make bench` (and its growth series), plus
 * the statuses of a few refusals. Writes: POST /users with a distinct e-mail
 * per server (id, e-mail and timestamps normalized); PATCH on one product put
 * back to the same state before each server's request, so that everything but
 * updated_at must match, ETag included.
 */
export function standardRequests(ctx: RequestContext): CheckRequest[] {
  const { rows, apiKey, db, tag } = ctx
  const auth = { authorization: ctx.authorization }
  const deep = Math.floor(rows * 0.9)
  const offset = Math.min(deep, 100_000)
  const tail = rows - 10
  const someone = Math.max(2, Math.floor(rows / 3))
  const patched = Math.max(2, Math.floor(rows / 2))
  const get = (label: string, path: string, extra: Partial<CheckRequest> = {}): CheckRequest => ({
    label,
    path,
    headers: auth,
    expect: 200,
    ...extra,
  })
  // The product as bench/seed.ts made it (stock id % 1000, updated_at = created_at): each PATCH starts from it, and the
  // check leaves it so.
  const putBack = async () => {
    await db`UPDATE products SET stock = id % 1000, description = 'A product of the benchmark catalogue, number ' ||
      id || '.', version = 1,
               updated_at = created_at WHERE id = ${patched}`
  }
  const patchHeaders = { ...auth, 'content-type': 'application/merge-patch+json' }
  return [
    get('health', '/healthz', { headers: {} }),
    get('a user', '/users/1', { etag: '"v1"' }),
    get('another user', `/users/${someone}`, { etag: '"v1"' }),
    get('first page of users', '/users?limit=50'),
    get('keyset page of users', `/users?limit=50&id[gt]=${deep}`),
    get('keyset page of users, encoded', `/users?limit=50&id%5Bgt%5D=${deep}`),
    get('last, short page of users', `/users?limit=50&id[gt]=${tail}`),
    get('offset page of users', `/users?limit=50&offset=${offset}`, { extended: true }),
    get('users with fields', '/users?limit=50&fields=id,name,email'),
    get('users with fields in another order', '/users?limit=20&fields=email,id,created_at'),
    get('a product (JWT)', `/products/${someone}`, { etag: '"v1"' }),
    get('a product (X-API-Key)', `/products/${someone}`, {
      headers: { 'x-api-key': apiKey },
      etag: '"v1"',
      extended: true,
    }),
    get('first page of products', '/products?limit=50'),
    get('keyset page of products', `/products?limit=50&id[gt]=${deep}`),
    get('products by -price', '/products?limit=50&sort=-price', { extended: true }),
    get('products with fields', '/products?limit=50&fields=id,sku,price'),
    get(
      'products by -price with fields and a filter',
      `/products?limit=30&sort=-price&fields=price,id&id[gt]=${deep}`,
      { extended: true },
    ),
    {
      label: 'create a user',
      method: 'POST',
      path: '/users',
      headers: { ...auth, 'content-type': 'application/json' },
      expect: 201,
      body: (server) => JSON.stringify({ name: 'Peer Check User', email: `peer-${tag}-${server}@bench.example.com` }),
      normalize: pipe(
        replaceMember('id', '[0-9]+', '0'),
        replaceMember('email', `"peer-${tag}-[a-z]+@bench\\.example\\.com"`, '"E"'),
        replaceMember('(created|updated)_at', `"${TIMESTAMP}"`, '"T"'),
      ),
      etag: '"v1"',
      location: '/users',
    },
    {
      label: 'create a product',
      method: 'POST',
      path: '/products',
      headers: { ...auth, 'content-type': 'application/json' },
      expect: 201,
      body: (server) => JSON.stringify(newProduct(`pc-${tag}-${server}`, 0)),
      normalize: pipe(replaceMember('id', '[0-9]+', '0'), productSkus, timestamps),
      etag: '"v1"',
      location: '/products',
    },
    ...batchRequests(ctx, auth),
    {
      label: 'change a product',
      method: 'PATCH',
      path: `/products/${patched}`,
      headers: { ...patchHeaders, 'if-match': '"v1"' },
      expect: 200,
      // Seeded stocks are below 1000: this one is a change, as is description's default ('').
      body: JSON.stringify({ stock: 1234, description: null }),
      before: putBack,
      normalize: replaceMember('updated_at', `"${TIMESTAMP}"`, '"T"'),
      etag: '"v2"',
      extended: true,
    },
    {
      label: "change a product's stock",
      method: 'PATCH',
      path: `/products/${patched}`,
      headers: { ...patchHeaders, 'if-match': '"v1"' },
      expect: 200,
      body: JSON.stringify({ stock: 1234 }),
      before: putBack,
      normalize: replaceMember('updated_at', `"${TIMESTAMP}"`, '"T"'),
      etag: '"v2"',
    },
    {
      label: 'an empty merge patch changes nothing',
      method: 'PATCH',
      path: `/products/${patched}`,
      headers: { ...patchHeaders, 'if-match': '"v1"' },
      expect: 200,
      body: '{}',
      before: putBack,
      etag: '"v1"',
      extended: true,
    },
    // Refusals: statuses only.
    {
      label: 'a stale If-Match',
      method: 'PATCH',
      path: `/products/${patched}`,
      headers: { ...patchHeaders, 'if-match': '"v999"' },
      body: '{"stock":1}',
      before: putBack,
      expect: 412,
      compareBody: false,
      extended: true,
    },
    {
      label: 'an e-mail taken',
      method: 'POST',
      path: '/users',
      headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'X', email: 'USER2@bench.example.com' }),
      expect: 409,
      compareBody: false,
    },
    {
      label: 'an invalid e-mail',
      method: 'POST',
      path: '/users',
      headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'X', email: 'nobody' }),
      expect: 422,
      compareBody: false,
      extended: true,
    },
    {
      label: 'malformed JSON',
      method: 'POST',
      path: '/users',
      headers: { ...auth, 'content-type': 'application/json' },
      body: '{"name":',
      expect: 400,
      compareBody: false,
    },
    {
      label: 'not JSON',
      method: 'POST',
      path: '/users',
      headers: { ...auth, 'content-type': 'text/plain' },
      body: 'name=X',
      expect: 415,
      compareBody: false,
      extended: true,
    },
    {
      label: "an id in the body that is not the path's",
      method: 'PATCH',
      path: `/products/${patched}`,
      headers: patchHeaders,
      body: '{"id":1,"stock":1}',
      expect: 422,
      compareBody: false,
      extended: true,
    },
    {
      label: 'a member that is not one',
      method: 'PATCH',
      path: `/products/${patched}`,
      headers: patchHeaders,
      body: '{"stok":1}',
      expect: 422,
      compareBody: false,
      extended: true,
    },
    { label: 'no credential', path: '/users?limit=50', expect: 401, compareBody: false },
    {
      label: 'a bad signature',
      path: '/users/1',
      headers: { authorization: ctx.authorization.slice(0, -2) + (ctx.authorization.endsWith('AA') ? 'BB' : 'AA') },
      expect: 401,
      compareBody: false,
    },
    {
      label: 'an unknown API key',
      path: '/products/1',
      headers: { 'x-api-key': 'upa_ak_' + 'A'.repeat(43) },
      expect: 401,
      compareBody: false,
    },
    {
      label: 'an API key without users:read',
      path: '/users/1',
      headers: { 'x-api-key': apiKey },
      expect: 403,
      compareBody: false,
      extended: true,
    },
    ...(ctx.jwt ? tokenChecks(ctx.jwt, someone) : []),
    get('a user that does not exist', `/users/${rows * 10}`, { expect: 404, compareBody: false }),
    get('an id that cannot be one', '/products/abc', { expect: 404, compareBody: false, extended: true }),
    get('a limit out of range', '/users?limit=0', { expect: 400, compareBody: false }),
    get('an unknown parameter', '/products?colour=red', { expect: 400, compareBody: false, extended: true }),
    get('an unknown member in fields', '/users?fields=id,password_hash', { expect: 400, compareBody: false }),
  ]
}

/** The SKUs `newProduct` makes, and the write's timestamps, normalized. */
const productSkus = replaceMember('sku', '"(pc|b[0-9])-[a-z0-9]+-[a-z]+-[0-9]+"', '"S"')
const timestamps = replaceMember('(created|updated)_at', `"${TIMESTAMP}"`, '"T"')

/** A product as the benchmark creates it: SKU `<prefix>-<i>`. */
const newProduct = (prefix: string, i: number) => ({
  sku: `${prefix}-${i}`,
  name: 'Peer Check Product',
  price: 1000 + i,
  currency: 'EUR',
})

/**
 * POST /batch of product creations (docs/api.md, "Batches"), what `batch-100`
 * measures: a batch of 2 answers 200 with the 2 results (each with the
 * product's Location and ETag, but from the minimal peer, which sends
 * neither) and leaves both rows; a SKU used twice, and an invalid product
 * after a valid one, are refused and leave no row (the transaction rolled back).
 */
function batchRequests(ctx: RequestContext, auth: Record<string, string>): CheckRequest[] {
  const { db, tag } = ctx
  const headers = { ...auth, 'content-type': 'application/json' }
  const sku = (n: number, server: string) => `b${n}-${tag}-${server}`
  const rowsOf = async (prefix: string) =>
    Number((await db<Array<{ n: string }>>`SELECT count(*) AS n FROM products WHERE sku LIKE ${prefix + '-%'}`)[0]!.n)
  const operations = (products: object[]) =>
    JSON.stringify({ operations: products.map((body) => ({ method: 'POST', path: '/products', body })) })
  const leftNone = (n: number) => async (server: string) => {
    const left = await rowsOf(sku(n, server))
    return left ? `${left} product(s) left by a refused batch: it was not rolled back` : undefined
  }
  return [
    {
      label: 'a batch of 2 creations',
      method: 'POST',
      path: '/batch',
      headers,
      expect: 200,
      body: (server) => operations([newProduct(sku(1, server), 0), newProduct(sku(1, server), 1)]),
      // Location and ETag are compared by `check` (the minimal peer sends neither).
      normalize: pipe(
        (s) => s.replace(/"location":"\/products\/[0-9]+","etag":"\\"v1\\"",/g, ''),
        replaceMember('id', '[0-9]+', '0'),
        productSkus,
        timestamps,
      ),
      check: async (server, answer, minimal) => {
        const { results } = JSON.parse(answer.body) as {
          results: Array<{ status: number; location?: string; etag?: string; body: { id: number } }>
        }
        if (results.length !== 2) return `${results.length} results, expected 2`
        for (const [i, r] of results.entries()) {
          if (r.status !== 201) return `result ${i}: status ${r.status}, expected 201`
          if (!minimal && (r.location !== `/products/${r.body.id}` || r.etag !== '"v1"'))
            return `result ${i}: Location ${r.location}, ETag ${r.etag}; expected /products/${r.body.id}, "v1"`
        }
        const rows = await rowsOf(sku(1, server))
        return rows === 2 ? undefined : `${rows} product(s) in the database after the batch, expected 2`
      },
    },
    {
      label: 'a batch with a SKU twice',
      method: 'POST',
      path: '/batch',
      headers,
      expect: 409,
      compareBody: false,
      body: (server) => operations([newProduct(sku(2, server), 0), newProduct(sku(2, server), 0)]),
      check: leftNone(2),
    },
    {
      label: 'a batch with an invalid product after a valid one',
      method: 'POST',
      path: '/batch',
      headers,
      expect: 422,
      compareBody: false,
      body: (server) => operations([newProduct(sku(3, server), 0), { ...newProduct(sku(3, server), 1), price: -1 }]),
      check: leftNone(3),
      extended: true,
    },
    {
      label: 'a SKU taken',
      method: 'POST',
      path: '/products',
      headers,
      // A seeded product's (bench/seed.ts).
      body: JSON.stringify({ ...newProduct('x', 0), sku: 'SKU-00000002' }),
      expect: 409,
      compareBody: false,
    },
  ]
}

/** The JWT checks every server must make: each token differs from a good one in one respect. */
function tokenChecks(key: { secret: string; kid: string; issuer?: string }, self: number): CheckRequest[] {
  const bearer = (overrides: JwtOverrides) => ({
    authorization: `Bearer ${signJwt(key.secret, key.kid, overrides, key.issuer)}`,
  })
  const refused = (label: string, overrides: JwtOverrides, expect = 401): CheckRequest => ({
    label,
    path: '/users/1',
    headers: bearer(overrides),
    expect,
    compareBody: false,
  })
  const user = { sub: String(self), role: 'user', scope: 'users:read users:write products:read' }
  return [
    { ...refused('a token of another kid', { header: { kid: 'other' } }), extended: true },
    refused('a token signed with HS384', { header: { alg: 'HS384' } }),
    refused('an expired token', { claims: { exp: Math.floor(Date.now() / 1000) - 120 } }),
    refused('a token for another audience', { claims: { aud: 'someone-else' } }),
    refused('a token of another issuer', { claims: { iss: 'someone-else' } }),
    refused('a token without users:read', { claims: { scope: 'products:read' } }, 403),
    refused('a plain user reading another user', { claims: user }, 403),
    {
      label: 'a plain user reading itself',
      path: `/users/${self}`,
      headers: bearer({ claims: user }),
      expect: 200,
      etag: '"v1"',
    },
    {
      label: 'a plain user listing users',
      path: '/users',
      headers: bearer({ claims: user }),
      expect: 403,
      compareBody: false,
    },
  ]
}

interface JwtOverrides {
  header?: Record<string, unknown>
  claims?: Record<string, unknown>
}

/**
 * An HS256 JWT the service accepts, unless overridden: the claims bench/run.ts
 * builds (an admin with every scope, valid for an hour, a session no row has
 * and the epoch of a user whose role and password never changed). An `alg`
 * other than HS256 is signed with that HMAC.
 */
export function signJwt(
  secret: string,
  kid: string,
  overrides: JwtOverrides = {},
  issuer = 'users-products-api',
): string {
  const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64url')
  const now = Math.floor(Date.now() / 1000)
  const header = { alg: 'HS256', typ: 'JWT', kid, ...overrides.header }
  const claims = {
    sub: '1',
    iss: issuer,
    aud: issuer,
    iat: now,
    exp: now + 3600,
    role: 'admin',
    scope: 'api_keys:read api_keys:write products:read products:write users:read users:write metrics:read',
    sid: String(2 ** 53),
    gen: 0,
    ...overrides.claims,
  }
  const input = `${b64(header)}.${b64(claims)}`
  const hash = ({ HS384: 'sha384', HS512: 'sha512' } as Record<string, string>)[String(header.alg)] ?? 'sha256'
  return `${input}.${createHmac(hash, secret).update(input).digest('base64url')}`
}

// ---- the stand-alone check -----------------------------------------------------------

interface Running {
  name: string
  child: ChildProcess
  origin: string
  stderr: string[]
  exited: boolean
  logFile: string
}

/** A port nothing listens on now, for a server about to start. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer()
    probe.once('error', reject)
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as { port: number }
      probe.close(() => resolve(port))
    })
  })
}

async function start(
  name: string,
  args: string[],
  env: Record<string, string>,
  readyPath: string,
  outDir: string,
): Promise<Running> {
  const logFile = join(outDir, `${name}.log`)
  const fd = openSync(logFile, 'w')
  const child = spawn(process.execPath, args, { cwd: root, env, stdio: ['ignore', fd, 'pipe'] })
  closeSync(fd)
  const server: Running = { name, child, origin: `http://127.0.0.1:${env.PORT}`, stderr: [], exited: false, logFile }
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => server.stderr.push(chunk))
  child.once('exit', () => (server.exited = true))
  const deadline = Date.now() + 30_000
  for (;;) {
    if (server.exited) throw new Error(`${name} exited at start-up:\n${server.stderr.join('')}`)
    try {
      if ((await fetch(server.origin + readyPath)).ok) return server
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`${name} did not become ready within 30 s:\n${server.stderr.join('')}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

/** SIGTERM, and the exit code it ends with (the peers must exit 0). */
async function stop(server: Running): Promise<number | null> {
  if (server.exited) return server.child.exitCode
  const exited = new Promise<number | null>((resolve) => server.child.once('exit', (code) => resolve(code)))
  server.child.kill('SIGTERM')
  const timer = setTimeout(() => server.child.kill('SIGKILL'), 15_000)
  const code = await exited
  clearTimeout(timer)
  return code
}

/** Request lines in a server's stdout: the peers must log one per request. */
function requestLines(file: string): Array<Record<string, unknown>> {
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter(Boolean)
    .flatMap((line) => {
      try {
        const entry = JSON.parse(line) as Record<string, unknown>
        return entry.msg === 'request' ? [entry] : []
      } catch {
        return []
      }
    })
}

async function main(): Promise<void> {
  const log = (msg: string) => process.stderr.write(`[peers-check] ${msg}\n`)
  const rows = Number(process.env.PEERS_CHECK_ROWS ?? 2000)
  const serviceMain = join(root, 'dist', 'main.js')
  if (!existsSync(serviceMain)) throw new Error('dist/main.js is missing: run `make build` first')
  installPeerDependencies(log)
  const outDir = join(root, 'bench', '.out', 'peers-check')
  mkdirSync(outDir, { recursive: true })

  const serverUrl = process.env.DATABASE_URL ?? startLocalCluster()
  const admin = connect(serverUrl, { max: 1, statementTimeoutMs: 10 * 60_000 })
  const running: Running[] = []
  let seeded: Seeded | undefined
  let db: Sql | undefined
  try {
    log(`seeding upa_bench_${rows}`)
    seeded = await createBenchDatabase(admin, serverUrl, rows)
    db = connect(seeded.url, { max: 1, statementTimeoutMs: 30_000 })
    const jwtKid = 'bench'
    const jwtSecret = randomBytes(36).toString('base64url')
    const common = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOST: '127.0.0.1', DATABASE_URL: seeded.url }
    const [p1, p2, p3, p4] = await Promise.all([freePort(), freePort(), freePort(), freePort()])
    running.push(
      ...(await Promise.all([
        start(
          'service',
          [serviceMain],
          {
            ...common,
            PORT: String(p1),
            NODE_ENV: 'production',
            JWT_SECRETS: `${jwtKid}:${jwtSecret}`,
            LOG_LEVEL: 'info',
            RATE_LIMIT: '0',
          },
          '/readyz',
          outDir,
        ),
        start(
          'fastify',
          [peerServers.fastify.script],
          peerEnv({ port: p2, databaseUrl: seeded.url, jwtSecret, jwtKid }),
          '/healthz',
          outDir,
        ),
        start(
          'bare',
          [peerServers.bare.script],
          peerEnv({ port: p3, databaseUrl: seeded.url, jwtSecret, jwtKid }),
          '/healthz',
          outDir,
        ),
        start(
          'minimal',
          [peerServers.minimal.script],
          peerEnv({ port: p4, databaseUrl: seeded.url, jwtSecret, jwtKid }),
          '/healthz',
          outDir,
        ),
      ])),
    )
    const urls = Object.fromEntries(running.map((s) => [s.name, s.origin]))
    const requests = standardRequests({
      rows,
      authorization: `Bearer ${signJwt(jwtSecret, jwtKid)}`,
      apiKey: seeded.apiKey,
      db,
      tag: Date.now().toString(36),
      jwt: { secret: jwtSecret, kid: jwtKid },
    })
    const sent = await checkSameBodies(urls, requests, ['minimal'])
    const compared = requests.filter((r) => r.compareBody !== false).length
    const plain = requests.filter((r) => !r.extended)
    log(
      `${sent} requests to each full ` +
        `server: ${compared} bodies identical to the service's, ${sent - compared} statuses as expected; ` +
        `the minimal Fastify ` +
        `peer: ${plain.length} of them (${plain.filter((r) => r.compareBody !== false).length} bodies)`,
    )

    const codes = new Map<string, number | null>()
    for (const s of running) codes.set(s.name, await stop(s))
    for (const name of ['fastify', 'bare', 'minimal']) {
      if (codes.get(name) !== 0)
        throw new Error(
          `${name} exited with ${codes.get(name)} on SIGTERM, expected ` +
            `0:\n${running.find((s) => s.name === name)!.stderr.join('')}`,
        )
      // The minimal peer logs nothing (Fastify's default), on purpose.
      if (name === 'minimal') continue
      const lines = requestLines(join(outDir, `${name}.log`))
      // Readiness probes are requests too: at least one line per checked request.
      if (lines.length < sent) throw new Error(`${name} logged ${lines.length} request lines for ${sent} requests`)
      const sample = lines.find((l) => l.status === 200 && l.user_id === '1')
      const missing = [
        'time',
        'level',
        'request_id',
        'method',
        'route',
        'status',
        'duration_ms',
        'user_id',
        'client',
      ].filter((k) => sample?.[k] === undefined)
      if (missing.length)
        throw new Error(`${name}'s request lines lack ${missing.join(', ')}: ${JSON.stringify(sample)}`)
      log(`${name}: exit 0 on SIGTERM; ${lines.length} request lines, e.g. ${JSON.stringify(sample)}`)
    }
    log('PASS')
  } finally {
    await Promise.all(running.map(stop))
    await db?.end({ timeout: 5 })
    if (seeded) await dropBenchDatabase(admin, seeded.name).catch(() => {})
    await admin.end({ timeout: 5 })
  }
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  main().catch((err: unknown) => {
    process.stderr.write(`[peers-check] FAIL: ${err instanceof Error ? err.message : String(err)}\n`)
    process.exit(1)
  })
}
