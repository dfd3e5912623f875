import { spawnSync } from 'node:child_process'
import { createHmac, randomBytes } from 'node:crypto'
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { cpus, totalmem } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import type { Sql } from 'postgres'
import { connect } from '../src/core/db/connect.js'
import { startLocalCluster } from '../src/dev/local-cluster.js'
import {
  assertCeilingTools,
  CEILING_KEYS,
  ceilingSeconds,
  ceilingSeries,
  ceilingSettings,
  type CeilingResults,
} from './ceiling.js'
import { cpuBetween, cpuOf, machineCpu, processTree, sampleRss, treeStatusKb } from './proc.js'
import { checkSameBodies, standardRequests, type CheckRequest } from './peers-check.js'
import { formatComparison, formatSummary, summarize, type Summary } from './profile.js'
import {
  ceilingAgainstService,
  ceilingBest,
  ceilingTable,
  concurrencyKey,
  concurrencyTable,
  concurrencyTargets,
  failed,
  growthTable,
  growthTargets,
  batchTable,
  LABEL,
  mainTable,
  mainTargets,
  minimalTable,
  nameWorkers,
  outboxKey,
  outboxTable,
  outboxTargets,
  peakRssLine,
  ratioTable,
  workersTable,
  workersTargets,
  DB_SHARE_LIMIT,
  CEILING_MARGIN,
  type GrowthSize,
  type Measurement,
  type Series,
} from './report.js'
import {
  backendPids,
  createBenchDatabase,
  dropBenchDatabase,
  removeCreatedProducts,
  removeCreatedUsers,
  resetProductVersions,
  setOutbox,
  type Seeded,
} from './seed.js'
import {
  ALL_KINDS,
  KINDS,
  logFileOf,
  MINIMAL_PEERS,
  PEERS,
  running,
  startAll,
  startServer,
  stopAll,
  stopServer,
  type Kind,
  type RunningServer,
  type ServerOptions,
  type Servers,
} from './servers.js'
import { assertWrk, runWrk, type WrkRequests } from './wrk.js'
import { countsSetting, fail, intSetting, oneOf } from './settings.js'

// `make bench`: the service (production build, request log on) against three
// independent peers, a Fastify server doing the service's work, the minimal
// idiomatic Fastify server, and a bare node:http one, on a benchmark database
// of its own, in rounds that alternate the servers' order; then the same at
// 128 to 1,000 connections with the service also at WORKERS=2, the outbox series, the
// database ceiling (bench/ceiling.ts: pgbench on the service's statements),
// then the growth series.
// See bench/README.md.
//
//   node --import tsx bench/run.ts              the benchmark (what `make bench` runs after `make build`)
//   node --import tsx bench/run.ts --profile [endpoint ...]
//                                               CPU profiles of the three servers per endpoint, summarized

const root = fileURLToPath(new URL('../', import.meta.url))
const outDir = join(root, 'bench', '.out')
const env = process.env

// ---- settings ----------------------------------------------------------------

/** The options between `node` and the entry point in package.json's start script. */
function startScriptNodeArgs(): string[] {
  const start = (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { scripts: { start: string } }).scripts
    .start
  const words = start.split(' ').filter(Boolean)
  if (words[0] !== 'node' || words[words.length - 1] !== 'dist/main.js')
    throw new Error(`package.json start script is not \`node [options] dist/main.js\`: ${start}`)
  return words.slice(1, -1)
}

const settings = {
  rows: intSetting('BENCH_ROWS', 100_000, 1000),
  duration: intSetting('BENCH_DURATION', 4),
  rounds: intSetting('BENCH_ROUNDS', 3),
  warmup: intSetting('BENCH_WARMUP', 1, 0),
  connections: intSetting('BENCH_CONNECTIONS', 32),
  pool: intSetting('BENCH_POOL', 10),
  /** wrk's threads: one keeps the load generator's CPU to a core of the two. */
  threads: intSetting('BENCH_THREADS', 1),
  /** wrk's --timeout: a slower answer counts as a time-out, not as latency. */
  timeout: intSetting('BENCH_TIMEOUT', 10),
  concurrency: countsSetting('BENCH_CONCURRENCY', [128, 256, 1000], true),
  concurrencyDuration: intSetting('BENCH_CONCURRENCY_DURATION', 15),
  concurrencyRounds: intSetting('BENCH_CONCURRENCY_ROUNDS', 1),
  /** WORKERS of the concurrency series' extra server (the service forking that many workers), or 0 (`off`). */
  workers: env.BENCH_WORKERS === 'off' ? 0 : intSetting('BENCH_WORKERS', 2, 2),
  /**
   * Connections at which that server must pass `workersRuns` consecutive runs (the series runs that level as often).
   */
  workersConnections: intSetting('BENCH_WORKERS_CONNECTIONS', 1000),
  workersRuns: intSetting('BENCH_WORKERS_RUNS', 3),
  growth: oneOf('BENCH_GROWTH', ['on', 'off', 'full'], 'on'),
  outbox: oneOf('BENCH_OUTBOX', ['on', 'off'], 'on'),
  /**
   * `off`: skip the main series (to measure only the others, e.g. BENCH_MAIN=off BENCH_CONCURRENCY=off BENCH_GROWTH=off
   * for the outbox).
   */
  main: oneOf('BENCH_MAIN', ['on', 'off'], 'on'),
  growthDuration: intSetting('BENCH_GROWTH_DURATION', 4),
  growthRounds: intSetting('BENCH_GROWTH_ROUNDS', 3),
  only: env.BENCH_ONLY ? env.BENCH_ONLY.split(',') : undefined,
  keepDb: env.BENCH_KEEP_DB === '1',
  /** Another build of the service to measure (a copy of dist/ with a fix applied), instead of dist/main.js. */
  serviceMain: env.BENCH_SERVICE_MAIN || join(root, 'dist', 'main.js'),
  logLevel: env.BENCH_LOG_LEVEL || 'info',
  /** Node's options for the service: those of `npm start` (package.json), so that it runs as in production. */
  serviceNodeArgs:
    env.BENCH_SERVICE_NODE_ARGS !== undefined
      ? env.BENCH_SERVICE_NODE_ARGS.split(' ').filter(Boolean)
      : startScriptNodeArgs(),
}

/**
 * The growth series compares the service with the bare peer only: its flatness is the service's target, the peer shows
 * the database's share.
 */
const GROWTH_KINDS: readonly Kind[] = ['service', 'bare']
nameWorkers(settings.workers)

const log = (msg: string) => process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${msg}\n`)

// ---- credentials -------------------------------------------------------------

// 48 characters: the service wants 32 bytes or more
const jwt = { kid: 'bench', secret: randomBytes(36).toString('base64url'), issuer: 'users-products-api' }

function signJwt(claims: Record<string, unknown>): string {
  const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64url')
  const input = `${b64({ alg: 'HS256', typ: 'JWT', kid: jwt.kid })}.${b64(claims)}`
  return `${input}.${createHmac('sha256', jwt.secret).update(input).digest('base64url')}`
}

const now = Math.floor(Date.now() / 1000)
// Admin user 1, every scope, valid for a day: what a login would issue, signed with the same secret.
const token = signJwt({
  sub: '1',
  iss: jwt.issuer,
  aud: jwt.issuer,
  iat: now,
  exp: now + 86_400,
  role: 'admin',
  scope:
    'users:read users:write products:read products:write api_keys:read api_keys:write webhooks:read webhooks:write ' +
    'events:read metrics:read',
  // A session no row has and the epoch of a user whose role and password never changed: checked in memory like any JWT.
  sid: String(2 ** 53),
  gen: 0,
})
const bearer = { Authorization: `Bearer ${token}` }

// ---- endpoints ---------------------------------------------------------------

/** Product creations in each request of `batch-100` (issue 39: against as many single POST /products). */
const BATCH_OPERATIONS = 100

interface Endpoint {
  key: string
  label: string
  /** What wrk sends (bench/wrk.lua), the same to every server. */
  load: WrkRequests
  /**
   * A deterministic request of the same shape: every server must
   * answer it with the same bytes before anything is measured.
   */
  sample?: string
  /** Puts the table back as seeded; run before and after every load of this endpoint. */
  reset?: () => Promise<unknown>
  /** Beyond what the minimal Fastify peer serves (API keys): not measured there. */
  extended?: true
}

/** The servers of `kinds` that serve `e`. */
const serving = (e: Endpoint, kinds: readonly Kind[]) => kinds.filter((k) => !(e.extended && MINIMAL_PEERS.includes(k)))

function endpoints(db: Seeded): Endpoint[] {
  const n = db.rows
  const deep = Math.floor(n * 0.9)
  const get = (mode: WrkRequests['mode'], path: string, headers: Record<string, string> = bearer): WrkRequests => ({
    mode,
    path,
    headers,
  })
  return [
    { key: 'user', label: 'GET /users/{id}', load: get('id', '/users/'), sample: `/users/${Math.ceil(n / 3)}` },
    {
      key: 'users-first',
      label: 'GET /users?limit=50',
      load: get('static', '/users?limit=50'),
      sample: '/users?limit=50',
    },
    {
      key: 'users-keyset',
      label: 'GET /users?limit=50&id[gt]=N',
      load: get('after', '/users?limit=50&id[gt]='),
      sample: `/users?limit=50&id[gt]=${Math.floor(n / 2)}`,
    },
    // Growth only: a keyset page at 90 % of the table, whatever its size.
    {
      key: 'users-deep',
      label: 'GET /users?limit=50&id[gt]=(90 %)',
      load: get('static', `/users?limit=50&id[gt]=${deep}`),
      sample: `/users?limit=50&id[gt]=${deep}`,
    },
    {
      key: 'product-jwt',
      label: 'GET /products/{id} (JWT)',
      load: get('id', '/products/'),
      sample: `/products/${Math.ceil(n / 3)}`,
    },
    {
      key: 'product-apikey',
      label: 'GET /products/{id} (X-API-Key)',
      load: get('id', '/products/', { 'X-API-Key': db.apiKey }),
      sample: `/products/${Math.ceil(n / 4)}`,
      extended: true,
    },
    {
      key: 'products-first',
      label: 'GET /products?limit=50',
      load: get('static', '/products?limit=50'),
      sample: '/products?limit=50',
    },
    {
      key: 'products-keyset',
      label: 'GET /products?limit=50&id[gt]=N',
      load: get('after', '/products?limit=50&id[gt]='),
      sample: `/products?limit=50&id[gt]=${Math.floor(n / 2)}`,
    },
    {
      key: 'products-fields',
      label: 'GET /products?limit=50&fields=id,sku,price',
      load: get('static', '/products?limit=50&fields=id,sku,price'),
      sample: '/products?limit=50&fields=id,sku,price',
    },
    {
      key: 'post-user',
      label: 'POST /users',
      load: get('post', '/users', { ...bearer, 'Content-Type': 'application/json' }),
      reset: () => removeCreatedUsers(db.url, n),
    },
    {
      key: 'post-product',
      label: 'POST /products',
      load: get('product', '/products', { ...bearer, 'Content-Type': 'application/json' }),
      reset: () => removeCreatedProducts(db.url, n),
    },
    {
      key: `batch-${BATCH_OPERATIONS}`,
      label: `POST /batch (${BATCH_OPERATIONS} creations)`,
      load: {
        ...get('batch', '/batch', { ...bearer, 'Content-Type': 'application/json' }),
        operations: BATCH_OPERATIONS,
      },
      reset: () => removeCreatedProducts(db.url, n),
    },
    {
      key: 'patch-product',
      label: 'PATCH /products/{id} (If-Match)',
      load: get('patch', '/products/', { ...bearer, 'Content-Type': 'application/merge-patch+json' }),
      reset: () => resetProductVersions(db.url),
    },
  ]
}

const MAIN_ENDPOINTS = [
  'user',
  'users-first',
  'users-keyset',
  'product-jwt',
  'product-apikey',
  'products-first',
  'products-keyset',
  'products-fields',
  'post-user',
  'post-product',
  `batch-${BATCH_OPERATIONS}`,
  'patch-product',
]
const CONCURRENCY_ENDPOINTS = ['products-first', 'user']
const GROWTH_ENDPOINTS = ['user', 'users-first', 'users-deep']
/**
 * Writes measured with the events outbox on and off (`outboxSeries`); the creations alone and in a batch, to tell
 * what the events cost them from what the peers, which write none, do not pay.
 */
const OUTBOX_ENDPOINTS = ['post-user', 'patch-product', 'post-product', `batch-${BATCH_OPERATIONS}`]
const ALL_ENDPOINTS = [...new Set([...MAIN_ENDPOINTS, ...GROWTH_ENDPOINTS])]

const selected = (keys: string[]) => keys.filter((k) => !settings.only || settings.only.includes(k))

// ---- byte identity -----------------------------------------------------------

/**
 * Before anything is measured, every server must answer the benchmark's
 * deterministic requests (bench/peers-check.ts: pages, fields, keyset pages,
 * a POST and a PATCH normalized, refusals by status; and each measured
 * endpoint's own sample) with the service's status and bytes: otherwise the
 * comparison would compare different work.
 */
async function checkIdentity(servers: Partial<Servers>, db: Seeded, list: Endpoint[]): Promise<number> {
  const urls = Object.fromEntries(KINDS.map((k) => [k, servers[k]!.origin])) // the service first: the reference
  const conn = connect(db.url, { max: 1, statementTimeoutMs: 60_000 })
  try {
    const samples: CheckRequest[] = list.flatMap((e) =>
      e.sample
        ? [
            {
              label: e.label,
              path: e.sample,
              headers: e.load.headers,
              expect: 200,
              ...(e.extended ? { extended: true as const } : {}),
            },
          ]
        : [],
    )
    const requests = [
      ...standardRequests({
        rows: db.rows,
        authorization: bearer.Authorization,
        apiKey: db.apiKey,
        db: conn,
        tag: runTag,
        jwt,
      }),
      ...samples,
    ]
    return await checkSameBodies(urls, requests, MINIMAL_PEERS)
  } finally {
    await conn.end({ timeout: 5 })
    // The check's POSTs and batches created users and products: back to the seeded tables.
    await removeCreatedUsers(db.url, db.rows)
    await removeCreatedProducts(db.url, db.rows)
  }
}

// ---- measuring ---------------------------------------------------------------

let admin: Sql

async function backendCpu(db: Seeded, appName: string): Promise<Map<number, number> | undefined> {
  const pids = await backendPids(admin, db, appName)
  const cpu = cpuOf(pids)
  return pids.length && !cpu.size ? undefined : cpu
}

const runTag = Date.now().toString(36)
let loads = 0

/**
 * One wrk run against one server, with the server's CPU, its backends' CPU
 * and its peak RSS over the run, each summed over the server's process tree
 * (the service with WORKERS: its primary and workers), and the machine's busy share.
 */
async function measure(
  server: RunningServer,
  db: Seeded,
  e: Endpoint,
  seconds: number,
  connections: number,
  seed: number,
): Promise<Measurement> {
  if (server.exited) throw new Error(`the ${server.kind} server has exited:\n${server.stderr.join('')}`)
  await e.reset?.()
  const dbBefore = await backendCpu(db, server.appName)
  const rss = sampleRss(server.pid)
  const cpuBefore = cpuOf(processTree(server.pid))
  const machineBefore = machineCpu()
  const run = ++loads
  const r = await runWrk({
    ...e.load,
    origin: server.origin,
    rows: db.rows,
    connections,
    threads: Math.min(settings.threads, connections),
    seconds,
    timeoutSeconds: settings.timeout,
    seed,
    tag: `${runTag}-${run}`,
  })
  const cpuAfter = cpuOf(processTree(server.pid))
  const machineAfter = machineCpu()
  const peakRssMb = rss.stop()
  const dbAfter = await backendCpu(db, server.appName)
  if (server.exited || !cpuAfter.has(server.pid))
    throw new Error(`the ${server.kind} server exited during ${e.label}:\n${server.stderr.join('')}`)
  await e.reset?.()
  // Throughput and costs count successful responses only: a server that sheds load with quick 503s does not look faster
  // or cheaper for it.
  const ok = r.requests - r.errors.status
  return {
    requests: r.requests,
    rps: ok / r.seconds,
    p50: r.latencyMs.p50,
    p99: r.latencyMs.p99,
    mean: r.latencyMs.mean,
    cpuPerRequest: ok ? cpuBetween(cpuBefore, cpuAfter) / ok : NaN,
    dbCpuPerRequest: dbBefore && dbAfter && ok ? cpuBetween(dbBefore, dbAfter) / ok : undefined,
    peakRssMb,
    statusErrors: r.errors.status,
    socketErrors: r.errors.connect + r.errors.read + r.errors.write,
    timeouts: r.errors.timeout,
    machineBusy: (machineAfter.busy - machineBefore.busy) / (machineAfter.total - machineBefore.total),
  }
}

/** A table size under test: its database and endpoints. */
interface Subject {
  db: Seeded
  endpoints: Endpoint[]
}

const serverOptions = (db: Seeded): ServerOptions => ({
  root,
  outDir,
  databaseUrl: db.url,
  rows: db.rows,
  pool: settings.pool,
  jwt,
  serviceMain: settings.serviceMain,
  serviceNodeArgs: settings.serviceNodeArgs,
  logLevel: settings.logLevel,
  workers: settings.workers,
})

/**
 * Round r's order of the servers: rotated by one each round, so no server is always first (or last) after the warm-up.
 */
const rotate = <T>(xs: readonly T[], r: number): T[] => xs.map((_, i) => xs[(i + r) % xs.length]!)

/** Per server, the highest VmHWM seen (summed over its process tree: each process's own peak). */
const peakHwmMb: Record<Kind, number> = { service: 0, workers: 0, fastify: 0, minimal: 0, bare: 0 }
let cells = 0

interface Cell {
  subject: Subject
  endpoint: Endpoint
  round: number
  seconds: number
  connections: number
  kinds: readonly Kind[]
  /** Where the measurements go: series[key][kind][round]. */
  series: Series
  key: string
  label: string
}

/**
 * One endpoint on every server: fresh processes, warm-up, then the servers
 * back to back in the round's order. Fresh processes because the peers run
 * the published postgres.js 3.4.9, which gets slower with every statement a
 * saturated pool runs (bench/README.md): a process that had served the
 * endpoints before would pay for them here.
 */
async function measureCell(c: Cell): Promise<void> {
  const kinds = serving(c.endpoint, c.kinds)
  const servers = await startAll(serverOptions(c.subject.db), kinds)
  try {
    const order = rotate(kinds, c.round)
    // Every server of the cell gets the same sequence of ids; the warm-up another one.
    const seed = ++cells
    if (settings.warmup)
      for (const kind of order)
        await measure(servers[kind]!, c.subject.db, c.endpoint, settings.warmup, c.connections, seed + 100_000)
    const row = (c.series[c.key] ??= {})
    for (const kind of order) {
      const m = await measure(servers[kind]!, c.subject.db, c.endpoint, c.seconds, c.connections, seed)
      ;(row[kind] ??= []).push(m)
      const errors = failed(m)
        ? `  failed ${failed(m)} (non-2xx ${m.statusErrors}, socket ${m.socketErrors}, time-outs ${m.timeouts})`
        : ''
      log(
        `${c.label} ${c.endpoint.label.padEnd(42)} ${LABEL[kind].padEnd(20)} ${m.rps.toFixed(0).padStart(6)} ` +
          `req/s  p50 ${m.p50.toFixed(2).padStart(7)} ms  ` +
          `p99 ${m.p99.toFixed(2).padStart(7)} ms  ${m.cpuPerRequest.toFixed(0).padStart(5)} µs CPU/req${errors}`,
      )
    }
    for (const kind of order)
      peakHwmMb[kind] = Math.max(peakHwmMb[kind], (treeStatusKb(servers[kind]!.pid, 'VmHWM') ?? 0) / 1024)
  } finally {
    await stopAll(servers)
  }
}

// ---- the run -----------------------------------------------------------------

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

/** Seeds a table size, then checks that every server answers its sample requests with the same bytes. */
async function prepare(serverUrl: string, rows: number): Promise<Subject> {
  const db = await seed(serverUrl, rows)
  for (const kind of ALL_KINDS) writeFileSync(logFileOf(outDir, kind, rows), '')
  const list = endpoints(db)
  const servers = await startAll(serverOptions(db))
  try {
    const n = await checkIdentity(servers, db, list)
    log(
      `byte identity: the servers ` +
        `answer ${n} requests alike at ${rows.toLocaleString('en')} rows (${LABEL.minimal}: those it serves)`,
    )
  } finally {
    await stopAll(servers)
  }
  return { db, endpoints: list }
}

function errorLines(file: string): number {
  if (!existsSync(file)) return 0
  const r = spawnSync('grep', ['-c', '"level":"error"', file], { encoding: 'utf8' })
  return Number(r.stdout.trim()) || 0
}

/** The soft limit on open files: 1,000 connections need as many descriptors in wrk and in each server. */
function checkOpenFiles(): void {
  const needed = Math.max(settings.connections, ...settings.concurrency) + 100
  const limits = readFileSync('/proc/self/limits', 'utf8')
  const soft = Number(/^Max open files\s+(\d+|unlimited)/m.exec(limits)?.[1] ?? Infinity)
  if (soft < needed)
    fail(
      `open files are limited ` +
        `to ${soft}, ${needed} are needed ` +
        `for ${needed - 100} connections: raise the limit (\`ulimit ` +
        `-n ${Math.max(needed, 4096)}\`; \`make bench\` tries to)`,
    )
}

/**
 * Seconds the run should take with these settings, for the log: measured on the 2-core machine, about 1 s to start the
 * servers and 0.3 s around each wrk run.
 */
function expectedSeconds(): number {
  const cell = (kinds: number, seconds: number) => 1 + kinds * (settings.warmup + seconds + 0.3)
  const main =
    settings.main === 'on'
      ? settings.rounds * selected(MAIN_ENDPOINTS).length * cell(KINDS.length, settings.duration)
      : 0
  const concKinds = KINDS.length + (settings.workers ? 1 : 0)
  const conc =
    selected(CONCURRENCY_ENDPOINTS).length *
    settings.concurrency.reduce((t, c) => t + concurrencyRoundsAt(c) * cell(concKinds, settings.concurrencyDuration), 0)
  const sizes = growthSizes()
  const growth =
    settings.growthRounds *
    selected(GROWTH_ENDPOINTS).length *
    sizes.length *
    cell(GROWTH_KINDS.length, settings.growthDuration)
  const outbox =
    settings.outbox === 'on' ? settings.rounds * selected(OUTBOX_ENDPOINTS).length * 4 * cell(1, settings.duration) : 0
  const ceiling = ceilingSeconds(settings.only)
  // Seeding (about 2 s per 100,000 rows) and the byte-identity check of each size.
  const prepare = [settings.rows, ...sizes.filter((n) => n !== settings.rows)].reduce((t, n) => t + 3 + n / 50_000, 0)
  return main + conc + growth + outbox + ceiling + prepare
}

function growthSizes(): number[] {
  if (settings.growth === 'off') return []
  return [10_000, 100_000, ...(settings.growth === 'full' ? [1_000_000] : [])]
}

function versions(): string {
  const version = (dir: string, pkg: string) => {
    try {
      return (JSON.parse(readFileSync(join(dir, 'node_modules', pkg, 'package.json'), 'utf8')) as { version: string })
        .version
    } catch {
      return '?'
    }
  }
  const fastify = join(root, 'bench', 'fastify')
  const minimal = join(root, 'bench', 'fastify-minimal')
  const bare = join(root, 'bench', 'bare')
  return (
    `service: postgres.js ${version(root, 'postgres')} (patched, src/driver-patch/postgres.mjs); ` +
    `Fastify peers: fastify ${version(fastify, 'fastify')} ` +
    `and ${version(minimal, 'fastify')}, ` +
    `@fastify/jwt ${version(fastify, '@fastify/jwt')} and ${version(minimal, '@fastify/jwt')}, ` +
    `postgres.js ${version(fastify, 'postgres')} ` +
    `and ${version(minimal, 'postgres')}; bare peer: postgres.js ${version(bare, 'postgres')} (published, unpatched)`
  )
}

function machine(pgVersion: string): string {
  const cpu = cpus()[0]?.model ?? 'unknown CPU'
  return `${cpus().length} × ${cpu}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB; Node ${process.version}; ${pgVersion}`
}

const byKey = (subject: Subject, key: string) => subject.endpoints.find((e) => e.key === key)!

/** Every endpoint on the three servers, round after round, at BENCH_CONNECTIONS. */
async function mainSeries(main: Subject): Promise<Series> {
  const series: Series = {}
  if (settings.main === 'off') return series
  for (let round = 0; round < settings.rounds; round++) {
    for (const key of selected(MAIN_ENDPOINTS)) {
      await measureCell({
        subject: main,
        endpoint: byKey(main, key),
        round,
        seconds: settings.duration,
        connections: settings.connections,
        kinds: KINDS,
        series,
        key,
        label: `main ${round + 1}/${settings.rounds}`,
      })
    }
  }
  return series
}

/**
 * Runs of the concurrency series at `connections`: BENCH_WORKERS_RUNS where the service with WORKERS must pass that
 * many in a row.
 */
const concurrencyRoundsAt = (connections: number, withWorkers = settings.workers > 0) =>
  withWorkers && connections === settings.workersConnections
    ? Math.max(settings.concurrencyRounds, settings.workersRuns)
    : settings.concurrencyRounds

/**
 * Whether this build forks workers for WORKERS: the service started with
 * it, and its processes counted. A build without the support ignores the
 * variable and serves alone; its figures would be one process's again.
 */
async function workersSupported(main: Subject): Promise<{ ok: boolean; note: string }> {
  const server = await startServer('workers', serverOptions(main.db))
  try {
    const n = server.workers ?? 0
    const ok = n >= settings.workers
    return {
      ok,
      note: ok
        ? `WORKERS=${settings.workers}: a primary and ${n} workers`
        : `WORKERS not supported by this build (WORKERS=${settings.workers} started ${n} worker process(es))`,
    }
  } finally {
    await stopServer(server)
  }
}

/**
 * The same servers with many more connections than their pools have, and
 * the service with WORKERS (when the build supports it). Each count's runs
 * come one after the other: at BENCH_WORKERS_CONNECTIONS they are the
 * consecutive runs the service with WORKERS must pass.
 */
async function concurrencySeries(main: Subject, withWorkers: boolean): Promise<Series> {
  const series: Series = {}
  const kinds: Kind[] = ['service', ...(withWorkers ? (['workers'] as const) : []), ...PEERS]
  for (const key of selected(CONCURRENCY_ENDPOINTS)) {
    for (const connections of settings.concurrency) {
      const rounds = concurrencyRoundsAt(connections, withWorkers)
      for (let round = 0; round < rounds; round++) {
        await measureCell({
          subject: main,
          endpoint: byKey(main, key),
          round,
          seconds: settings.concurrencyDuration,
          connections,
          kinds,
          series,
          key: concurrencyKey(key, connections),
          label: `c=${connections} ${round + 1}/${rounds}`,
        })
      }
    }
  }
  return series
}

/**
 * What the events outbox costs a write: POST and PATCH on the service alone,
 * with events written and with them discarded (bench/seed.ts setOutbox), on
 * fresh processes. Each round measures the modes in the order on, off, off,
 * on (or the reverse): the first run after the table is reset costs more,
 * and a plain alternation with an odd number of rounds gave one mode that
 * place more often (PATCH looked 1.57 × as costly with the outbox).
 * Measurements pair up in the order taken (on[i] with off[i]), each pair
 * with one mode in the first place and the other in the second.
 */
async function outboxSeries(main: Subject): Promise<Series> {
  const series: Series = {}
  if (settings.outbox === 'off') return series
  try {
    for (let round = 0; round < settings.rounds; round++) {
      for (const key of selected(OUTBOX_ENDPOINTS)) {
        for (const mode of round % 2 ? (['off', 'on', 'on', 'off'] as const) : (['on', 'off', 'off', 'on'] as const)) {
          await setOutbox(main.db.url, mode === 'on')
          await measureCell({
            subject: main,
            endpoint: byKey(main, key),
            round: 0,
            seconds: settings.duration,
            connections: settings.connections,
            kinds: ['service'],
            series,
            key: outboxKey(key, mode),
            label: `outbox ${mode} ${round + 1}/${settings.rounds}`,
          })
        }
      }
    }
  } finally {
    await setOutbox(main.db.url, true)
  }
  return series
}

/** Id lookups and pages at several table sizes, the sizes interleaved within each round. */
async function growthSeries(serverUrl: string, main: Subject): Promise<GrowthSize[]> {
  const keys = selected(GROWTH_ENDPOINTS)
  if (!keys.length) return []
  const subjects: Subject[] = []
  for (const n of growthSizes()) subjects.push(n === main.db.rows ? main : await prepare(serverUrl, n))
  const sizes = subjects.map((s): GrowthSize => ({
    rows: s.db.rows,
    series: {},
    notes: { 'users-deep': `(N = ${Math.floor(s.db.rows * 0.9).toLocaleString('en')})` },
  }))
  for (let round = 0; round < settings.growthRounds; round++) {
    for (const key of keys) {
      for (const [i, subject] of subjects.entries()) {
        await measureCell({
          subject,
          endpoint: byKey(subject, key),
          round,
          seconds: settings.growthDuration,
          connections: settings.connections,
          kinds: GROWTH_KINDS,
          series: sizes[i]!.series,
          key,
          label: `growth ${subject.db.rows.toLocaleString('en')} ${round + 1}/${settings.growthRounds}`,
        })
      }
    }
  }
  return sizes
}

interface Results {
  main: Subject
  series: Series
  concurrency: Series
  /** What the WORKERS check found (undefined: the concurrency series did not run). */
  workers: { ok: boolean; note: string } | undefined
  outbox: Series
  ceiling: CeilingResults | undefined
  sizes: GrowthSize[]
  minutes: string
  pgVersion: string
  wrkVersion: string
}

function settingsText(r: Results): string {
  return (
    `Machine: ${machine(r.pgVersion)}. Load generator ` +
    `wrk ${r.wrkVersion} (same machine, ${settings.threads} thread(s), --timeout ${settings.timeout}s), ` +
    `${settings.connections} connections; a pool ` +
    `of ${settings.pool} in every server; ${settings.rows.toLocaleString('en')} users and products; ` +
    `${settings.rounds} rounds ` +
    `of ${settings.duration} s per endpoint and server, each on fresh processes ` +
    `after ${settings.warmup} s of warm-up, the servers' order rotating by round. ` +
    `Service: \`${['node', ...settings.serviceNodeArgs, 'dist/main.js'].join(' ')}\` (as \`npm start\`), ` +
    `NODE_ENV=production, LOG_LEVEL=${settings.logLevel} (log to a file), RATE_LIMIT=0. ` +
    `Peers: \`node bench/fastify/server.js\` (equal work), \`node bench/fastify-minimal/server.js\` (minimal, no ` +
    `log), \`node bench/bare/server.js\`, logs to files too. ${versions()}. ` +
    `Figures: median (min–max) over the rounds. req/s and CPU µs/req count successful responses (status below 400). ` +
    `CPU µs/req: utime + stime of the server process over the run ÷ those responses; DB CPU: the same for the ` +
    `PostgreSQL backends of its pool. ` +
    `Errors: responses above 399, socket errors and time-outs. Run time ${r.minutes} min.`
  )
}

/** The report (Markdown) and the targets, PASS or FAIL. */
function report(r: Results): { text: string; targets: string[] } {
  const rowsOf = (keys: string[]) => keys.map((k) => ({ key: k, label: byKey(r.main, k).label }))
  const main = rowsOf(selected(MAIN_ENDPOINTS))
  const conc = rowsOf(selected(CONCURRENCY_ENDPOINTS))
  const growth = rowsOf(selected(GROWTH_ENDPOINTS))
  const out: string[] = []
  out.push(`## Benchmark, ${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC`, '', settingsText(r), '')
  if (settings.main === 'on') {
    out.push(mainTable(main, r.series), '')
    out.push(
      "The service ÷ each peer, in the same round (median, min–max); server + PostgreSQL: the server's CPU and its " +
        "backends':",
      '',
      ratioTable(main, r.series),
      '',
    )
    out.push(
      `Against ${LABEL.minimal}, the targets of issue 25 (medians of the per-round ratios; PASS or FAIL on the ` +
        `endpoints the issue names, the others for information):`,
      '',
      minimalTable(main, r.series),
      '',
    )
    out.push(peakRssLine(main, r.series), '')
    const batchKey = `batch-${BATCH_OPERATIONS}`
    if (r.series[batchKey] || r.series['post-product'])
      out.push(
        `### Batches: ${BATCH_OPERATIONS} product creations in one POST /batch against as many single ` +
          `POST /products`,
        '',
        `Sets of ${BATCH_OPERATIONS} creations per second: the batch's requests/s, or the single requests' ÷ ` +
          `${BATCH_OPERATIONS}; costs per creation: the batch's ÷ ${BATCH_OPERATIONS}; latencies: of one request ` +
          `as sent (in a closed loop of ${settings.connections} connections, connections ÷ throughput). The ` +
          `service writes an event per creation, the peers none.`,
        '',
        batchTable(batchKey, 'post-product', BATCH_OPERATIONS, r.series),
        '',
      )
  }
  let workerVerdicts: ReturnType<typeof workersTable>['verdicts'] = []
  if (conc.length && settings.concurrency.length) {
    const runs = settings.concurrency
      .map((c) => `${concurrencyRoundsAt(c, r.workers?.ok)} at ${c.toLocaleString('en')}`)
      .join(', ')
    out.push(
      `### Concurrency (run(s) ` +
        `of ${settings.concurrencyDuration} s: ${runs} connections; wrk --timeout ${settings.timeout}s)`,
      '',
    )
    if (r.workers)
      out.push(
        `${LABEL.workers}: ${r.workers.note}.` +
          (r.workers.ok ? ' Its CPU and peak RSS are summed over its process tree (primary and workers).' : ''),
        '',
      )
    out.push(concurrencyTable(conc, settings.concurrency, r.concurrency), '')
    if (r.workers?.ok) {
      const w = workersTable(conc, settings.concurrency, r.concurrency, cpus().length, ceilingBest(r.ceiling))
      workerVerdicts = w.verdicts
      out.push(
        `#### ${LABEL.workers} against one process`,
        '',
        `Cores: CPU µs/req × req/s ÷ 10⁶ (the server's process tree; its PostgreSQL backends). The database is ` +
          `counted as not the limit when the database ceiling ` +
          `below (pgbench running the same statements on this machine) is at ` +
          `least ${CEILING_MARGIN} × the workers' req/s, or, without the ceiling series, when ` +
          `the backends used under ${(DB_SHARE_LIMIT * 100).toFixed(0)} % of the ` +
          `machine's ${cpus().length} cores. Machine busy: every core, wrk and everything else ` +
          `included; near 100 % with one process, a second worker has no idle core to run on.`,
        '',
        w.text,
        '',
      )
    }
  }
  const outbox = rowsOf(selected(OUTBOX_ENDPOINTS))
  if (outbox.length && settings.outbox === 'on') {
    out.push(
      `### What the events outbox costs a write (the service alone, events written and discarded, ` +
        `on-off-off-on; ${settings.rounds} rounds of ${settings.duration} s)`,
      '',
    )
    out.push(outboxTable(outbox, r.outbox), '')
  }
  if (r.ceiling) out.push(ceilingSection(r.ceiling, r.series))
  if (r.sizes.length) {
    out.push(
      `### Growth (${settings.growthRounds} round(s) of ${settings.growthDuration} s; medians)`,
      '',
      growthTable(growth, r.sizes, GROWTH_KINDS),
      '',
    )
  }
  const logs = [...new Set([r.main.db.rows, ...r.sizes.map((z) => z.rows)])].reduce(
    (k, n) => k + errorLines(logFileOf(outDir, 'service', n)) + errorLines(logFileOf(outDir, 'workers', n)),
    0,
  )
  const hwm = ALL_KINDS.filter((k) => peakHwmMb[k] > 0).map((k) => `${LABEL[k]} ${peakHwmMb[k].toFixed(0)} MB`)
  out.push(
    `Peak RSS over every run (VmHWM, summed over a server's ` +
      `processes): ${hwm.join(', ')}; error lines in the service's log: ${logs}.`,
    '',
  )
  const targets: string[] = []
  mainTargets(main, r.series, targets)
  concurrencyTargets(conc, settings.concurrency, r.concurrency, targets, {
    runs: settings.workersRuns,
    connections: settings.workersConnections,
  })
  if (r.workers && !r.workers.ok) targets.push(`- n/a  ${LABEL.workers}: ${r.workers.note}`)
  workersTargets(workerVerdicts, Object.fromEntries(conc.map((c) => [c.key, c.label])), ['user'], targets)
  growthTargets(growth, r.sizes, targets)
  if (settings.outbox === 'on') outboxTargets(outbox, r.outbox, targets)
  out.push('### Targets (medians of this run)', '', ...targets, '')
  return { text: out.join('\n'), targets }
}

/** The database ceiling (bench/ceiling.ts): pgbench on the service's statements, beside the main series' figures. */
function ceilingSection(c: CeilingResults, series: Series): string {
  return [
    `### The database ceiling ` +
      `(pgbench ${c.pgbench}, ` +
      `-M ${c.mode}, -j ${c.threads}, ${c.rounds} round(s) of ${c.duration} s per client count, same machine)`,
    '',
    'The statements the service sent for each request, captured from its connection, run by pgbench on the same ' +
      'database. ' +
      "DB CPU: the backends serving pgbench (writes: and the event publisher's, publishing as it runs); cluster: " +
      'every PostgreSQL process; ' +
      "pgbench's own CPU is not the database's. The main series' figures are at " +
      `${settings.connections} connections, a pool of ${settings.pool}.`,
    '',
    ceilingTable(c),
    '',
    ceilingAgainstService(c, series, cpus().length),
    '',
  ].join('\n')
}

async function benchmark(serverUrl: string, pgVersion: string, wrkVersion: string): Promise<void> {
  const started = Date.now()
  log(`expected run time: about ${Math.round(expectedSeconds() / 60)} min`)
  const main = await prepare(serverUrl, settings.rows)
  const series = await mainSeries(main)
  const concurrencyOn = settings.concurrency.length > 0 && selected(CONCURRENCY_ENDPOINTS).length > 0
  const workers = concurrencyOn && settings.workers ? await workersSupported(main) : undefined
  if (workers) log(workers.note)
  const concurrency = await concurrencySeries(main, workers?.ok ?? false)
  const outbox = await outboxSeries(main)
  const ceiling = await ceilingSeries({
    admin,
    db: main.db,
    server: serverOptions(main.db),
    authorization: bearer.Authorization,
    only: settings.only,
    log,
  })
  const sizes = await growthSeries(serverUrl, main)
  const results: Results = {
    main,
    series,
    concurrency,
    workers,
    outbox,
    ceiling,
    sizes,
    minutes: ((Date.now() - started) / 60_000).toFixed(1),
    pgVersion,
    wrkVersion,
  }
  const { text, targets } = report(results)
  process.stdout.write('\n' + text + '\n')
  const stamp = new Date().toISOString().replace(/[:.]/g, '-').slice(0, 19)
  writeFileSync(join(outDir, `bench-${stamp}.md`), text + '\n')
  writeFileSync(
    join(outDir, `bench-${stamp}.json`),
    JSON.stringify(
      {
        settings,
        ceilingSettings,
        machine: machine(pgVersion),
        wrk: wrkVersion,
        series,
        concurrency,
        workers,
        outbox,
        ceiling,
        growth: sizes,
        peakHwmMb,
      },
      null,
      1,
    ),
  )
  log(
    `report written to bench/.out/bench-${stamp}.md (raw figures: ` +
      `.json); ${targets.filter((t) => t.startsWith('- FAIL')).length} of ${targets.length} targets failed`,
  )
}

/**
 * --profile: each endpoint against a fresh process of each server run with
 * --cpu-prof; the load window of each profile summarized per request, and
 * the service compared with each peer. The .cpuprofile files stay in
 * bench/.out/profiles (ignored by git).
 */
async function profile(serverUrl: string, keys: string[]): Promise<void> {
  const db = await seed(serverUrl, settings.rows)
  for (const kind of KINDS) writeFileSync(logFileOf(outDir, kind, db.rows), '')
  const profiles = join(outDir, 'profiles')
  mkdirSync(profiles, { recursive: true })
  const list = endpoints(db).filter((e) => (keys.length ? keys : MAIN_ENDPOINTS).includes(e.key))
  const duration = intSetting('BENCH_PROFILE_DURATION', 10)
  for (const e of list) {
    const summaries: Partial<Record<Kind, [Summary, number]>> = {}
    for (const kind of serving(e, KINDS)) {
      const name = `${kind}-${e.key}.cpuprofile`
      rmSync(join(profiles, name), { force: true })
      const server = await startServer(kind, serverOptions(db), [
        '--cpu-prof',
        `--cpu-prof-dir=${profiles}`,
        `--cpu-prof-name=${name}`,
      ])
      await measure(server, db, e, 2, settings.connections, 1)
      const from = Number(process.hrtime.bigint() / 1000n)
      const m = await measure(server, db, e, duration, settings.connections, 2)
      const to = Number(process.hrtime.bigint() / 1000n)
      await stopServer(server)
      const summary = summarize(join(profiles, name), [from, to])
      process.stdout.write(
        `\n=== ${LABEL[kind]}: ${e.label}: ${m.rps.toFixed(0)} ` +
          `req/s, ${m.cpuPerRequest.toFixed(0)} µs CPU/req (process, all threads), p99 ${m.p99.toFixed(2)} ms\n`,
      )
      process.stdout.write(formatSummary(summary, m.requests, Number(env.BENCH_PROFILE_TOP ?? 30)) + '\n')
      summaries[kind] = [summary, m.requests]
    }
    const [s, sn] = summaries.service!
    for (const peer of PEERS.filter((k) => summaries[k])) {
      const [p, pn] = summaries[peer]!
      process.stdout.write(
        `\n--- ${e.label}: service ` +
          `against ${LABEL[peer]}\n${formatComparison(s, sn, p, pn, ['service', LABEL[peer]])}\n`,
      )
    }
  }
  log(`profiles in bench/.out/profiles/ (summarize again: node --import tsx bench/profile.ts <file> --requests N)`)
}

async function main(): Promise<void> {
  const args = process.argv.slice(2)
  const known = args[0] === '--profile' ? ALL_ENDPOINTS : [...new Set([...ALL_ENDPOINTS, ...CEILING_KEYS])]
  const unknown = [...(settings.only ?? []), ...(args[0] === '--profile' ? args.slice(1) : [])].filter(
    (k) => !known.includes(k),
  )
  if (unknown.length) throw new Error(`unknown endpoint ${unknown.join(', ')}; the endpoints are ${known.join(', ')}`)
  const wrkVersion = assertWrk()
  if (args[0] !== '--profile') assertCeilingTools()
  checkOpenFiles()
  mkdirSync(outDir, { recursive: true })
  const serverUrl = env.DATABASE_URL ?? startLocalCluster()
  admin = connect(serverUrl, { max: 1, statementTimeoutMs: 30 * 60_000 })
  const [{ version }] = (await admin<Array<{ version: string }>>`SELECT version()`) as unknown as [{ version: string }]
  const pgVersion = version.replace(/ on .*/, '').replace(/ \(.*$/, '')
  if (settings.rounds < 3 && args[0] !== '--profile')
    log(`BENCH_ROUNDS=${settings.rounds}: fewer than 3 rounds, min and max mean little`)
  try {
    if (args[0] === '--profile') await profile(serverUrl, args.slice(1))
    else await benchmark(serverUrl, pgVersion, wrkVersion)
  } finally {
    if (!interrupted) await cleanup()
  }
}

main().catch(async (err: unknown) => {
  console.error(err instanceof Error ? err.message : err)
  if (!interrupted) await cleanup().catch(() => {})
  process.exit(1)
})
