import { spawn, type ChildProcess } from 'node:child_process'
import { closeSync, existsSync, openSync } from 'node:fs'
import { join } from 'node:path'
import { freePort, peerServers } from './peers-check.js'
import { processTree } from './proc.js'

// The servers `make bench` compares, each started as a fresh process:
//   service  the production build, as `npm start` runs it (dist/main.js)
//   workers  the same with WORKERS=N (BENCH_WORKERS, 2): a primary and N
//            workers on one port, measured as their process tree
//   fastify  Fastify 5 doing the service's work (bench/fastify/server.js)
//   minimal  the minimal idiomatic Fastify 5 server (bench/fastify-minimal/server.js)
//   bare     a bare node:http server (bench/bare/server.js)
// The peers are independent of the service: each folder has its own
// package.json and lock with the published postgres.js, not the service's
// patched copy, and they share no code with it. Their interface: PORT, HOST,
// DATABASE_URL (a `host=/dir` query parameter names a Unix socket folder),
// DATABASE_POOL_MAX, BENCH_JWT_SECRET, BENCH_JWT_KID, JWT_ISSUER,
// JWT_AUDIENCE; GET /healthz; exit on SIGTERM; PostgreSQL application_name
// upa-bench-<folder>. The equal-work and bare peers log one JSON line per
// request on stdout, as the service does; the minimal one logs nothing.

export type Kind = 'service' | 'workers' | 'fastify' | 'minimal' | 'bare'
/** The servers of the main series (the service first: the reference of the byte-identity check). */
export const KINDS: readonly Kind[] = ['service', 'fastify', 'minimal', 'bare']
export const PEERS = ['fastify', 'minimal', 'bare'] as const satisfies readonly Kind[]
/** Every server, the service's WORKERS variant included. */
export const ALL_KINDS: readonly Kind[] = ['service', 'workers', 'fastify', 'minimal', 'bare']
/** Peers that serve only the plain requests (peers-check.ts `extended`). */
export const MINIMAL_PEERS: readonly Kind[] = ['minimal']

/** application_name of each server's PostgreSQL connections: how its backends are found. */
export const APP_NAMES: Record<Kind, string> = {
  service: 'users-products-api',
  // The same build: measured alone (the other servers of its cell idle), so its backends' CPU is its own.
  workers: 'users-products-api',
  fastify: peerServers.fastify.appName,
  minimal: peerServers.minimal.appName,
  bare: peerServers.bare.appName,
}

export interface ServerOptions {
  root: string
  outDir: string
  databaseUrl: string
  rows: number
  pool: number
  jwt: { kid: string; secret: string; issuer: string }
  /** The service's entry point (dist/main.js, or another build) and Node options. */
  serviceMain: string
  serviceNodeArgs: string[]
  logLevel: string
  /** More environment for the service (DATABASE_LISTEN_URL behind a pooler, say). */
  serviceEnv?: Record<string, string>
  /** WORKERS of the `workers` server. */
  workers?: number
}

export interface RunningServer {
  kind: Kind
  child: ChildProcess
  pid: number
  origin: string
  appName: string
  /** Where its stdout (one JSON line per request) goes. */
  logFile: string
  stderr: string[]
  exited: boolean
  /** `workers` only: the worker processes it runs (0: a build without WORKERS support). */
  workers?: number
}

export const running = new Set<RunningServer>()

export const logFileOf = (outDir: string, kind: Kind, rows: number) => join(outDir, `${kind}-${rows}.log`)

/** The command line and environment of a server; `extraNodeArgs` adds e.g. --cpu-prof. */
function command(
  kind: Kind,
  o: ServerOptions,
  port: number,
  extraNodeArgs: string[],
): { args: string[]; cwd: string; env: NodeJS.ProcessEnv } {
  const common = {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    PORT: String(port),
    HOST: '127.0.0.1',
    DATABASE_URL: o.databaseUrl,
    DATABASE_POOL_MAX: String(o.pool),
    JWT_ISSUER: o.jwt.issuer,
    JWT_AUDIENCE: o.jwt.issuer,
  }
  if (kind === 'service' || kind === 'workers') {
    if (!existsSync(o.serviceMain))
      throw new Error(`${o.serviceMain} is missing: run \`make build\` first (\`make bench\` does)`)
    return {
      args: [...o.serviceNodeArgs, ...extraNodeArgs, o.serviceMain],
      cwd: o.root,
      env: {
        ...common,
        NODE_ENV: 'production',
        JWT_SECRETS: `${o.jwt.kid}:${o.jwt.secret}`,
        LOG_LEVEL: o.logLevel,
        RATE_LIMIT: '0',
        ...o.serviceEnv,
        ...(kind === 'workers' ? { WORKERS: String(o.workers ?? 2) } : {}),
      },
    }
  }
  const peer = peerServers[kind]
  if (!existsSync(join(peer.dir, 'node_modules')))
    throw new Error(`${peer.dir}/node_modules is missing: \`make bench\` installs it (npm ci there)`)
  return {
    args: [...extraNodeArgs, peer.script],
    cwd: peer.dir,
    env: { ...common, NODE_ENV: 'production', BENCH_JWT_SECRET: o.jwt.secret, BENCH_JWT_KID: o.jwt.kid },
  }
}

/** Starts a server with its stdout appended to its log file, and waits until it answers its readiness probe. */
export async function startServer(kind: Kind, o: ServerOptions, extraNodeArgs: string[] = []): Promise<RunningServer> {
  const port = await freePort()
  const { args, cwd, env } = command(kind, o, port, extraNodeArgs)
  // The request log goes to a file, as to a log shipper: every line is still serialized and written.
  const logFile = logFileOf(o.outDir, kind, o.rows)
  const fd = openSync(logFile, 'a')
  const child = spawn(process.execPath, args, { cwd, env, stdio: ['ignore', fd, 'pipe'] })
  closeSync(fd)
  const server: RunningServer = {
    kind,
    child,
    pid: child.pid!,
    origin: `http://127.0.0.1:${port}`,
    appName: APP_NAMES[kind],
    logFile,
    stderr: [],
    exited: false,
  }
  running.add(server)
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => server.stderr.push(chunk))
  child.once('exit', () => {
    server.exited = true
    running.delete(server)
  })
  await waitReady(server, kind === 'service' || kind === 'workers' ? '/readyz' : '/healthz')
  if (kind === 'workers') server.workers = await waitWorkers(server, o.workers ?? 2)
  return server
}

/**
 * The workers a `workers` server runs: its processes but the primary, once
 * all N have started (or 0 after 10 s when the build forks none: one without
 * WORKERS support ignores the variable and serves alone), then the service
 * answering its readiness probe a few times, so that each worker is likely
 * to have answered one (the kernel spreads connections among their sockets).
 */
async function waitWorkers(server: RunningServer, n: number): Promise<number> {
  const deadline = Date.now() + 10_000
  let workers = processTree(server.pid).length - 1
  while (workers < n && Date.now() < deadline && !server.exited) {
    await new Promise((r) => setTimeout(r, 100))
    workers = processTree(server.pid).length - 1
  }
  for (let i = 0; i < 2 * n; i++) await waitReady(server, '/readyz')
  return workers
}

async function waitReady(server: RunningServer, path: string): Promise<void> {
  const deadline = Date.now() + 30_000
  for (;;) {
    if (server.exited) throw new Error(`the ${server.kind} server exited at start-up:\n${server.stderr.join('')}`)
    try {
      const res = await fetch(server.origin + path)
      await res.arrayBuffer()
      if (res.ok) return
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline)
      throw new Error(`the ${server.kind} server did not become ready within 30 s:\n${server.stderr.join('')}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

export async function stopServer(server: RunningServer): Promise<void> {
  if (server.exited) return
  const exited = new Promise<void>((resolve) => server.child.once('exit', () => resolve()))
  server.child.kill('SIGTERM')
  const timer = setTimeout(() => server.child.kill('SIGKILL'), 15_000)
  await exited
  clearTimeout(timer)
}

export type Servers = Record<Kind, RunningServer>

/** Fresh processes of the servers, started side by side. */
export async function startAll(o: ServerOptions, kinds: readonly Kind[] = KINDS): Promise<Partial<Servers>> {
  const started = await Promise.allSettled(kinds.map((k) => startServer(k, o)))
  const failed = started.find((s): s is PromiseRejectedResult => s.status === 'rejected')
  const ok = started.flatMap((s) => (s.status === 'fulfilled' ? [s.value] : []))
  if (failed) {
    await Promise.all(ok.map(stopServer))
    throw failed.reason
  }
  return Object.fromEntries(ok.map((s) => [s.kind, s]))
}

export async function stopAll(servers: Partial<Servers>): Promise<void> {
  await Promise.all(Object.values(servers).map(stopServer))
}
