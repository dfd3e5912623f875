import { spawn, type ChildProcess } from 'node:child_process'
import { closeSync, existsSync, openSync } from 'node:fs'
import { join } from 'node:path'
import { freePort, peerServers } from './peers-check.js'

// The three servers `make bench` compares, each started as a fresh process:
//   service  the production build, as `npm start` runs it (dist/main.js)
//   fastify  an idiomatic Fastify 5 server (bench/fastify/server.js)
//   bare     a bare node:http server (bench/bare/server.js)
// The two peers are independent of the service: each folder has its own
// package.json and lock with the published postgres.js, not the service's
// patched copy, and they share no code with it. Their interface: PORT, HOST,
// DATABASE_URL (a `host=/dir` query parameter names a Unix socket folder),
// DATABASE_POOL_MAX, BENCH_JWT_SECRET, BENCH_JWT_KID, JWT_ISSUER,
// JWT_AUDIENCE; one JSON log line per request on stdout; GET /healthz; exit
// on SIGTERM; PostgreSQL application_name upa-bench-fastify / upa-bench-bare.

export type Kind = 'service' | 'fastify' | 'bare'
export const KINDS: readonly Kind[] = ['service', 'fastify', 'bare']
export const PEERS = ['fastify', 'bare'] as const satisfies readonly Kind[]

/** application_name of each server's PostgreSQL connections: how its backends are found. */
export const APP_NAMES: Record<Kind, string> = {
  service: 'users-products-api',
  fastify: peerServers.fastify.appName,
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
}

export const running = new Set<RunningServer>()

export const logFileOf = (outDir: string, kind: Kind, rows: number) => join(outDir, `${kind}-${rows}.log`)

/** The command line and environment of a server; `extraNodeArgs` adds e.g. --cpu-prof. */
function command(kind: Kind, o: ServerOptions, port: number, extraNodeArgs: string[]): { args: string[]; cwd: string; env: NodeJS.ProcessEnv } {
  const common = {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    PORT: String(port),
    HOST: '127.0.0.1',
    DATABASE_URL: o.databaseUrl,
    DATABASE_POOL_MAX: String(o.pool),
    JWT_ISSUER: o.jwt.issuer,
    JWT_AUDIENCE: o.jwt.issuer,
  }
  if (kind === 'service') {
    if (!existsSync(o.serviceMain)) throw new Error(`${o.serviceMain} is missing: run \`make build\` first (\`make bench\` does)`)
    return {
      args: [...o.serviceNodeArgs, ...extraNodeArgs, o.serviceMain],
      cwd: o.root,
      env: { ...common, NODE_ENV: 'production', JWT_SECRETS: `${o.jwt.kid}:${o.jwt.secret}`, LOG_LEVEL: o.logLevel, RATE_LIMIT: '0', ...o.serviceEnv },
    }
  }
  const peer = peerServers[kind]
  if (!existsSync(join(peer.dir, 'node_modules'))) throw new Error(`bench/${kind}/node_modules is missing: \`make bench\` installs it (npm ci in bench/${kind})`)
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
    kind, child, pid: child.pid!, origin: `http://127.0.0.1:${port}`, appName: APP_NAMES[kind], logFile, stderr: [], exited: false,
  }
  running.add(server)
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => server.stderr.push(chunk))
  child.once('exit', () => {
    server.exited = true
    running.delete(server)
  })
  await waitReady(server, kind === 'service' ? '/readyz' : '/healthz')
  return server
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
    if (Date.now() > deadline) throw new Error(`the ${server.kind} server did not become ready within 30 s:\n${server.stderr.join('')}`)
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

/** Fresh processes of all three servers, started side by side. */
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
