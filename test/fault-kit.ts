import { execFile, spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { connect as netConnect, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { monitorEventLoopDelay } from 'node:perf_hooks'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import v8 from 'node:v8'
import vm from 'node:vm'
import type { Sql, TransactionSql } from 'postgres'
import { signJwt } from '../src/auth/jwt.js'
import { applicationRegistry } from './helpers/registry.js'
import { testHashCostFor } from './helpers/passwords.js'
import { PortTaken } from './helpers/ports.js'
import { connect } from '../src/core/db/connect.js'
import { migrate } from '../src/core/db/migrate.js'

// What the fault tests (test/fault-*.test.ts) and the fault benchmark
// (bench/faults.ts) share: a PostgreSQL cluster of their own that they may
// stop, freeze and restart (never the shared one the rest of the suite uses),
// the real process (`node --import tsx src/main.ts`), loads of concurrent
// clients that record every outcome, raw connections, floods of idle ones,
// how late this process's event loop runs, and a garbage collector for memory
// figures. Nothing here needs the node:test runner.
//
// Everything here is asynchronous on purpose: the load runs in the same event
// loop, and a blocking spawnSync would stall it and distort every latency.

const run = promisify(execFile)
export const projectRoot = fileURLToPath(new URL('../', import.meta.url))
/**
 * The entry point as production runs it, compiled: test/run.ts builds dist/ before the first file runs
 * (test/harness/build.ts), `make bench-faults` depends on `make build`.
 */
export const mainScript = join(projectRoot, 'dist', 'main.js')
const JWT_SECRET = 'fault-test-secret-that-is-at-least-32-bytes!'

function findBinaries(): string {
  const has = (dir: string) => ['initdb', 'pg_ctl', 'postgres'].every((b) => existsSync(join(dir, b)))
  const candidates: string[] = []
  if (process.env.PG_BIN) candidates.push(process.env.PG_BIN)
  if (existsSync('/usr/lib/postgresql')) {
    const versions = readdirSync('/usr/lib/postgresql')
      .filter((d) => /^[0-9]+$/.test(d))
      .sort((a, b) => Number(b) - Number(a))
    candidates.push(...versions.map((v) => `/usr/lib/postgresql/${v}/bin`))
  }
  candidates.push(...(process.env.PATH ?? '').split(':').filter(Boolean))
  const found = candidates.find(has)
  if (!found) throw new Error('PostgreSQL server binaries not found (set PG_BIN)')
  return found
}

/** As root, PostgreSQL runs as `postgres` (or `nobody`), as src/dev/local-cluster.ts does. */
function serverAccount(): string | undefined {
  if (process.getuid?.() !== 0) return undefined
  for (const user of ['postgres', 'nobody']) if (spawnSync('id', ['-u', user]).status === 0) return user
  throw new Error('running as root without a postgres or nobody account')
}

export interface ClusterOptions {
  /** Listen on 127.0.0.1 at this port too (also the number of the socket file). */
  port?: number
  /** Server settings besides those `start` gives (`ssl`, `ssl_cert_file`, …): passed as `-c name='value'`. */
  settings?: Record<string, string>
  /** Runs after initdb, before the first start: pg_hba.conf and certificates go in then (`place`). */
  prepare?: (cluster: OwnCluster) => Promise<void>
}

/**
 * A throw-away PostgreSQL cluster: initdb into a fresh temp folder, listening
 * on a Unix socket in a folder of its own (and on 127.0.0.1 with `port`). `stop('immediate')` is a crash
 * (SIGQUIT to every backend, no checkpoint); `stop('fast')` a clean shutdown
 * that aborts open transactions.
 */
export class OwnCluster {
  private readonly bin = findBinaries()
  private readonly account = serverAccount()
  readonly root: string
  readonly data: string
  readonly sockets: string
  /** Where it also listens on TCP (127.0.0.1), and the number of its socket file; undefined: the socket only, 5432. */
  readonly port: number | undefined

  private constructor(private readonly options: ClusterOptions) {
    this.root = mkdtempSync(join(tmpdir(), 'upa-fault-'))
    this.data = join(this.root, 'pg')
    this.sockets = join(this.root, 'run')
    this.port = options.port
  }

  static async create(options: ClusterOptions = {}): Promise<OwnCluster> {
    const c = new OwnCluster(options)
    await run('mkdir', ['-m', '700', c.data, c.sockets])
    if (c.account) await run('chown', ['-R', `${c.account}:`, c.root])
    await c.tool('initdb', [
      '-D',
      c.data,
      '-U',
      'postgres',
      '--auth=trust',
      '--encoding=UTF8',
      '--no-locale',
      '--no-instructions',
      '--no-sync',
    ])
    try {
      await options.prepare?.(c)
      await c.start()
    } catch (err) {
      await c.destroy()
      throw err
    }
    return c
  }

  /** Writes `content` into the data folder as `name`, the server account's and readable by it alone; its path. */
  async place(name: string, content: string): Promise<string> {
    const path = join(this.data, name)
    writeFileSync(path, content, { mode: 0o600 })
    if (this.account) await run('chown', [`${this.account}:`, path])
    return path
  }

  private async tool(name: string, args: string[]): Promise<string> {
    const [cmd, argv] = this.account
      ? ['runuser', ['-u', this.account, '--', join(this.bin, name), ...args]]
      : [join(this.bin, name), args]
    const { stdout, stderr } = await run(cmd, argv, { timeout: 60_000 })
    return stdout + stderr
  }

  url(database = 'postgres'): string {
    const port = this.port === undefined ? '' : `:${this.port}`
    return `postgres://postgres@localhost${port}/${database}?host=${encodeURIComponent(this.sockets)}`
  }

  async start(): Promise<void> {
    // fsync off: a crash of the server (what the tests cause) loses nothing the
    // kernel already has; only a crash of the machine would.
    const settings: Record<string, string> = {
      listen_addresses: this.port === undefined ? '' : '127.0.0.1',
      ...(this.port === undefined ? {} : { port: String(this.port) }),
      unix_socket_directories: this.sockets,
      max_connections: '100',
      fsync: 'off',
      full_page_writes: 'off',
      ...this.options.settings,
    }
    const options = Object.entries(settings)
      .map(([name, value]) => `-c ${name}='${value}'`)
      .join(' ')
    const log = join(this.root, 'postgres.log')
    await this.tool('pg_ctl', ['start', '-D', this.data, '-w', '-t', '60', '-l', log, '-o', options]).catch(
      (err: unknown) => {
        // Another process took the port since it was chosen (ports.ts, onFreePorts).
        if (this.port !== undefined && existsSync(log) && /Address already in use/.test(readFileSync(log, 'utf8')))
          throw new PortTaken()
        throw err
      },
    )
  }

  async stop(mode: 'fast' | 'immediate'): Promise<void> {
    await this.tool('pg_ctl', ['stop', '-D', this.data, '-m', mode, '-w', '-t', '60'])
  }

  /** The postmaster and every backend of this cluster (for SIGSTOP/SIGCONT). */
  async pids(): Promise<number[]> {
    const postmaster = Number(readFileSync(join(this.data, 'postmaster.pid'), 'utf8').split('\n')[0])
    const { stdout } = await run('pgrep', ['-P', String(postmaster)]).catch(() => ({ stdout: '' }))
    return [postmaster, ...stdout.split('\n').filter(Boolean).map(Number)]
  }

  /** A new database with the schema migrated and one admin user; its URL and the admin's id. */
  async createDatabase(): Promise<{ url: string; adminId: number }> {
    const name = `fault_${randomBytes(4).toString('hex')}`
    const server = connect(this.url(), { max: 1, statementTimeoutMs: 60_000 })
    try {
      await server`CREATE DATABASE ${server(name)}`
    } finally {
      await server.end({ timeout: 5 })
    }
    const db = connect(this.url(name), { max: 1, statementTimeoutMs: 60_000 })
    try {
      await migrate(db)
      const [admin] = await db<Array<{ id: number }>>`INSERT INTO users (name, email, role) VALUES
        ('Fault Admin', ${`admin.${name}@example.com`}, 'admin') RETURNING id`
      return { url: this.url(name), adminId: admin!.id }
    } finally {
      await db.end({ timeout: 5 })
    }
  }

  async destroy(): Promise<void> {
    await this.stop('immediate').catch(() => {})
    rmSync(this.root, { recursive: true, force: true })
  }
}

/**
 * Holds `FOR UPDATE` on one row, in a transaction of `sql`'s, from the moment
 * this resolves until `release()`; `done` settles when that transaction has
 * ended. Requests that write the row wait on it: the tests' way to keep work
 * in flight, or a transaction between two of its writes, for as long as they
 * need. The table comes from this list, never from a caller's text.
 */
/**
 * Holds the lock `take` acquires, in a transaction of its own, until
 * `release()`; resolves once the lock is held.
 */
async function holdLock(
  sql: Sql,
  take: (tx: TransactionSql) => Promise<unknown>,
): Promise<{ release(): void; done: Promise<unknown> }> {
  let release!: () => void
  const released = new Promise<void>((resolve) => (release = resolve))
  let locked!: () => void
  const isLocked = new Promise<void>((resolve) => (locked = resolve))
  const done = sql.begin(async (tx) => {
    await take(tx)
    locked()
    await released
  })
  await Promise.race([isLocked, done])
  return { release, done }
}

/** One row locked FOR UPDATE: writers of that row wait, readers do not. */
export const holdRowLock = (sql: Sql, table: 'users' | 'sessions', id: number) =>
  holdLock(sql, (tx) => tx`SELECT 1 FROM ${tx(table)} WHERE id = ${id} FOR UPDATE`)

/** A whole table locked ACCESS EXCLUSIVE: every statement that touches it waits, reads included. */
export const holdTableLock = (sql: Sql, table: 'users') =>
  holdLock(sql, (tx) => tx`LOCK TABLE ${tx(table)} IN ACCESS EXCLUSIVE MODE`)

/**
 * An admin JWT as the service issues it (no database read is needed to check it). It names no session unless
 * `sessionId` (freshAdminToken), so it is no fresh login: step-up acts refuse it.
 */
export function adminToken(adminId: number, sessionId?: number): string {
  const now = Math.floor(Date.now() / 1000)
  return signJwt(
    {
      sub: String(adminId),
      iss: 'users-products-api',
      aud: 'users-products-api',
      iat: now,
      exp: now + 3600,
      role: 'admin',
      scope: [...applicationRegistry.scopes.byRole.admin].join(' '),
      // By default no session has this id; the epoch of a user never changed: revoked only with its user.
      sid: String(sessionId ?? 2 ** 53),
      gen: 0,
    },
    { kid: 'fault', secret: Buffer.from(JWT_SECRET) },
  )
}

/**
 * An admin JWT naming a session opened now, as a password login opens one: a fresh login for the step-up acts
 * (REAUTH_WINDOW) a test makes, such as setting another user's e-mail.
 */
export async function freshAdminToken(db: Sql, adminId: number): Promise<string> {
  // A session and its refresh token, whole, as a login stores them.
  const [session] = await db<Array<{ id: number }>>`
    WITH opened AS (
      INSERT INTO sessions (user_id, scopes, token_format, expires_at, last_used_at)
      VALUES (${adminId}, ${[...applicationRegistry.scopes.byRole.admin]}, 'jwt', now() + interval '1 day', now())
      RETURNING id),
    refresh AS (INSERT INTO refresh_tokens (token_hash, session_id) SELECT ${randomBytes(32)}, id FROM opened)
    SELECT id FROM opened`
  return adminToken(adminId, session!.id)
}

/** What every service started here is given: the secret `adminToken` signs with, no rate limit, each request logged. */
export const serviceEnv = { JWT_SECRETS: `fault:${JWT_SECRET}`, RATE_LIMIT: '0', LOG_LEVEL: 'info' }

export interface Spawned {
  url: string
  port: number
  pid: number
  /** Every JSON line the process wrote on stdout. */
  logs: Array<Record<string, unknown>>
  stderr: () => string
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; at: number }>
  alive(): boolean
  kill(signal: NodeJS.Signals): void
}

/** A process started by `launchService`, before it listens: `listening` gives it with its address. */
export type Launched = Omit<Spawned, 'url' | 'port'> & { listening: Promise<Spawned> }

/** How a command of the entry point ended. */
export interface CommandExit {
  code: number | null
  signal: NodeJS.Signals | null
  stdout: string
  stderr: string
}

/**
 * The entry point run as a command (`dist/main.js <args>`) with exactly this
 * environment, nothing inherited but PATH and HOME; `input` on its standard
 * input. Killed after 30 s, so a command that hangs fails its test.
 */
export function spawnCommand(
  args: string[],
  env: Record<string, string>,
  input?: string,
): { child: ChildProcess; exited: Promise<CommandExit>; stdout(): string } {
  const child = spawn(process.execPath, [mainScript, ...args], {
    cwd: projectRoot,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...env },
    stdio: [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
  })
  if (input !== undefined) child.stdin!.end(input)
  let stdout = ''
  let stderr = ''
  child.stdout!.setEncoding('utf8').on('data', (text: string) => void (stdout += text))
  child.stderr!.setEncoding('utf8').on('data', (text: string) => void (stderr += text))
  const timer = setTimeout(() => child.kill('SIGKILL'), 30_000)
  const exited = new Promise<CommandExit>((resolve) =>
    child.on('close', (code, signal) => {
      clearTimeout(timer)
      resolve({ code, signal, stdout, stderr })
    }),
  )
  return { child, exited, stdout: () => stdout }
}

/** spawnCommand, once it has ended. */
export const runCommand = (args: string[], env: Record<string, string>, input?: string) =>
  spawnCommand(args, env, input).exited

/**
 * The lines of a service's log that say something went wrong: errors and
 * warnings, but the notice every start in development mode gives (launchService
 * does not set NODE_ENV).
 */
export const troubleIn = (logs: ReadonlyArray<Record<string, unknown>>) =>
  logs.filter(
    (l) => l.level === 'error' || (l.level === 'warn' && l.msg !== 'development mode: NODE_ENV is not "production"'),
  )

/**
 * The real service, `node dist/main.js` (or another script that logs as it
 * does: a TypeScript one runs under tsx), with this environment. Its log lines are collected from
 * the start, so a test can watch it before it listens (two instances waiting
 * for the migration lock); `listening` rejects, and the process is killed,
 * when it exits first or does not listen within 30 s.
 */
export function launchService(env: Record<string, string>, { script = mainScript, detached = false } = {}): Launched {
  const child = spawn(process.execPath, script.endsWith('.ts') ? ['--import', 'tsx', script] : [script], {
    cwd: projectRoot,
    // Detached: a process group of its own, for a test to signal as a terminal or a supervisor signals one.
    detached,
    env: {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      HOST: '127.0.0.1',
      PORT: '0',
      ...serviceEnv,
      ...testHashCostFor(env),
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  const logs: Array<Record<string, unknown>> = []
  let stderr = ''
  let rest = ''
  let alive = true
  let onListening: (port: number) => void = () => {}
  const announced = new Promise<number>((resolve) => (onListening = resolve))
  child.stdout.setEncoding('utf8').on('data', (text: string) => {
    const lines = (rest + text).split('\n')
    rest = lines.pop()!
    for (const line of lines) {
      if (!line) continue
      const entry = JSON.parse(line) as Record<string, unknown>
      // When this process read the line (its clock): the event happened before.
      Object.defineProperty(entry, 'seenAt', { value: performance.now(), enumerable: false })
      logs.push(entry)
      if (entry.msg === 'listening') onListening(entry.port as number)
    }
  })
  child.stderr.setEncoding('utf8').on('data', (text: string) => void (stderr += text))
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; at: number }>((resolve) =>
    child.on('exit', (code, signal) => {
      alive = false
      resolve({ code, signal, at: performance.now() })
    }),
  )
  const handle = {
    pid: child.pid!,
    logs,
    stderr: () => stderr,
    exited,
    alive: () => alive,
    kill: (signal: NodeJS.Signals) => void child.kill(signal),
  }
  // The 'listening' line is at info level: with LOG_LEVEL above it, pass a PORT.
  const fixed = env.PORT && env.PORT !== '0' ? Number(env.PORT) : undefined
  const ready =
    fixed === undefined
      ? announced
      : waitFor(
          'the service to listen',
          async () => (await call(`http://127.0.0.1:${fixed}`, 'GET', '/healthz', { timeoutMs: 1000 })).status === 200,
          30_000,
        ).then(() => fixed)
  const listening = Promise.race([
    ready,
    exited.then(({ code }) => Promise.reject(new Error(`the service exited (${code}) before listening: ${stderr}`))),
    sleep(30_000, undefined, { ref: false }).then(() =>
      Promise.reject(new Error(`the service did not listen within 30 s: ${stderr}`)),
    ),
  ]).then(
    (port): Spawned => ({ ...handle, url: `http://127.0.0.1:${port}`, port }),
    (err: unknown) => {
      child.kill('SIGKILL')
      throw err
    },
  )
  listening.catch(() => {}) // a caller that never waits for it sees the exit instead
  return { ...handle, listening }
}

/** The real service (`launchService`); resolves once it listens. */
export const spawnService = (env: Record<string, string>, script?: string): Promise<Spawned> =>
  launchService(env, script ? { script } : {}).listening

export interface Outcome {
  client: number
  seq: number
  what: string
  started: number
  ended: number
  status?: number
  code?: string
  retryAfter?: string | null
  etag?: string | null
  error?: string
  body?: any // eslint-disable-line @typescript-eslint/no-explicit-any
}

/** One request with fetch, a hard time-out, and its outcome; never throws. */
export async function call(
  base: string,
  method: string,
  path: string,
  options: {
    token?: string
    body?: unknown
    headers?: Record<string, string>
    timeoutMs?: number
    what?: string
    client?: number
    seq?: number
  } = {},
): Promise<Outcome> {
  const headers: Record<string, string> = { ...options.headers }
  if (options.token) headers.authorization = `Bearer ${options.token}`
  if (options.body !== undefined)
    headers['content-type'] ??= method === 'PATCH' ? 'application/merge-patch+json' : 'application/json'
  const started = performance.now()
  const base_ = {
    client: options.client ?? 0,
    seq: options.seq ?? 0,
    what: options.what ?? `${method} ${path}`,
    started,
  }
  try {
    const res = await fetch(base + path, {
      method,
      headers,
      body: options.body === undefined ? undefined : JSON.stringify(options.body),
      signal: AbortSignal.timeout(options.timeoutMs ?? 20_000),
    })
    const text = await res.text()
    const body = text && /json/.test(res.headers.get('content-type') ?? '') ? JSON.parse(text) : undefined
    return {
      ...base_,
      ended: performance.now(),
      status: res.status,
      code: body?.code,
      retryAfter: res.headers.get('retry-after'),
      etag: res.headers.get('etag'),
      body,
    }
  } catch (err) {
    const e = err as Error & { cause?: { code?: string } }
    return { ...base_, ended: performance.now(), error: `${e.name}: ${e.cause?.code ?? e.message}` }
  }
}

/**
 * `clients` loops, each calling `step(client, seq)` again as soon as it
 * returns, until `stop()`; every outcome is kept.
 */
export function startLoad(clients: number, step: (client: number, seq: number) => Promise<Outcome>) {
  const outcomes: Outcome[] = []
  let stopped = false
  const loops = Array.from({ length: clients }, async (_, client) => {
    for (let seq = 0; !stopped; seq++) outcomes.push(await step(client, seq))
  })
  return {
    outcomes,
    async stop(): Promise<Outcome[]> {
      stopped = true
      await Promise.all(loops)
      return outcomes
    },
  }
}

/** Whether every client of a load has `times` outcomes for which `holds` is true. */
export function everyClient(outcomes: readonly Outcome[], holds: (o: Outcome) => boolean, times = 1): boolean {
  const clients = new Set(outcomes.map((o) => o.client))
  const counts = new Map<number, number>()
  for (const o of outcomes) if (holds(o)) counts.set(o.client, (counts.get(o.client) ?? 0) + 1)
  return clients.size > 0 && [...clients].every((c) => (counts.get(c) ?? 0) >= times)
}

/** Whether a connection to 127.0.0.1:`port` is refused now. */
export function connectionRefused(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = netConnect(port, '127.0.0.1')
    socket.once('connect', () => (socket.destroy(), resolve(false)))
    socket.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'ECONNREFUSED'))
  })
}

/** Polls until `check` is true; returns the time it took (ms), or throws after `timeoutMs`. */
export async function waitFor(
  what: string,
  check: () => boolean | Promise<boolean>,
  timeoutMs = 30_000,
  everyMs = 50,
): Promise<number> {
  const started = performance.now()
  while (!(await check())) {
    if (performance.now() - started > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await sleep(everyMs)
  }
  return performance.now() - started
}

let gcFunction: (() => void) | undefined
/** A full garbage collection (the test runner starts files without --expose-gc). */
export function gc(): void {
  if (!gcFunction) {
    v8.setFlagsFromString('--expose-gc')
    gcFunction = vm.runInNewContext('gc') as () => void
  }
  gcFunction()
  gcFunction()
}

/**
 * Heap in use after full collections, in bytes. Twice, with a pause: objects
 * freed through finalizers (fetch's, for one) go only in a later collection.
 */
export async function settledHeap(): Promise<number> {
  for (let i = 0; i < 3; i++) {
    await sleep(50)
    gc()
  }
  return process.memoryUsage().heapUsed
}

/**
 * The longest this process's event loop was held up (ms) while `work` ran. A
 * time-out is checked on a timer and a cut is seen in an event, so on a busy
 * machine both come as late as the loop runs: the slack a time bound needs,
 * measured in the same run rather than guessed for a quiet machine.
 */
export async function withLoopLag<T>(work: () => Promise<T>): Promise<{ result: T; lagMs: number }> {
  const delay = monitorEventLoopDelay({ resolution: 10 })
  delay.enable()
  try {
    const result = await work()
    return { result, lagMs: delay.max / 1e6 }
  } finally {
    delay.disable()
  }
}

export interface IdleFlood {
  /** How long opening them all took, from the first connect (ms). */
  openedIn: number
  /** Each connection's life from its connect to its close (ms): shortest and longest. */
  min: number
  max: number
  closed: number
  answered408: number
  /** The longest the flooding process's own event loop was held up (ms). */
  lagMs: number
}

/**
 * The flood comes from another process, as it would: the caller's process may
 * hold the service whose memory is measured. It opens `count` connections to
 * 127.0.0.1:`port`, 100 at a time, sends nothing, and reports once the server
 * has closed them all.
 */
const idleFloodScript = `
import { connect } from 'node:net'
import { monitorEventLoopDelay } from 'node:perf_hooks'
const [port, count] = process.argv.slice(1).map(Number)
const delay = monitorEventLoopDelay({ resolution: 10 })
delay.enable()
const started = performance.now()
const results = []
const closing = []
const open = () => new Promise((opened) => {
  const socket = connect(port, '127.0.0.1')
  const r = { received: '' }
  closing.push(new Promise((closed) => socket.on('close', () => {
    r.closedAt = performance.now()
    results.push(r)
    closed()
  })))
  socket.on('connect', () => { r.openedAt = performance.now(); opened() })
  socket.on('data', (d) => { r.received += d })
  socket.on('error', () => opened())
})
for (let i = 0; i < count; i += 100) await Promise.all(Array.from({ length: Math.min(100, count - i) }, open))
const openedIn = performance.now() - started
await Promise.all(closing)
const cut = results.map((r) => r.closedAt - r.openedAt)
const answered408 = results.filter((r) => r.received.startsWith('HTTP/1.1 408 ')).length
const [min, max, closed, lagMs] = [Math.min(...cut), Math.max(...cut), results.length, delay.max / 1e6]
process.stdout.write(JSON.stringify({ openedIn, min, max, answered408, closed, lagMs }))
`

/** `count` idle connections to 127.0.0.1:`port` from another process, held until the server closes them. */
export async function floodIdleConnections(port: number, count: number): Promise<IdleFlood> {
  const args = ['--input-type=module', '-e', idleFloodScript, String(port), String(count)]
  const { stdout } = await run(process.execPath, args, { timeout: 60_000 })
  return JSON.parse(stdout) as IdleFlood
}

export const summarize = (outcomes: Outcome[]) => {
  const counts: Record<string, number> = {}
  for (const o of outcomes) {
    const key = o.error ?? `${o.status}${o.code ? ' ' + o.code : ''}`
    counts[key] = (counts[key] ?? 0) + 1
  }
  return counts
}

export const percentile = (values: number[], p: number) => {
  if (!values.length) return 0
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!
}

/** How long each outcome took (ms): how many, the median, the 99th percentile and the longest. */
export function latencies(outcomes: ReadonlyArray<Pick<Outcome, 'started' | 'ended'>>) {
  const took = outcomes.map((o) => o.ended - o.started)
  const max = took.length ? Math.max(...took) : 0
  return { count: took.length, p50: percentile(took, 50), p99: percentile(took, 99), max }
}

export interface RawResponse {
  status: number
  headers: Record<string, string>
  body: string
}

/** A raw connection: what was written, every byte received, when the server closed it. */
export class RawClient {
  readonly socket: Socket
  private data = Buffer.alloc(0)
  openedAt = performance.now()
  closedAt = 0
  /** This end's port once connected (the server's remotePort for it), kept after the close. */
  localPort = 0
  readonly closed: Promise<void>
  constructor(port: number) {
    this.socket = netConnect(port, '127.0.0.1')
    this.socket.once('connect', () => void (this.localPort = this.socket.localPort!))
    this.socket.on('data', (d: Buffer) => void (this.data = Buffer.concat([this.data, d])))
    this.socket.on('error', () => {})
    this.closed = new Promise((resolve) =>
      this.socket.on('close', () => ((this.closedAt = performance.now()), resolve())),
    )
  }
  async open(): Promise<this> {
    await new Promise((resolve) => this.socket.once('connect', resolve))
    return this
  }
  write(text: string): void {
    this.socket.write(text)
  }
  get received(): string {
    return this.data.toString('utf8')
  }
  /** Complete responses received so far (by Content-Length). */
  responses(): RawResponse[] {
    const out: RawResponse[] = []
    let rest = this.received
    for (;;) {
      const end = rest.indexOf('\r\n\r\n')
      if (end === -1) return out
      const [statusLine, ...lines] = rest.slice(0, end).split('\r\n')
      const headers = Object.fromEntries(
        lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]),
      )
      const length = Number(headers['content-length'] ?? 0)
      if (rest.length < end + 4 + length) return out
      out.push({ status: Number(statusLine!.split(' ')[1]), headers, body: rest.slice(end + 4, end + 4 + length) })
      rest = rest.slice(end + 4 + length)
    }
  }
}

/** A malformed request: what it is, its raw bytes, and the status it must be answered with before it is closed. */
export type MalformedRequest = [name: string, raw: string, status: number]

/** One request of each malformed kind the parser and the body reader must refuse, as `token`'s bearer. */
export function malformedRequests(token: string, bodyLimit: number): MalformedRequest[] {
  const post = `POST /users HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${token}\r\n`
  const chunk = 'x'.repeat(8192)
  const chunks = `${chunk.length.toString(16)}\r\n${chunk}\r\n`.repeat(Math.ceil(bodyLimit / chunk.length) + 2)
  const chunkedOver = `${post}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n${chunks}0\r\n\r\n`
  const nested = '['.repeat(100_000)
  return [
    [
      'Content-Length with Transfer-Encoding',
      `${post}Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`,
      400,
    ],
    ['two Content-Length headers', `${post}Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}`, 400],
    ['headers over 16 KiB', `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`, 431],
    ['a chunked body over BODY_LIMIT', chunkedOver, 413],
    [
      '100,000 nested arrays',
      `${post}Content-Type: application/json\r\nContent-Length: ${nested.length}\r\nConnection: close\r\n\r\n${nested}`,
      400,
    ],
  ]
}

/**
 * Each of `kinds` `times` times at once, on a connection of its own: the
 * status each got by kind, 0 when closed without an answer, -1 when still
 * open after 5 s (then closed by this side).
 */
export async function sendMalformed(
  port: number,
  kinds: readonly MalformedRequest[],
  times: number,
): Promise<Map<string, number[]>> {
  const results = new Map<string, number[]>()
  await Promise.all(
    kinds.flatMap(([name, raw]) =>
      Array.from({ length: times }, async () => {
        const c = await new RawClient(port).open()
        c.write(raw)
        // Unreferenced: once the connection has closed, the pending timer must not keep the test process alive.
        const closed = await Promise.race([c.closed.then(() => true), sleep(5000, false, { ref: false })])
        if (!closed) c.socket.destroy()
        results.set(name, [...(results.get(name) ?? []), closed ? (c.responses()[0]?.status ?? 0) : -1])
      }),
    ),
  )
  return results
}

/**
 * `clients` slow-header connections (a header line every 300 ms) and as many
 * slow-body ones (a byte every 300 ms, as `token`'s bearer), opened at once;
 * resolves once the server has closed them all.
 */
export async function slowClients(
  port: number,
  clients: number,
  token: string,
): Promise<{ headers: RawClient[]; bodies: RawClient[] }> {
  const trickle: NodeJS.Timeout[] = []
  const slow = async (first: string, next: () => string) => {
    const c = await new RawClient(port).open()
    c.write(first)
    trickle.push(setInterval(() => c.socket.writable && c.write(next()), 300))
    return c
  }
  const many = (first: string, next: (i: number) => string) =>
    Promise.all(Array.from({ length: clients }, (_, i) => slow(first, () => next(i))))
  const headers = 'GET /healthz HTTP/1.1\r\nHost: x\r\n'
  const body =
    `POST /users HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${token}\r\n` +
    'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"name":"'
  try {
    const [slowHeaders, bodies] = await Promise.all([many(headers, (i) => `X-Slow-${i}: y\r\n`), many(body, () => 'a')])
    await Promise.all([...slowHeaders, ...bodies].map((c) => c.closed))
    return { headers: slowHeaders, bodies }
  } finally {
    for (const timer of trickle) clearInterval(timer)
  }
}
