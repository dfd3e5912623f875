import { spawn, spawnSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'

// wrk, the load generator of `make bench`: a C program (Debian package `wrk`)
// that costs far less CPU per request than a Node one, which matters when it
// shares two cores with the servers and PostgreSQL. The requests come from
// bench/wrk.lua, which also prints the results as one JSON line.

const script = fileURLToPath(new URL('./wrk.lua', import.meta.url))

export type WrkMode = 'static' | 'id' | 'after' | 'post' | 'product' | 'batch' | 'patch'

/** What bench/wrk.lua should send: see its header for the modes. */
export interface WrkRequests {
  mode: WrkMode
  /** The fixed part of the request target (for `id`, `after` and `patch`, what the number is appended to). */
  path: string
  headers: Record<string, string>
  /** `batch`: the product creations in each request. */
  operations?: number
}

export interface WrkLoad extends WrkRequests {
  origin: string
  /** Table size: ids are drawn from 1..rows. */
  rows: number
  connections: number
  threads: number
  seconds: number
  /** A response slower than this counts as a time-out, not as latency. */
  timeoutSeconds: number
  /** Seeds the threads' random ids; distinct runs get distinct ids. */
  seed: number
  /** Makes POST e-mails and SKUs unique across runs. */
  tag: string
}

export interface WrkResult {
  /** Responses received (any status). */
  requests: number
  seconds: number
  /** wrk's error counts; `status` is responses with a status above 399. */
  errors: { connect: number; read: number; write: number; status: number; timeout: number }
  latencyMs: { p50: number; p99: number; max: number; mean: number }
}

interface RawResult {
  requests: number
  duration_us: number
  errors: WrkResult['errors']
  latency_us: { p50: number; p99: number; max: number; mean: number }
}

/** wrk's version line, or undefined when wrk is not installed. */
export function wrkVersion(): string | undefined {
  const r = spawnSync('wrk', ['--version'], { encoding: 'utf8' })
  if (r.error) return undefined
  // `wrk 4.1.0 [epoll] Copyright (C) 2012 Will Glozer`, then the usage; it exits with 1.
  return /^wrk ([^ ]+)/.exec(r.stdout || r.stderr)?.[1]
}

export function assertWrk(): string {
  const version = wrkVersion()
  if (!version) {
    throw new Error(
      'wrk (the load generator) is not installed. `make bench` installs it with apt-get when it can; otherwise ' +
        'install it yourself: ' +
        'Debian/Ubuntu `apt-get install wrk`, Fedora `dnf install wrk`, macOS `brew install wrk`.',
    )
  }
  return version
}

export function runWrk(load: WrkLoad): Promise<WrkResult> {
  const args = [
    '-t',
    String(load.threads),
    '-c',
    String(load.connections),
    '-d',
    `${load.seconds}s`,
    '--timeout',
    `${load.timeoutSeconds}s`,
    '-s',
    script,
    load.origin,
    '--',
    load.mode === 'batch' ? `batch:${load.operations ?? 100}` : load.mode,
    load.path,
    String(load.rows),
    String(load.threads),
    String(load.seed),
    load.tag,
    ...Object.entries(load.headers).map(([name, value]) => `${name}: ${value}`),
  ]
  return new Promise((resolve, reject) => {
    const child = spawn('wrk', args, { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (out += chunk))
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (out += chunk))
    child.once('error', reject)
    child.once('exit', (code) => {
      const line = /^BENCH_RESULT (.*)$/m.exec(out)
      if (code !== 0 || !line) return reject(new Error(`wrk ${args.join(' ')} failed (exit ${code}):\n${out}`))
      const raw = JSON.parse(line[1]!) as RawResult
      const ms = (us: number) => us / 1000
      resolve({
        requests: raw.requests,
        seconds: raw.duration_us / 1e6,
        errors: raw.errors,
        latencyMs: {
          p50: ms(raw.latency_us.p50),
          p99: ms(raw.latency_us.p99),
          max: ms(raw.latency_us.max),
          mean: ms(raw.latency_us.mean),
        },
      })
    })
  })
}
