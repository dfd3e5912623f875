import autocannon from 'autocannon'
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { createHmac, randomBytes } from 'node:crypto'
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { cpus, totalmem } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import type { Sql } from 'postgres'
import ts from 'typescript'
import { MAX_OFFSET } from '../src/collections/declaration.js'
import { connect } from '../src/db/connect.js'
import { startLocalCluster } from '../src/db/local-cluster.js'
import { cpuBetween, cpuMicros, cpuOf, sampleRss, statusKb } from './proc.js'
import { formatComparison, formatSummary, summarize, type Summary } from './profile.js'
import { createBenchDatabase, dropBenchDatabase, removeCreatedUsers, type Seeded } from './seed.js'

// `make bench`: the service (production build, logging on) side by side with
// the bare baseline in bench/baseline.ts, on a benchmark database of its own,
// in alternating rounds; then the growth series. See bench/README.md.
//
//   node --import tsx bench/run.ts              the benchmark (what `make bench` runs after `make build`)
//   node --import tsx bench/run.ts --profile [endpoint ...]
//                                               CPU profiles of both servers per endpoint, summarized

const root = fileURLToPath(new URL('../', import.meta.url))
const outDir = join(root, 'bench', '.out')
const env = process.env

function intSetting(name: string, fallback: number, min = 1): number {
  const raw = env[name]
  if (raw === undefined || raw === '') return fallback
  const value = Number(raw)
  if (!Number.isInteger(value) || value < min) {
    console.error(`${name}: must be an integer of at least ${min} (got ${JSON.stringify(raw)})`)
    process.exit(2)
  }
  return value
}

function oneOf<T extends string>(name: string, values: readonly T[], fallback: T): T {
  const raw = env[name]
  if (raw === undefined || raw === '') return fallback
  if (!(values as readonly string[]).includes(raw)) {
    console.error(`${name}: must be one of ${values.join(', ')} (got ${JSON.stringify(raw)})`)
    process.exit(2)
  }
  return raw as T
}

const settings = {
  rows: intSetting('BENCH_ROWS', 100_000, 1000),
  duration: intSetting('BENCH_DURATION', 5),
  rounds: intSetting('BENCH_ROUNDS', 3),
  warmup: intSetting('BENCH_WARMUP', 1, 0),
  connections: intSetting('BENCH_CONNECTIONS', 32),
  pool: intSetting('BENCH_POOL', 10),
  growth: oneOf('BENCH_GROWTH', ['on', 'off', 'full'], 'on'),
  growthDuration: intSetting('BENCH_GROWTH_DURATION', 2),
  growthRounds: intSetting('BENCH_GROWTH_ROUNDS', 2),
  only: env.BENCH_ONLY ? env.BENCH_ONLY.split(',') : undefined,
  keepDb: env.BENCH_KEEP_DB === '1',
  /** Another build of the service to measure (a copy of dist/ with a fix applied), instead of dist/main.js. */
  serviceMain: env.BENCH_SERVICE_MAIN || undefined,
  logLevel: env.BENCH_LOG_LEVEL || 'info',
  /** Node's options for the service: those of `npm start` (package.json), so that it runs as in production. */
  serviceNodeArgs: env.BENCH_SERVICE_NODE_ARGS !== undefined ? env.BENCH_SERVICE_NODE_ARGS.split(' ').filter(Boolean) : startScriptNodeArgs(),
}

/** The options between `node` and the entry point in package.json's start script. */
function startScriptNodeArgs(): string[] {
  const start = (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { scripts: { start: string } }).scripts.start
  const words = start.split(' ').filter(Boolean)
  if (words[0] !== 'node' || words[words.length - 1] !== 'dist/main.js') throw new Error(`package.json start script is not \`node [options] dist/main.js\`: ${start}`)
  return words.slice(1, -1)
}

const log = (msg: string) => process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${msg}\n`)

// ---- credentials -------------------------------------------------------------

const jwtKid = 'bench'
const jwtSecret = randomBytes(36).toString('base64url') // 48 characters: the service wants at least 32 bytes
const issuer = 'users-products-api'

function signJwt(claims: Record<string, unknown>): string {
  const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64url')
  const input = `${b64({ alg: 'HS256', typ: 'JWT', kid: jwtKid })}.${b64(claims)}`
  return `${input}.${createHmac('sha256', jwtSecret).update(input).digest('base64url')}`
}

const now = Math.floor(Date.now() / 1000)
// Admin user 1, every scope, valid for a day: what a login would issue, signed with the same secret.
const token = signJwt({
  sub: '1', iss: issuer, aud: issuer, iat: now, exp: now + 86_400, role: 'admin',
  scope: 'api_keys:read api_keys:write products:read products:write users:read users:write',
  // A session no row has and the epoch of a user whose role and password never changed: checked in memory like any JWT.
  sid: String(2 ** 53), gen: 0,
})
const bearer = { authorization: `Bearer ${token}` }

// ---- servers -----------------------------------------------------------------

type Kind = 'service' | 'baseline'

interface RunningServer {
  kind: Kind
  child: ChildProcess
  pid: number
  origin: string
  /** application_name of its PostgreSQL connections, to find its backends. */
  appName: string
  stderr: string[]
  exited: boolean
  logFile?: string
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer()
    probe.once('error', reject)
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as { port: number }
      probe.close(() => resolve(port))
    })
  })
}

const running = new Set<RunningServer>()
const autocannonVersion = (JSON.parse(readFileSync(join(root, 'node_modules', 'autocannon', 'package.json'), 'utf8')) as { version: string }).version

function baselineScript(): string {
  mkdirSync(outDir, { recursive: true })
  // Compiled, not run under tsx: the loader's worker thread would add its memory to the baseline's RSS.
  const source = readFileSync(join(root, 'bench', 'baseline.ts'), 'utf8')
  const { outputText } = ts.transpileModule(source, {
    fileName: 'baseline.ts',
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
  })
  const file = join(outDir, 'baseline.js')
  writeFileSync(file, outputText)
  return file
}

async function startServer(kind: Kind, db: Seeded, nodeArgs: string[] = []): Promise<RunningServer> {
  const port = await freePort()
  const common = { PATH: env.PATH ?? '/usr/bin:/bin', PORT: String(port), HOST: '127.0.0.1', DATABASE_URL: db.url, DATABASE_POOL_MAX: String(settings.pool) }
  let child: ChildProcess
  let logFile: string | undefined
  if (kind === 'service') {
    const main = settings.serviceMain ?? join(root, 'dist', 'main.js')
    if (!existsSync(main)) throw new Error(`${main} is missing: run \`make build\` first (\`make bench\` does)`)
    // The log goes to a file, as to a log shipper: every request is still serialized and written.
    logFile = join(outDir, `service-${db.rows}.log`)
    const fd = openSync(logFile, 'a')
    child = spawn(process.execPath, [...settings.serviceNodeArgs, ...nodeArgs, main], {
      cwd: root,
      env: { ...common, NODE_ENV: 'production', JWT_SECRETS: `${jwtKid}:${jwtSecret}`, LOG_LEVEL: settings.logLevel, RATE_LIMIT: '0' },
      stdio: ['ignore', fd, 'pipe'],
    })
    closeSync(fd)
  } else {
    child = spawn(process.execPath, [...nodeArgs, baselinePath], {
      cwd: root,
      env: { ...common, BENCH_JWT_SECRET: jwtSecret, BENCH_JWT_KID: jwtKid },
      stdio: ['ignore', 'ignore', 'pipe'],
    })
  }
  const server: RunningServer = {
    kind, child, pid: child.pid!, origin: `http://127.0.0.1:${port}`,
    appName: kind === 'service' ? 'users-products-api' : 'upa-bench-baseline',
    stderr: [], exited: false, ...(logFile ? { logFile } : {}),
  }
  running.add(server)
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => server.stderr.push(chunk))
  child.once('exit', () => {
    server.exited = true
    running.delete(server)
  })
  const readyPath = kind === 'service' ? '/readyz' : '/healthz'
  const deadline = Date.now() + 30_000
  for (;;) {
    if (server.exited) throw new Error(`the ${kind} exited at start-up:\n${server.stderr.join('')}`)
    try {
      const res = await fetch(server.origin + readyPath)
      if (res.ok) break
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error(`the ${kind} did not become ready within 30 s:\n${server.stderr.join('')}`)
    await new Promise((r) => setTimeout(r, 100))
  }
  return server
}

async function stopServer(server: RunningServer): Promise<void> {
  if (server.exited) return
  const exited = new Promise<void>((resolve) => server.child.once('exit', () => resolve()))
  server.child.kill('SIGTERM')
  const timer = setTimeout(() => server.child.kill('SIGKILL'), 15_000)
  await exited
  clearTimeout(timer)
}

// ---- endpoints ---------------------------------------------------------------

interface RequestSpec {
  method?: string
  path?: string
  headers?: Record<string, string>
  setupRequest?: (req: { path: string }) => Record<string, unknown>
}

interface Endpoint {
  key: string
  label: string
  expect: number
  request(kind: Kind): RequestSpec
  /** Deterministic: both servers must answer with the same body (checked once before measuring). */
  compare?: boolean
  /** Puts the database back after a run (POST /users). */
  after?: () => Promise<void>
}

interface DeepPage {
  servicePath: string
  baselinePath: string
  afterId: number
}

const randomId = (rows: number) => 1 + Math.floor(Math.random() * rows)
const runTag = Date.now().toString(36)
let created = 0

function endpoints(db: Seeded, deep: DeepPage): Endpoint[] {
  const rows = db.rows
  const offset = Math.min(Math.floor(rows * 0.9), MAX_OFFSET)
  const get = (path: string, headers: Record<string, string> = bearer): RequestSpec => ({ method: 'GET', path, headers })
  const randomPath = (prefix: string, headers: Record<string, string> = bearer): RequestSpec => ({
    method: 'GET', path: `${prefix}/1`, headers,
    setupRequest: (req) => ({ ...req, path: `${prefix}/${randomId(rows)}` }),
  })
  return [
    { key: 'user', label: 'GET /users/{id}', expect: 200, request: () => randomPath('/users') },
    { key: 'users-first', label: 'GET /users?limit=50', expect: 200, compare: true, request: () => get('/users?limit=50') },
    {
      key: 'users-deep', label: `GET /users?limit=50&cursor=… (id > ${deep.afterId.toLocaleString('en')})`, expect: 200, compare: true,
      request: (kind) => get(kind === 'service' ? deep.servicePath : deep.baselinePath),
    },
    {
      key: 'users-offset', label: `GET /users?limit=50&offset=${offset.toLocaleString('en')}`, expect: 200, compare: true,
      request: () => get(`/users?limit=50&offset=${offset}`),
    },
    { key: 'products-price', label: 'GET /products?limit=50&sort=-price', expect: 200, compare: true, request: () => get('/products?limit=50&sort=-price') },
    {
      key: 'post-user', label: 'POST /users', expect: 201,
      request: () => ({
        method: 'POST', path: '/users', headers: { ...bearer, 'content-type': 'application/json' },
        setupRequest: (req) => ({ ...req, body: JSON.stringify({ name: 'Bench New User', email: `new-${runTag}-${++created}@bench.example.com` }) }),
      }),
      after: async () => void (await removeCreatedUsers(db.url, rows)),
    },
    {
      key: 'patch-product', label: 'PATCH /products/{id}', expect: 200,
      request: () => ({
        method: 'PATCH', path: '/products/1', headers: { ...bearer, 'content-type': 'application/merge-patch+json' },
        setupRequest: (req) => ({ ...req, path: `/products/${randomId(rows)}`, body: JSON.stringify({ stock: Math.floor(Math.random() * 1_000_000) }) }),
      }),
    },
    { key: 'product-jwt', label: 'GET /products/{id} (JWT)', expect: 200, request: () => randomPath('/products') },
    { key: 'product-apikey', label: 'GET /products/{id} (X-API-Key)', expect: 200, request: () => randomPath('/products', { 'x-api-key': db.apiKey }) },
  ]
}

const ALL_ENDPOINTS = ['user', 'users-first', 'users-deep', 'users-offset', 'products-price', 'post-user', 'patch-product', 'product-jwt', 'product-apikey']
const MAIN_ENDPOINTS = ['user', 'users-first', 'users-deep', 'products-price', 'post-user', 'patch-product', 'product-jwt', 'product-apikey']
const GROWTH_ENDPOINTS = ['user', 'users-first', 'users-deep', 'users-offset']

/**
 * A real cursor deep in the table, as a client gets it: an `offset` page's
 * Link (offset is capped at 100,000), then cursor pages of 200 until the
 * last row is at 90 % of the table; the measured request asks for 50 rows.
 */
async function findDeepPage(service: RunningServer, rows: number): Promise<DeepPage> {
  const target = Math.floor(rows * 0.9)
  let next = `/users?limit=${Math.min(200, target)}&offset=${Math.max(0, Math.min(target, MAX_OFFSET) - Math.min(200, target))}`
  let reached = 0
  let pages = 0
  for (;;) {
    const res = await fetch(service.origin + next, { headers: bearer })
    if (!res.ok) throw new Error(`walking /users for a deep cursor: ${res.status} ${await res.text()}`)
    const page = (await res.json()) as Array<{ id: number }>
    reached = page[page.length - 1]!.id
    pages++
    const link = /^<([^>]+)>; rel="next"$/.exec(res.headers.get('link') ?? '')
    if (!link) throw new Error('walking /users for a deep cursor: no next link')
    const url = new URL(link[1]!, service.origin)
    if (reached >= target) {
      url.searchParams.set('limit', '50')
      log(`deep cursor: after id ${reached.toLocaleString('en')}, reached in ${pages} request(s)`)
      return { servicePath: url.pathname + url.search, baselinePath: `/users?limit=50&after=${reached}`, afterId: reached }
    }
    url.searchParams.set('limit', String(Math.min(200, target - reached)))
    next = url.pathname + url.search
  }
}

/** Both servers must give the same answer to the deterministic requests: the baseline does the same work. */
async function checkEquivalence(pair: Pair, list: Endpoint[]): Promise<void> {
  for (const e of list) {
    const answer = async (server: RunningServer) => {
      const spec = e.request(server.kind)
      const built = (spec.setupRequest?.({ path: spec.path! }) ?? spec) as { path?: string; body?: string }
      const res = await fetch(server.origin + (built.path ?? spec.path), {
        method: spec.method ?? 'GET',
        headers: spec.headers ?? {},
        ...(built.body ? { body: built.body } : {}),
      })
      return { status: res.status, body: await res.text() }
    }
    const s = await answer(pair.service)
    const b = await answer(pair.baseline)
    if (s.status !== e.expect || b.status !== e.expect) {
      throw new Error(`${e.label}: expected ${e.expect}, got service ${s.status} ${s.body.slice(0, 300)}, baseline ${b.status} ${b.body.slice(0, 300)}`)
    }
    if (e.compare && s.body !== b.body) throw new Error(`${e.label}: the baseline's answer differs from the service's`)
    await e.after?.()
  }
}

// ---- measuring ---------------------------------------------------------------

interface Measurement {
  requests: number
  rps: number
  p50: number
  p99: number
  cpuPerRequest: number
  /** CPU of the PostgreSQL backends of this server's pool per request; undefined when not readable (remote server). */
  dbCpuPerRequest: number | undefined
  peakRssMb: number
  errors: number
  statuses: Record<string, number>
}

let admin: Sql

async function backendCpu(db: Seeded, appName: string): Promise<Map<number, number> | undefined> {
  const rows = await admin<Array<{ pid: number }>>`SELECT pid FROM pg_stat_activity WHERE datname = ${db.name} AND application_name = ${appName}`
  const cpu = cpuOf(rows.map((r) => r.pid))
  return rows.length && !cpu.size ? undefined : cpu
}

function percentile(sorted: Float64Array, p: number): number {
  if (!sorted.length) return NaN
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!
}

async function measure(server: RunningServer, db: Seeded, e: Endpoint, duration: number): Promise<Measurement> {
  if (server.exited) throw new Error(`the ${server.kind} has exited:\n${server.stderr.join('')}`)
  const spec = e.request(server.kind)
  const latencies: number[] = []
  const dbBefore = await backendCpu(db, server.appName)
  const rss = sampleRss(server.pid)
  const cpuBefore = cpuMicros(server.pid)!
  const instance = autocannon({ url: server.origin, connections: settings.connections, duration, requests: [spec as never] })
  instance.on('response', (_client, _status, _bytes, responseTime) => void latencies.push(responseTime))
  const result = await instance
  const cpuAfter = cpuMicros(server.pid)
  const peakRssMb = rss.stop()
  const dbAfter = await backendCpu(db, server.appName)
  if (cpuAfter === undefined) throw new Error(`the ${server.kind} exited during ${e.label}:\n${server.stderr.join('')}`)
  const sorted = Float64Array.from(latencies).sort()
  const statuses = Object.fromEntries(Object.entries(result.statusCodeStats).map(([code, { count }]) => [code, Number(count)]))
  const unexpected = Object.entries(statuses).filter(([code]) => Number(code) !== e.expect).reduce((n, [, c]) => n + c, 0)
  const n = result.requests.total
  const m: Measurement = {
    requests: n,
    rps: n / result.duration,
    p50: percentile(sorted, 50),
    p99: percentile(sorted, 99),
    cpuPerRequest: n ? (cpuAfter - cpuBefore) / n : NaN,
    dbCpuPerRequest: dbBefore && dbAfter && n ? cpuBetween(dbBefore, dbAfter) / n : undefined,
    peakRssMb,
    errors: unexpected + result.errors + result.timeouts,
    statuses,
  }
  await e.after?.()
  return m
}

interface Pair {
  service: RunningServer
  baseline: RunningServer
}

async function startPair(db: Seeded): Promise<Pair> {
  const [service, baseline] = await Promise.all([startServer('service', db), startServer('baseline', db)])
  return { service, baseline }
}

async function stopPair(pair: Pair): Promise<void> {
  await Promise.all([stopServer(pair.service), stopServer(pair.baseline)])
}

type Series = Record<string, Record<Kind, Measurement[]>>

/** A table size under test: its database, its deep cursor, its endpoints (checked against both servers). */
interface Subject {
  db: Seeded
  deep: DeepPage
  endpoints: Endpoint[]
}

async function prepare(serverUrl: string, rows: number): Promise<Subject> {
  const db = await seed(serverUrl, rows)
  writeFileSync(join(outDir, `service-${rows}.log`), '')
  const pair = await startPair(db)
  try {
    const deep = await findDeepPage(pair.service, rows)
    const list = endpoints(db, deep)
    await checkEquivalence(pair, list)
    return { db, deep, endpoints: list }
  } finally {
    await stopPair(pair)
  }
}

const peakHwmMb: Record<Kind, number> = { service: 0, baseline: 0 }

/**
 * One measurement of one endpoint on both servers: fresh processes, warm-up,
 * then the two back to back, the first of the two alternating by round.
 * Fresh processes because postgres.js 3.4.9 slows down with every statement a
 * saturated pool has run (see bench/README.md, "Findings"): a process that has
 * served the endpoints before would pay for them here.
 */
async function measureCell(subject: Subject, e: Endpoint, round: number, duration: number, label: string, series: Series): Promise<void> {
  const pair = await startPair(subject.db)
  try {
    const order: Kind[] = round % 2 === 0 ? ['service', 'baseline'] : ['baseline', 'service']
    if (settings.warmup) for (const kind of order) await measure(pair[kind], subject.db, e, settings.warmup)
    series[e.key] ??= { service: [], baseline: [] }
    for (const kind of order) {
      const m = await measure(pair[kind], subject.db, e, duration)
      series[e.key]![kind].push(m)
      log(`${label} ${e.label.padEnd(44)} ${kind.padEnd(8)} ${m.rps.toFixed(0).padStart(6)} req/s  p50 ${m.p50.toFixed(2).padStart(6)} ms  p99 ${m.p99.toFixed(2).padStart(6)} ms  ${m.cpuPerRequest.toFixed(0).padStart(5)} µs CPU/req${m.errors ? `  ${m.errors} errors ${JSON.stringify(m.statuses)}` : ''}`)
    }
    for (const kind of order) peakHwmMb[kind] = Math.max(peakHwmMb[kind], (statusKb(pair[kind].pid, 'VmHWM') ?? 0) / 1024)
  } finally {
    await stopPair(pair)
  }
}

// ---- reporting ---------------------------------------------------------------

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2
}

function cell(xs: Array<number | undefined>, digits: number): string {
  const v = xs.filter((x): x is number => x !== undefined && Number.isFinite(x))
  if (!v.length) return 'n/a'
  const f = (x: number) => x.toLocaleString('en', { minimumFractionDigits: digits, maximumFractionDigits: digits })
  if (v.length === 1) return f(v[0]!)
  return `${f(median(v))} (${f(Math.min(...v))}–${f(Math.max(...v))})`
}

const ratios = (s: Record<Kind, Measurement[]>, pick: (m: Measurement) => number | undefined) =>
  s.service.map((m, i) => {
    const a = pick(m)
    const b = pick(s.baseline[i]!)
    return a === undefined || b === undefined || !b ? undefined : a / b
  })

function mainTables(list: Endpoint[], series: Series): string {
  const out: string[] = []
  out.push('| endpoint | server | req/s | p50 ms | p99 ms | CPU µs/req | DB CPU µs/req | peak RSS MB | errors |')
  out.push('|---|---|--:|--:|--:|--:|--:|--:|--:|')
  for (const e of list) {
    for (const kind of ['service', 'baseline'] as const) {
      const ms = series[e.key]![kind]
      out.push(`| ${kind === 'service' ? e.label : ''} | ${kind} | ${cell(ms.map((m) => m.rps), 0)} | ${cell(ms.map((m) => m.p50), 2)} | ${cell(ms.map((m) => m.p99), 2)} | ${cell(ms.map((m) => m.cpuPerRequest), 0)} | ${cell(ms.map((m) => m.dbCpuPerRequest), 0)} | ${cell(ms.map((m) => m.peakRssMb), 0)} | ${ms.reduce((n, m) => n + m.errors, 0)} |`)
    }
  }
  out.push('', 'Service ÷ baseline, in the same round (median, min–max):', '')
  out.push('| endpoint | CPU µs/req | p99 | req/s | DB CPU µs/req |')
  out.push('|---|--:|--:|--:|--:|')
  for (const e of list) {
    const s = series[e.key]!
    out.push(`| ${e.label} | ${cell(ratios(s, (m) => m.cpuPerRequest), 2)} | ${cell(ratios(s, (m) => m.p99), 2)} | ${cell(ratios(s, (m) => m.rps), 2)} | ${cell(ratios(s, (m) => m.dbCpuPerRequest), 2)} |`)
  }
  return out.join('\n')
}

function targets(list: Endpoint[], series: Series): string {
  const out: string[] = []
  const check = (ok: boolean | undefined, text: string) => out.push(`- ${ok === undefined ? 'n/a ' : ok ? 'PASS' : 'FAIL'} ${text}`)
  const labels: Record<string, string> = {
    user: 'GET /users/{id}', 'users-first': 'first page', 'users-deep': 'deep cursor page', 'products-price': 'products by -price',
  }
  for (const key of Object.keys(labels)) {
    const s = series[key]
    if (!s) continue
    const cpu = median(ratios(s, (m) => m.cpuPerRequest).filter((x): x is number => x !== undefined))
    check(cpu <= 1.15, `CPU per request ≤ 1.15 × baseline, ${labels[key]}: ${cpu.toFixed(2)} ×`)
  }
  for (const e of list) {
    const s = series[e.key]
    if (!s) continue
    const p99 = median(ratios(s, (m) => m.p99).filter((x): x is number => x !== undefined))
    check(p99 <= 1.2, `p99 ≤ 1.2 × baseline, ${e.label}: ${p99.toFixed(2)} ×`)
  }
  const rss = Math.max(...Object.values(series).flatMap((s) => s.service.map((m) => m.peakRssMb)))
  check(rss < 120, `service RSS under load < 120 MB: peak ${rss.toFixed(0)} MB`)
  const jwt = series['product-jwt']?.service
  const key = series['product-apikey']?.service
  if (jwt && key) {
    const cpu = median(key.map((m, i) => m.cpuPerRequest / jwt[i]!.cpuPerRequest))
    const p50 = median(key.map((m, i) => m.p50 / jwt[i]!.p50))
    const db = median(key.map((m, i) => (m.dbCpuPerRequest ?? NaN) / (jwt[i]!.dbCpuPerRequest ?? NaN)))
    check(cpu <= 1.15 && p50 <= 1.2, `API key no slower than a JWT (GET /products/{id}): service CPU ${cpu.toFixed(2)} ×, p50 ${p50.toFixed(2)} ×, DB CPU ${Number.isFinite(db) ? db.toFixed(2) : 'n/a'} ×`)
  }
  return out.join('\n')
}

function growthTable(list: Endpoint[], sizes: number[], bySize: Map<number, { series: Series; labels: Record<string, string> }>): string {
  const out: string[] = []
  out.push(`| request | server | ${sizes.map((n) => `${n.toLocaleString('en')} rows`).join(' | ')} |`)
  out.push(`|---|---|${sizes.map(() => '--:').join('|')}|`)
  for (const e of list) {
    for (const kind of ['service', 'baseline'] as const) {
      const cells = sizes.map((n) => {
        const entry = bySize.get(n)
        const ms = entry?.series[e.key]?.[kind]
        if (!ms?.length) return 'n/a'
        const med = (f: (m: Measurement) => number | undefined) => {
          const v = ms.map(f).filter((x): x is number => x !== undefined)
          return v.length ? median(v) : NaN
        }
        const lbl = e.key === 'users-deep' || e.key === 'users-offset' ? ` ${entry!.labels[e.key]}` : ''
        return `${med((m) => m.rps).toFixed(0)} req/s, p50 ${med((m) => m.p50).toFixed(2)} ms, CPU ${med((m) => m.cpuPerRequest).toFixed(0)} µs, DB ${Number.isFinite(med((m) => m.dbCpuPerRequest)) ? med((m) => m.dbCpuPerRequest).toFixed(0) : 'n/a'} µs${lbl}`
      })
      out.push(`| ${kind === 'service' ? e.label.replace(/ \(id > .*\)$/, '').replace(/offset=[0-9,]+/, 'offset=90 %') : ''} | ${kind} | ${cells.join(' | ')} |`)
    }
  }
  return out.join('\n')
}

function machine(pgVersion: string): string {
  const cpu = cpus()[0]?.model ?? 'unknown CPU'
  return `${cpus().length} × ${cpu}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB; Node ${process.version}; ${pgVersion}`
}

// ---- the run -----------------------------------------------------------------

let baselinePath = ''
const databases = new Set<string>()

async function cleanup(): Promise<void> {
  await Promise.all([...running].map(stopServer))
  if (admin) {
    if (!settings.keepDb) for (const name of databases) await dropBenchDatabase(admin, name).catch(() => {})
    await admin.end({ timeout: 5 })
  }
}

let interrupted = false
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    interrupted = true
    log(`${signal}: stopping servers and dropping the benchmark databases`)
    for (const s of running) s.child.kill('SIGTERM')
    void cleanup().finally(() => process.exit(130))
  })
}

async function seed(serverUrl: string, rows: number): Promise<Seeded> {
  log(`seeding upa_bench_${rows}: ${rows.toLocaleString('en')} users and ${rows.toLocaleString('en')} products`)
  databases.add(`upa_bench_${rows}`)
  const db = await createBenchDatabase(admin, serverUrl, rows)
  log(`seeded in ${db.seconds.toFixed(1)} s`)
  return db
}

function errorLines(file: string | undefined): number {
  if (!file || !existsSync(file)) return 0
  const r = spawnSync('grep', ['-c', '"level":"error"', file], { encoding: 'utf8' })
  return Number(r.stdout.trim()) || 0
}

async function benchmark(serverUrl: string, pgVersion: string): Promise<void> {
  const started = Date.now()
  const main = await prepare(serverUrl, settings.rows)
  const selected = (keys: string[], list: Endpoint[]) => list.filter((e) => keys.includes(e.key) && (!settings.only || settings.only.includes(e.key)))
  const mainList = selected(MAIN_ENDPOINTS, main.endpoints)
  const series: Series = {}
  for (let r = 0; r < settings.rounds; r++) {
    for (const e of mainList) await measureCell(main, e, r, settings.duration, `main ${r + 1}/${settings.rounds}`, series)
  }

  // Growth: the same id lookups and pages at several table sizes, interleaved by size within each round.
  const sizes = settings.growth === 'off' ? [] : [...new Set([10_000, 100_000, ...(settings.growth === 'full' ? [1_000_000] : [])])].sort((a, b) => a - b)
  const subjects = new Map<number, Subject>()
  for (const n of sizes) subjects.set(n, n === main.db.rows ? main : await prepare(serverUrl, n))
  const bySize = new Map<number, { series: Series; labels: Record<string, string> }>()
  for (const [n, subject] of subjects) {
    bySize.set(n, { series: {}, labels: { 'users-deep': `(id > ${subject.deep.afterId.toLocaleString('en')})`, 'users-offset': `(offset ${Math.min(Math.floor(n * 0.9), MAX_OFFSET).toLocaleString('en')})` } })
  }
  for (let r = 0; r < settings.growthRounds; r++) {
    for (const key of GROWTH_ENDPOINTS) {
      if (settings.only && !settings.only.includes(key)) continue
      for (const [n, subject] of subjects) {
        const e = subject.endpoints.find((x) => x.key === key)!
        await measureCell(subject, e, r, settings.growthDuration, `growth ${n.toLocaleString('en')} ${r + 1}/${settings.growthRounds}`, bySize.get(n)!.series)
      }
    }
  }
  const growthList = selected(GROWTH_ENDPOINTS, main.endpoints)
  const serviceErrors = errorLines(join(outDir, `service-${main.db.rows}.log`)) + sizes.filter((n) => n !== main.db.rows).reduce((k, n) => k + errorLines(join(outDir, `service-${n}.log`)), 0)

  const minutes = ((Date.now() - started) / 60_000).toFixed(1)
  const report: string[] = []
  report.push(`## Benchmark, ${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC`, '')
  report.push(`Machine: ${machine(pgVersion)}. Load generator autocannon ${autocannonVersion} (same machine), ${settings.connections} connections; pool of ${settings.pool}; ` +
    `${settings.rows.toLocaleString('en')} users and products; ${settings.rounds} rounds of ${settings.duration} s per endpoint and server, ` +
    `each on fresh processes after ${settings.warmup} s of warm-up, the servers' order alternating by round. Service: \`${['node', ...settings.serviceNodeArgs, 'dist/main.js'].join(' ')}\` (as \`npm start\`), NODE_ENV=production, LOG_LEVEL=info (log to a file), RATE_LIMIT=0. ` +
    `Figures: median (min–max) over the rounds. CPU µs/req: utime + stime of the server process over the run ÷ responses; DB CPU: the same for the PostgreSQL backends of its pool. ` +
    `Run time ${minutes} min (\`make bench\`).`, '')
  report.push(mainTables(mainList, series), '')
  report.push('Targets (medians):', '', targets(mainList, series), '')
  report.push(`Peak RSS over every run (VmHWM): service ${peakHwmMb.service.toFixed(0)} MB, baseline ${peakHwmMb.baseline.toFixed(0)} MB; error lines in the service's log: ${serviceErrors}.`, '')
  if (sizes.length) {
    report.push(`### Growth (${settings.growthRounds} round(s) of ${settings.growthDuration} s; medians)`, '')
    report.push(growthTable(growthList, sizes, bySize), '')
    report.push('Id lookups, the first page and a keyset (cursor) page deep in the table cost the same at every size: each is an index range scan of 51 rows. ' +
      `An \`offset\` page is the exception: PostgreSQL reads and discards every skipped row, so its cost grows with the offset (capped at ${MAX_OFFSET.toLocaleString('en')}); use the cursor from \`Link\` to page.`, '')
  }
  const text = report.join('\n')
  process.stdout.write('\n' + text + '\n')
  const stamp = new Date().toISOString().replace(/[:.]/g, '-').slice(0, 19)
  writeFileSync(join(outDir, `bench-${stamp}.md`), text + '\n')
  writeFileSync(join(outDir, `bench-${stamp}.json`), JSON.stringify({ settings, machine: machine(pgVersion), series, growth: Object.fromEntries(bySize), peakHwmMb }, null, 1))
  log(`report written to bench/.out/bench-${stamp}.md (raw figures: .json)`)
}

/**
 * --profile: each endpoint against a fresh service and a fresh baseline run
 * with --cpu-prof; the load window of each profile summarized per request.
 * The .cpuprofile files stay in bench/.out/profiles (ignored by git).
 */
async function profile(serverUrl: string, keys: string[]): Promise<void> {
  const db = await seed(serverUrl, settings.rows)
  writeFileSync(join(outDir, `service-${db.rows}.log`), '')
  const profiles = join(outDir, 'profiles')
  mkdirSync(profiles, { recursive: true })
  const helper = await startServer('service', db)
  const deep = await findDeepPage(helper, db.rows)
  await stopServer(helper)
  const list = endpoints(db, deep).filter((e) => (keys.length ? keys : MAIN_ENDPOINTS).includes(e.key))
  const duration = intSetting('BENCH_PROFILE_DURATION', 10)
  for (const e of list) {
    const summaries: Partial<Record<Kind, [Summary, number]>> = {}
    for (const kind of ['service', 'baseline'] as const) {
      const name = `${kind}-${e.key}.cpuprofile`
      rmSync(join(profiles, name), { force: true })
      const server = await startServer(kind, db, ['--cpu-prof', `--cpu-prof-dir=${profiles}`, `--cpu-prof-name=${name}`])
      await measure(server, db, e, 2)
      const from = Number(process.hrtime.bigint() / 1000n)
      const m = await measure(server, db, e, duration)
      const to = Number(process.hrtime.bigint() / 1000n)
      await stopServer(server)
      const summary = summarize(join(profiles, name), [from, to])
      process.stdout.write(`\n=== ${kind}: ${e.label}: ${m.rps.toFixed(0)} req/s, ${m.cpuPerRequest.toFixed(0)} µs CPU/req (process, all threads), p99 ${m.p99.toFixed(2)} ms\n`)
      process.stdout.write(formatSummary(summary, m.requests, Number(env.BENCH_PROFILE_TOP ?? 30)) + '\n')
      summaries[kind] = [summary, m.requests]
    }
    const [s, b] = [summaries.service!, summaries.baseline!]
    process.stdout.write(`\n--- ${e.label}: service against baseline\n${formatComparison(s[0], s[1], b[0], b[1], ['service', 'baseline'])}\n`)
  }
  log(`profiles in bench/.out/profiles/ (summarize again: node --import tsx bench/profile.ts <file> --requests N)`)
}

async function main(): Promise<void> {
  const args = process.argv.slice(2)
  const unknown = [...(settings.only ?? []), ...(args[0] === '--profile' ? args.slice(1) : [])].filter((k) => !ALL_ENDPOINTS.includes(k))
  if (unknown.length) throw new Error(`unknown endpoint ${unknown.join(', ')}; the endpoints are ${ALL_ENDPOINTS.join(', ')}`)
  const serverUrl = env.DATABASE_URL ?? startLocalCluster()
  admin = connect(serverUrl, { max: 1, statementTimeoutMs: 30 * 60_000 })
  const [{ version }] = (await admin<Array<{ version: string }>>`SELECT version()`) as unknown as [{ version: string }]
  const pgVersion = version.replace(/ on .*/, '').replace(/ \(.*$/, '')
  if (settings.rounds < 3 && !args.includes('--profile')) log(`BENCH_ROUNDS=${settings.rounds}: fewer than 3 rounds, min and max mean little`)
  mkdirSync(outDir, { recursive: true })
  baselinePath = baselineScript()
  try {
    if (args[0] === '--profile') await profile(serverUrl, args.slice(1))
    else await benchmark(serverUrl, pgVersion)
  } finally {
    if (!interrupted) await cleanup()
  }
}

main().catch(async (err: unknown) => {
  console.error(err instanceof Error ? err.message : err)
  if (!interrupted) await cleanup().catch(() => {})
  process.exit(1)
})
