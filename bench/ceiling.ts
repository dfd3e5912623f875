import { execFileSync, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { cpus } from 'node:os'
import { join } from 'node:path'
import type { Sql } from 'postgres'
import { connect } from '../src/core/db/connect.js'
import { EventPublisher } from '../src/events/publisher.js'
import { wakeWorkers } from '../src/webhooks/wake.js'
import { createLogger } from '../src/core/log.js'
import { Scheduler } from '../src/core/scheduler.js'
import { cpuBetween, cpuMicros, cpuOf, machineCpu } from './proc.js'
import { backendPids, removeCreatedUsers, type Seeded } from './seed.js'
import { APP_NAMES, startServer, stopServer, type ServerOptions } from './servers.js'
import { countsSetting, fail, intSetting, oneOf } from './settings.js'

// The database's ceiling: pgbench sending the very statements the service
// sends for a request, as fast as PostgreSQL answers them, on the benchmark
// database of `make bench`. Set beside the service's own throughput for the
// same request, it shows how far one instance is from what the database can
// do (docs/scaling.md). See bench/README.md, "The database ceiling".
//
// The statements are not copied here: a service started on the benchmark
// database answers one request of each kind, and the text its pool's only
// connection ran is read from pg_stat_activity (the service's own metrics
// confirm that the request sent one statement). Its $n parameters become
// pgbench variables; nothing else of the text changes, and pgbench prepares
// it (-M prepared), as the service does (BENCH_CEILING_MODE=extended: as it
// does through a transaction pooler, unnamed).

const env = process.env

// ---- settings ----------------------------------------------------------------

export const ceilingSettings = {
  on: oneOf('BENCH_CEILING', ['on', 'off'], 'on') === 'on',
  /**
   * pgbench's -M: `prepared`, named prepared statements as the service sends
   * them to PostgreSQL directly; `extended`, unnamed ones, parsed and planned
   * for every statement, as it sends them through a transaction pooler
   * (src/core/db/connect.ts, `pooled`).
   */
  mode: oneOf('BENCH_CEILING_MODE', ['prepared', 'extended'], 'prepared'),
  /** pgbench's client counts (-c), each its own run. */
  clients: countsSetting('BENCH_CEILING_CLIENTS', [8, 16, 32]),
  /** Seconds per run (-T) and rounds over every request and client count. */
  duration: intSetting('BENCH_CEILING_DURATION', 5),
  rounds: intSetting('BENCH_CEILING_ROUNDS', 3),
  /** pgbench's threads (-j, at most the clients): two, one per core of the development machine. */
  threads: intSetting('BENCH_CEILING_THREADS', 2),
}

/** pgbench's connections are found by this application_name (libpq's PGAPPNAME). */
const PGBENCH_APP = 'upa-bench-ceiling'

// ---- the requests --------------------------------------------------------------

/** A page is 50 rows; the service asks for one more, to know whether a next page exists. */
const PAGE = 50

interface CeilingEndpoint {
  key: string
  label: string
  /** The request that makes the service send its statement (the main series' request of the same key). */
  request(rows: number): { method: 'GET' | 'POST'; path: string; body?: Record<string, unknown>; expect: number }
  /** pgbench meta-commands run before the statement (variables drawn per transaction). */
  prelude: string[]
  /** The pgbench variable of each $n of the captured text, $1 first. */
  parameters(text: string): string[]
  /** Rows it adds to this table, deleted again after each run; its events are published while it runs. */
  writes?: 'users' | 'products'
}

/**
 * Values of an insert's columns; the three after them are the event's origin (src/events/origin.ts originValues: actor,
 * credential, request).
 */
const INSERT_VARIABLES: Record<'users' | 'products', Record<string, string>> = {
  users: { name: 'user_name', email: 'email', role: 'role' },
  products: {
    sku: 'sku',
    name: 'product_name',
    description: 'description',
    price: 'price',
    currency: 'currency',
    stock: 'stock',
  },
}
const ORIGIN_VARIABLES = ['actor', 'credential', 'request_id']

/**
 * The parameters of a captured `INSERT INTO "<table>" (columns) VALUES ($1, …)`:
 * a variable per column, by name, then the event's origin.
 */
function insertParameters(table: 'users' | 'products', text: string): string[] {
  const m = new RegExp(`INSERT INTO "${table}" \\(([^)]*)\\) VALUES \\(([^)]*)\\)`).exec(text)
  if (!m) throw new Error(`the service's insert into ${table} has an unexpected form:\n${text}`)
  const columns = m[1]!.split(',').map((c) => c.trim().replace(/^"(.*)"$/, '$1'))
  const values = m[2]!.split(',').map((v) => v.trim())
  if (values.some((v, i) => v !== `$${i + 1}`))
    throw new Error(`the service's insert into ${table} does not take its values as $1…$${columns.length}:\n${text}`)
  return [
    ...columns.map((c) => {
      const variable = INSERT_VARIABLES[table][c]
      if (!variable)
        throw new Error(
          `the service's insert ` +
            `into ${table} sets "${c}", which the ceiling has no value for (bench/ceiling.ts INSERT_VARIABLES)`,
        )
      return variable
    }),
    ...ORIGIN_VARIABLES,
  ]
}

/**
 * A number no other transaction of the run uses: a per-client counter (each
 * pgbench client keeps its own variables) under the client's id. Unique
 * columns (SKU, e-mail) get it as their text: 13 digits, about the length of
 * the seeded `SKU-00000001`; the CHECKs accept it (the API's own checks,
 * which would want an @ in an e-mail, are not the database's).
 */
const UNIQUE = ['\\set k :k + 1', '\\set unique 1000000000000 + :client_id * 1000000000 + :k']

export const CEILING_ENDPOINTS: readonly CeilingEndpoint[] = [
  {
    key: 'user',
    label: 'GET /users/{id}',
    request: (rows) => ({ method: 'GET', path: `/users/${Math.ceil(rows / 3)}`, expect: 200 }),
    prelude: ['\\set id random(1, :rows)'],
    parameters: () => ['id'],
  },
  {
    key: 'products-first',
    label: 'GET /products?limit=50',
    request: () => ({ method: 'GET', path: `/products?limit=${PAGE}`, expect: 200 }),
    prelude: [],
    parameters: () => ['page'],
  },
  {
    key: 'products-keyset',
    label: 'GET /products?limit=50&id[gt]=N',
    request: (rows) => ({ method: 'GET', path: `/products?limit=${PAGE}&id[gt]=${Math.floor(rows / 2)}`, expect: 200 }),
    // N as bench/wrk.lua draws it.
    prelude: [`\\set after random(0, :rows - ${PAGE})`],
    parameters: () => ['after', 'page'],
  },
  {
    key: 'post-user',
    label: 'POST /users',
    writes: 'users',
    request: () => ({
      method: 'POST',
      path: '/users',
      body: { name: 'Bench New User', email: `ceiling-${randomUUID()}@bench.example.com` },
      expect: 201,
    }),
    prelude: [...UNIQUE, '\\set email :unique'],
    parameters: (text) => insertParameters('users', text),
  },
  {
    key: 'post-product',
    label: 'POST /products',
    writes: 'products',
    request: () => ({
      method: 'POST',
      path: '/products',
      expect: 201,
      body: {
        sku: `CEILING-${Date.now()}`,
        name: 'Bench New Product',
        description: 'A product of the ceiling run.',
        price: 1999,
        currency: 'EUR',
        stock: 5,
      },
    }),
    prelude: [...UNIQUE, '\\set sku :unique', '\\set price random(0, 999999)', '\\set stock random(0, 999)'],
    parameters: (text) => insertParameters('products', text),
  },
]

export const CEILING_KEYS = CEILING_ENDPOINTS.map((e) => e.key)

/** The values every client starts with (-D): constants of the requests, the per-client counter, the table size. */
function constants(rows: number): Record<string, string> {
  return {
    rows: String(rows),
    page: String(PAGE + 1),
    k: '0',
    user_name: 'Bench New User',
    role: 'user',
    product_name: 'Bench New Product',
    description: 'A product of the ceiling run.',
    currency: 'EUR',
    // The origin of a write by admin 1 with a JWT, as the benchmark's token is; a request id as the service makes them.
    actor: '1',
    credential: 'jwt',
    request_id: randomUUID(),
  }
}

// ---- capturing the statements ----------------------------------------------------

export interface CeilingContext {
  /** A connection to the server's maintenance database (pg_stat_activity). */
  admin: Sql
  db: Seeded
  /** How bench/servers.ts starts the service on that database. */
  server: ServerOptions
  /** The benchmark's admin credential (Authorization header). */
  authorization: string
  /** BENCH_ONLY. */
  only: string[] | undefined
  log: (msg: string) => void
}

interface Captured {
  /** The statement as the service sent it. */
  text: string
  /** The pgbench script made of it. */
  script: string
}

async function statementsSent(origin: string, authorization: string): Promise<number> {
  const res = await fetch(`${origin}/metrics`, { headers: { Authorization: authorization } })
  const text = await res.text()
  const m = /^db_queries_total (\d+)$/m.exec(text)
  if (!res.ok || !m) throw new Error(`GET /metrics answered ${res.status} without db_queries_total`)
  return Number(m[1])
}

/**
 * Starts the service with a pool of one connection, finds that connection's
 * backend (the one whose last statement is the readiness probe's SELECT 1),
 * and sends each request: the statement the backend then shows in
 * pg_stat_activity is what the request sent, provided the service counted
 * exactly one statement for it (a periodic task on the pool, event
 * retention, would make two: the request is sent again).
 */
async function capture(ctx: CeilingContext, list: readonly CeilingEndpoint[]): Promise<Map<string, Captured>> {
  const { admin, db } = ctx
  const [{ size }] = (await admin<
    [{ size: string }]
  >`SELECT current_setting('track_activity_query_size') AS size`) as unknown as [{ size: string }]
  const limit = parseSize(size)
  const server = await startServer('service', { ...ctx.server, pool: 1 })
  const out = new Map<string, Captured>()
  try {
    await fetch(`${server.origin}/readyz`).then((r) => r.arrayBuffer())
    const probes = await admin<Array<{ pid: number }>>`
      SELECT pid FROM pg_stat_activity WHERE datname = ${db.name} AND application_name = ${APP_NAMES.service}
      AND query = 'SELECT 1'`
    if (probes.length !== 1)
      throw new Error(`expected one connection of the service's pool to have run SELECT 1, found ${probes.length}`)
    const pid = probes[0]!.pid
    const last = async () => {
      const [row] = await admin<
        Array<{ query: string; started: string }>
      >`SELECT query, query_start::text AS started FROM pg_stat_activity WHERE pid = ${pid}`
      if (!row) throw new Error("the service's pool connection went away during the capture")
      return row
    }
    for (const e of list) {
      const req = e.request(db.rows)
      for (let attempt = 1; ; attempt++) {
        const before = await statementsSent(server.origin, ctx.authorization)
        const startedBefore = (await last()).started
        const res = await fetch(server.origin + req.path, {
          method: req.method,
          headers: { Authorization: ctx.authorization, ...(req.body ? { 'Content-Type': 'application/json' } : {}) },
          ...(req.body ? { body: JSON.stringify(req.body) } : {}),
        })
        const answer = await res.text()
        if (res.status !== req.expect)
          throw new Error(`${e.label}: the service answered ${res.status}, not ${req.expect}: ${answer.slice(0, 300)}`)
        const sent = (await statementsSent(server.origin, ctx.authorization)) - before
        const { query, started } = await last()
        if (sent === 1 && started !== startedBefore) {
          if (Buffer.byteLength(query) >= limit - 1)
            throw new Error(
              `${e.label}: the statement is longer than track_activity_query_size ` +
                `(${size}), so pg_stat_activity shows it cut; raise it on the server`,
            )
          out.set(e.key, { text: query, script: scriptOf(e, query) })
          break
        }
        if (attempt === 3)
          throw new Error(
            `${e.label}: the service ` +
              `sent ${sent} statements for one request (3 tries); the ceiling compares requests of one statement`,
          )
      }
    }
  } finally {
    await stopServer(server)
  }
  return out
}

const parseSize = (setting: string) => {
  const m = /^(\d+)\s*(B|kB|MB)?$/.exec(setting)
  if (!m) throw new Error(`track_activity_query_size: unexpected value ${setting}`)
  return Number(m[1]) * ({ B: 1, kB: 1024, MB: 1024 * 1024 }[m[2] ?? 'B'] ?? 1)
}

/** The pgbench script: the prelude, then the captured text with each $n replaced by its variable. */
function scriptOf(e: CeilingEndpoint, text: string): string {
  const names = e.parameters(text)
  const used = new Set([...text.matchAll(/\$(\d+)/g)].map((m) => Number(m[1])))
  if (used.size !== names.length || [...used].some((n) => n < 1 || n > names.length)) {
    throw new Error(
      `${e.label}: the statement takes parameters ${[...used]
        .sort((a, b) => a - b)
        .map((n) => `$${n}`)
        .join(', ')}; the ceiling has ${names.length} variables for it:\n${text}`,
    )
  }
  // pgbench would read any other `:name` as a variable; `::type` casts it skips.
  if (/(^|[^:]):[A-Za-z_]/.test(text))
    throw new Error(`${e.label}: the statement has a ':name' that pgbench would take for a variable:\n${text}`)
  const statement = text.replace(/\$(\d+)/g, (_, n: string) => `:${names[Number(n) - 1]}`)
  return [
    `-- ${e.label}: the statement the service sent for it (captured from pg_stat_activity), $n as pgbench variables`,
    ...e.prelude,
    `${statement};`,
    '',
  ].join('\n')
}

// ---- measuring -----------------------------------------------------------------

export interface CeilingMeasurement {
  clients: number
  /** Transactions (one statement each) per second, as pgbench reports it (without connection time). */
  tps: number
  transactions: number
  failed: number
  latencyMs: number
  /** CPU µs of the PostgreSQL backends serving pgbench (and, for writes, of the event publisher's) ÷ transactions. */
  dbCpuPerTx: number | undefined
  /** For writes: the event publisher's backend alone. */
  publisherCpuPerTx: number | undefined
  /**
   * The whole cluster (every backend, WAL writer, checkpointer,
   * autovacuum, and whatever else ran on it) ÷ transactions.
   */
  clusterCpuPerTx: number | undefined
  /** WAL the cluster wrote over the run ÷ transactions: what a replica must receive and replay per write. */
  walBytesPerTx: number
  /** pgbench's own CPU µs ÷ transactions. */
  pgbenchCpuPerTx: number
  /** pgbench's share of the machine's cores over the run. */
  pgbenchShare: number
  /** Busy share of the machine's cores over the run, every process counted. */
  machineBusy: number
}

/** Per request key, the runs of each round in client order. */
export interface CeilingResults {
  series: Record<string, CeilingMeasurement[]>
  /** Per request key, its label. */
  labels: Record<string, string>
  /** The scripts as run (also in bench/.out/ceiling/). */
  scripts: Record<string, string>
  pgbench: string
  mode: 'prepared' | 'extended'
  clients: number[]
  duration: number
  rounds: number
  threads: number
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** The CPU µs this process's children have used, the ones it has waited for (pgbench, once it has exited). */
function childrenCpu(): number {
  const stat = readFileSync('/proc/self/stat', 'utf8')
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  // cutime and cstime are fields 16 and 17; fields[0] is field 3.
  return (Number(fields[13]) + Number(fields[14])) * (1e6 / ticks())
}

const ticks = (() => {
  let value: number | undefined
  return () => (value ??= Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100)
})()

/**
 * The whole cluster's CPU µs so far: the postmaster's own and its reaped
 * children's (cutime, cstime), plus its live children's. A backend that
 * exits moves from the second part to the first.
 */
function clusterCpu(postmaster: number): number | undefined {
  let stat: string
  try {
    stat = readFileSync(`/proc/${postmaster}/stat`, 'utf8')
  } catch {
    return undefined
  }
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  let total = (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) * (1e6 / ticks())
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    try {
      const s = readFileSync(`/proc/${entry}/stat`, 'utf8')
      const g = s.slice(s.lastIndexOf(')') + 2).split(' ')
      if (Number(g[1]) === postmaster) total += (Number(g[11]) + Number(g[12])) * (1e6 / ticks())
    } catch {
      // exited meanwhile
    }
  }
  return total
}

async function walPosition(admin: Sql): Promise<string> {
  const [{ lsn }] = (await admin<[{ lsn: string }]>`SELECT pg_current_wal_lsn()::text AS lsn`) as unknown as [
    { lsn: string },
  ]
  return lsn
}

/** The postmaster's pid: the parent of our own backend, when PostgreSQL runs on this machine. */
async function postmasterPid(admin: Sql): Promise<number | undefined> {
  const [{ pid }] = (await admin<[{ pid: number }]>`SELECT pg_backend_pid() AS pid`) as unknown as [{ pid: number }]
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
  } catch {
    return undefined
  }
}

/** pgbench of the server's major version when there is one (PG_BIN, Debian's layout), else the first on PATH. */
export function findPgbench(serverMajor?: number): string | undefined {
  const dirs: string[] = []
  if (env.PG_BIN) dirs.push(env.PG_BIN)
  const base = '/usr/lib/postgresql'
  if (existsSync(base)) {
    const versions = readdirSync(base)
      .filter((d) => /^\d+$/.test(d))
      .map(Number)
      .sort((a, b) => b - a)
    if (serverMajor !== undefined && versions.includes(serverMajor)) dirs.push(join(base, String(serverMajor), 'bin'))
    dirs.push(...versions.map((v) => join(base, String(v), 'bin')))
  }
  dirs.push(...(env.PATH ?? '').split(':').filter(Boolean))
  return dirs.map((d) => join(d, 'pgbench')).find((p) => existsSync(p))
}

/**
 * libpq's environment for the benchmark database's URL (a `host` parameter
 * naming a folder is a Unix socket, as in src/core/db/connect.ts).
 */
function libpqEnv(databaseUrl: string): NodeJS.ProcessEnv {
  const url = new URL(databaseUrl)
  const socket = url.searchParams.get('host')
  return {
    PATH: env.PATH ?? '/usr/bin:/bin',
    PGHOST: socket ?? url.hostname,
    PGPORT: url.port || '5432',
    PGUSER: decodeURIComponent(url.username) || 'postgres',
    ...(url.password ? { PGPASSWORD: decodeURIComponent(url.password) } : {}),
    PGDATABASE: decodeURIComponent(url.pathname.slice(1)),
    ...(url.searchParams.get('sslmode') ? { PGSSLMODE: url.searchParams.get('sslmode')! } : {}),
    PGAPPNAME: PGBENCH_APP,
    // The session settings of the service's connections (src/core/db/connect.ts)
    // that shape what the server does per row.
    PGOPTIONS: '-c TimeZone=UTC -c DateStyle=ISO,MDY',
  }
}

interface PgbenchOutput {
  transactions: number
  failed: number
  latencyMs: number
  tps: number
}

function parsePgbench(stdout: string): PgbenchOutput {
  const num = (re: RegExp) => {
    const m = re.exec(stdout)
    if (!m) throw new Error(`pgbench's report lacks ${re.source}:\n${stdout}`)
    return Number(m[1])
  }
  return {
    transactions: num(/number of transactions actually processed: (\d+)/),
    failed: /number of failed transactions: (\d+)/.test(stdout) ? num(/number of failed transactions: (\d+)/) : 0,
    latencyMs: num(/latency average = ([\d.]+) ms/),
    tps: num(/tps = ([\d.]+) \(without initial connection time\)/),
  }
}

/**
 * The event publisher every instance runs (src/events/publisher.ts), on a
 * connection of its own, publishing what pgbench's inserts put in the outbox
 * while they run: a write's cost includes it. Its backend is found by the
 * service's application_name (no service runs on the database meanwhile).
 */
async function startPublisher(
  admin: Sql,
  db: Seeded,
  log: (msg: string) => void,
): Promise<{ pid: number | undefined; stop(): Promise<void> }> {
  const pool = connect(db.url, { max: 1, statementTimeoutMs: 60_000 })
  const scheduler = new Scheduler(createLogger('warn', (line) => log(`publisher: ${line.trim()}`)))
  const publisher = new EventPublisher(pool, wakeWorkers)
  for (const job of publisher.jobs) scheduler.add(job)
  await publisher.drain()
  const pids = await backendPids(admin, db, APP_NAMES.service)
  scheduler.start()
  return {
    pid: pids.length === 1 ? pids[0] : undefined,
    async stop() {
      await publisher.drain()
      await scheduler.stop(performance.now() + 5000)
      await publisher.stop(performance.now() + 5000)
      await pool.end({ timeout: 5 })
    },
  }
}

/** Back to the seeded tables after a write run (the events of its rows too). */
async function resetWrites(db: Seeded, table: 'users' | 'products'): Promise<void> {
  if (table === 'users') {
    await removeCreatedUsers(db.url, db.rows)
    return
  }
  const conn = connect(db.url, { max: 1, statementTimeoutMs: 10 * 60_000 })
  try {
    const deleted = await conn`DELETE FROM products WHERE id > ${db.rows}`
    await conn`TRUNCATE event_outbox, events, webhook_deliveries, webhook_attempts`
    if (deleted.count) await conn`VACUUM ANALYZE products`
  } finally {
    await conn.end({ timeout: 5 })
  }
}

async function countEvents(db: Seeded): Promise<{ published: number; waiting: number }> {
  const conn = connect(db.url, { max: 1, statementTimeoutMs: 60_000 })
  try {
    const [row] = await conn<[{ published: number; waiting: number }]>`
      SELECT (SELECT count(*)::int FROM events) AS published, (SELECT count(*)::int FROM event_outbox) AS waiting`
    return row
  } finally {
    await conn.end({ timeout: 5 })
  }
}

interface RunOptions {
  admin: Sql
  db: Seeded
  pgbench: string
  script: string
  clients: number
  seed: number
  postmaster: number | undefined
  publisher: number | undefined
}

/** One pgbench run, with the CPU of its backends, of the cluster, of pgbench and of the machine over it. */
async function runPgbench(o: RunOptions): Promise<CeilingMeasurement> {
  const { admin, db, clients } = o
  const args = [
    '-n',
    '-M',
    ceilingSettings.mode,
    '-c',
    String(clients),
    '-j',
    String(Math.min(ceilingSettings.threads, clients)),
    '-T',
    String(ceilingSettings.duration),
    `--random-seed=${o.seed}`,
    '-f',
    o.script,
    ...Object.entries(constants(db.rows)).flatMap(([k, v]) => ['-D', `${k}=${v}`]),
  ]
  const wal0 = await walPosition(admin)
  const machine0 = machineCpu()
  const cluster0 = o.postmaster === undefined ? undefined : clusterCpu(o.postmaster)
  const children0 = childrenCpu()
  const publisher0 = o.publisher === undefined ? undefined : cpuMicros(o.publisher)
  const started = performance.now()
  const child = spawn(o.pgbench, args, { env: libpqEnv(db.url), stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  let stderr = ''
  child.stdout.setEncoding('utf8').on('data', (s: string) => (stdout += s))
  child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s))
  let exitCode: number | null | undefined
  const closed = new Promise<void>((resolve) =>
    child.once('close', (code) => {
      exitCode = code
      resolve()
    }),
  )

  // pgbench's backends: found once connected, their CPU read every 50 ms until they go (the last reading stands).
  const backends = new Map<number, number>()
  let pids: number[] = []
  while (exitCode === undefined) {
    if (pids.length < clients) {
      pids = await backendPids(admin, db, PGBENCH_APP)
    }
    for (const [pid, us] of cpuOf(pids)) backends.set(pid, us)
    await Promise.race([closed, sleep(50)])
  }
  await closed
  const seconds = (performance.now() - started) / 1000
  if (exitCode !== 0) throw new Error(`pgbench exited with ${exitCode}:\n${stderr}${stdout}`)
  const publisher1 = o.publisher === undefined ? undefined : cpuMicros(o.publisher)
  // The backends exit when pgbench closes its connections; the postmaster then counts them as its children's.
  for (let i = 0; i < 40; i++) {
    const [{ n }] = (await admin<
      [{ n: number }]
    >`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${PGBENCH_APP}`) as unknown as [
      { n: number },
    ]
    if (n === 0) break
    await sleep(50)
  }
  await sleep(50)
  const cluster1 = o.postmaster === undefined ? undefined : clusterCpu(o.postmaster)
  const machine1 = machineCpu()
  const wal = await admin<
    [{ bytes: number }]
  >`SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), ${wal0}::pg_lsn)::float8 AS bytes`
  const pgbenchCpu = childrenCpu() - children0

  const out = parsePgbench(stdout)
  const perTx = (us: number | undefined) => (us === undefined || !out.transactions ? undefined : us / out.transactions)
  const publisherCpu = publisher0 !== undefined && publisher1 !== undefined ? publisher1 - publisher0 : undefined
  const backendCpu = pids.length && backends.size ? cpuBetween(new Map(), backends) : undefined
  const cores = cpus().length
  return {
    clients,
    tps: out.tps,
    transactions: out.transactions,
    failed: out.failed,
    latencyMs: out.latencyMs,
    dbCpuPerTx: perTx(backendCpu === undefined ? undefined : backendCpu + (publisherCpu ?? 0)),
    publisherCpuPerTx: perTx(publisherCpu),
    clusterCpuPerTx: perTx(cluster0 !== undefined && cluster1 !== undefined ? cluster1 - cluster0 : undefined),
    walBytesPerTx: perTx(wal[0].bytes) ?? NaN,
    pgbenchCpuPerTx: perTx(pgbenchCpu) ?? NaN,
    pgbenchShare: pgbenchCpu / (seconds * 1e6 * cores),
    machineBusy: (machine1.busy - machine0.busy) / (machine1.total - machine0.total),
  }
}

/**
 * Seconds the series should take: each run, plus about 2 s around a write's (reset, publisher) and 3 s for the capture.
 */
export function ceilingSeconds(only: string[] | undefined): number {
  if (!ceilingSettings.on) return 0
  const list = CEILING_ENDPOINTS.filter((e) => !only || only.includes(e.key))
  const runs = ceilingSettings.rounds * ceilingSettings.clients.length
  return list.length
    ? 3 + list.reduce((t, e) => t + runs * (ceilingSettings.duration + 0.5 + (e.writes ? 2 : 0)), 0)
    : 0
}

/** Refuses to start a run whose ceiling series could not run. */
export function assertCeilingTools(): void {
  if (ceilingSettings.on && !findPgbench()) {
    fail(
      "pgbench was not found (the database ceiling series runs it): it comes with PostgreSQL's server programs " +
        '(Debian: postgresql-15, beside initdb); set PG_BIN to their folder, or BENCH_CEILING=off',
    )
  }
}

/**
 * The series: the statements captured, then, round after round, each request
 * at each client count. Writes run with the event publisher beside them and
 * are undone after each run; every event they wrote must have been published.
 */
export async function ceilingSeries(ctx: CeilingContext): Promise<CeilingResults | undefined> {
  const list = CEILING_ENDPOINTS.filter((e) => !ctx.only || ctx.only.includes(e.key))
  if (!ceilingSettings.on || !list.length) return undefined
  const { admin, db, log } = ctx
  const [{ version }] = (await admin<
    [{ version: number }]
  >`SELECT current_setting('server_version_num')::int AS version`) as unknown as [{ version: number }]
  const pgbench = findPgbench(Math.floor(version / 10_000))!
  const captured = await capture(ctx, list)
  for (const e of list) if (e.writes) await resetWrites(db, e.writes)
  const dir = join(ctx.server.outDir, 'ceiling')
  mkdirSync(dir, { recursive: true })
  const scripts: Record<string, string> = {}
  for (const e of list) {
    scripts[e.key] = captured.get(e.key)!.script
    writeFileSync(join(dir, `${e.key}.sql`), scripts[e.key]!)
  }
  log(`ceiling: statements captured from the service; pgbench scripts in bench/.out/ceiling/`)
  const postmaster = await postmasterPid(admin)
  const series: Record<string, CeilingMeasurement[]> = {}
  let seed = 0
  for (let round = 0; round < ceilingSettings.rounds; round++) {
    for (const e of list) {
      for (const clients of ceilingSettings.clients) {
        const publisher = e.writes ? await startPublisher(admin, db, log) : undefined
        let m: CeilingMeasurement
        try {
          m = await runPgbench({
            admin,
            db,
            pgbench,
            script: join(dir, `${e.key}.sql`),
            clients,
            seed: ++seed,
            postmaster,
            publisher: publisher?.pid,
          })
        } finally {
          await publisher?.stop()
        }
        if (e.writes) {
          const { published, waiting } = await countEvents(db)
          if (published !== m.transactions || waiting)
            throw new Error(
              `${e.label}: ${m.transactions} inserts, ${published} events published and ${waiting} left in the outbox`,
            )
          await resetWrites(db, e.writes)
        }
        ;(series[e.key] ??= []).push(m)
        const f = (x: number | undefined, d = 0) => (x === undefined ? 'n/a' : x.toFixed(d))
        log(
          `ceiling ${round + 1}/${ceilingSettings.rounds} ${e.label.padEnd(34)} ` +
            `c=${String(clients).padStart(3)} ${m.tps.toFixed(0).padStart(7)} tx/s  ` +
            `DB ${f(m.dbCpuPerTx)} ` +
            `µs/tx  cluster ${f(m.clusterCpuPerTx)} ` +
            `µs/tx  pgbench ${m.pgbenchCpuPerTx.toFixed(0)} µs/tx  machine ${(m.machineBusy * 100).toFixed(0)} % busy` +
            (m.failed ? `  failed ${m.failed}` : ''),
        )
      }
    }
  }
  return {
    series,
    scripts,
    pgbench,
    labels: Object.fromEntries(list.map((e) => [e.key, e.label])),
    mode: ceilingSettings.mode,
    clients: ceilingSettings.clients,
    duration: ceilingSettings.duration,
    rounds: ceilingSettings.rounds,
    threads: ceilingSettings.threads,
  }
}
