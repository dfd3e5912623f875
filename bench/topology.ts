import { randomBytes } from 'node:crypto'
import { mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import type { Sql } from 'postgres'
import { connect } from '../src/core/db/connect.js'
import { startLocalCluster } from '../src/dev/local-cluster.js'
import { startNginx, type Nginx } from '../test/helpers/nginx.js'
import { launchPgBouncer, type PgBouncer } from '../test/helpers/pgbouncer.js'
import { signJwt } from './peers-check.js'
import { cpuMicros, cpuOf, cpuBetween, machineCpu } from './proc.js'
import { cell } from './report.js'
import { backendPids, createBenchDatabase, dropBenchDatabase, type Seeded } from './seed.js'
import { startServer, stopServer, type RunningServer, type ServerOptions } from './servers.js'
import { assertWrk, runWrk, type WrkRequests } from './wrk.js'
import { intSetting, oneOf } from './settings.js'

// The deployment of docs/scaling.md under load, on this machine: wrk → nginx
// (deploy/nginx.conf) → 1, 2 or 3 instances (the production build) →
// PgBouncer in transaction mode → PostgreSQL. Every part runs on the same
// two cores, so more instances cannot scale linearly here; the point is
// where the CPU goes: the instances, nginx, PgBouncer, PostgreSQL, and the
// rest (wrk itself, the kernel's loopback). Run by `make bench` after
// bench/run.ts; BENCH_TOPOLOGY=off skips it.

const env = process.env
const root = fileURLToPath(new URL('..', import.meta.url))
const outDir = join(root, 'bench', '.out')
const settings = {
  rows: intSetting('BENCH_ROWS', 100_000),
  seconds: intSetting('BENCH_TOPOLOGY_DURATION', 8),
  rounds: intSetting('BENCH_TOPOLOGY_ROUNDS', 2),
  connections: intSetting('BENCH_TOPOLOGY_CONNECTIONS', 64),
  pool: intSetting('BENCH_POOL', 10),
  /** Instance counts through PgBouncer, and 'direct': one instance straight to PostgreSQL, what the pooler costs. */
  layouts: [1, 2, 3, 'direct'] as const,
}
const log = (msg: string) => process.stderr.write(`[bench topology ${new Date().toISOString().slice(11, 19)}] ${msg}\n`)

const jwt = { kid: 'bench', secret: randomBytes(36).toString('base64url'), issuer: 'users-products-api' }
const bearer = { Authorization: `Bearer ${signJwt(jwt.secret, jwt.kid)}` }
const ENDPOINTS: Array<{ label: string; load: WrkRequests }> = [
  { label: 'GET /products?limit=50', load: { mode: 'static', path: '/products?limit=50', headers: bearer } },
  { label: 'GET /users/{id}', load: { mode: 'id', path: '/users/', headers: bearer } },
]

interface Figures {
  rps: number
  p99: number
  failed: number
  /** CPU µs per successful request, by part. */
  service: number
  nginx: number
  pgbouncer: number
  postgres: number
  rest: number
  /** The machine's cores busy over the run (2.0 = both, all the time). */
  cores: number
}

interface Topology {
  instances: RunningServer[]
  nginx: Nginx
}

async function measure(
  t: Topology,
  bouncer: PgBouncer,
  admin: Sql,
  db: Seeded,
  load: WrkRequests,
  seconds: number,
  seed: number,
): Promise<Figures> {
  const parts = () => ({
    service: t.instances.reduce((sum, i) => sum + (cpuMicros(i.pid) ?? NaN), 0),
    nginx: [...cpuOf(t.nginx.pids()).values()].reduce((a, b) => a + b, 0),
    pgbouncer: cpuMicros(bouncer.pid) ?? NaN,
  })
  const pgBefore = cpuOf(await backendPids(admin, db))
  const before = parts()
  const machineBefore = machineCpu()
  const r = await runWrk({
    ...load,
    origin: t.nginx.url,
    rows: db.rows,
    connections: settings.connections,
    threads: 1,
    seconds,
    timeoutSeconds: 10,
    seed,
    tag: `topology-${seed}`,
  })
  const machineAfter = machineCpu()
  const after = parts()
  const pgAfter = cpuOf(await backendPids(admin, db))
  const ok = r.requests - r.errors.status
  const per = (us: number) => us / ok
  const postgres = cpuBetween(pgBefore, pgAfter)
  const busy = machineAfter.busy - machineBefore.busy
  const service = after.service - before.service
  const nginx = after.nginx - before.nginx
  const pgbouncer = after.pgbouncer - before.pgbouncer
  return {
    rps: ok / r.seconds,
    p99: r.latencyMs.p99,
    failed: r.errors.status + r.errors.connect + r.errors.read + r.errors.write + r.errors.timeout,
    service: per(service),
    nginx: per(nginx),
    pgbouncer: per(pgbouncer),
    postgres: per(postgres),
    rest: per(busy - service - nginx - pgbouncer - postgres),
    cores: busy / (r.seconds * 1e6),
  }
}

async function withTopology<T>(count: number, options: ServerOptions, work: (t: Topology) => Promise<T>): Promise<T> {
  const instances: RunningServer[] = []
  let nginx: Nginx | undefined
  try {
    for (let i = 0; i < count; i++) instances.push(await startServer('service', options))
    nginx = await startNginx(instances.map((i) => new URL(i.origin).host))
    return await work({ instances, nginx })
  } finally {
    await nginx?.stop()
    await Promise.all(instances.map(stopServer))
  }
}

type Results = Record<string, Partial<Record<(typeof settings.layouts)[number], Figures[]>>>

function table(results: Results): string {
  const rows: string[] = [
    '| endpoint | instances | req/s | p99 ms | failed | CPU µs/req: instances | nginx | PgBouncer | PostgreSQL | the ' +
      'rest (wrk, kernel) | cores busy |',
    '|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  for (const [label, byCount] of Object.entries(results)) {
    for (const [layout, runs] of Object.entries(byCount) as Array<[string, Figures[]]>) {
      const count = layout === 'direct' ? '1, without PgBouncer' : layout
      const pick = (f: (x: Figures) => number, digits = 0) => cell(runs.map(f), digits)
      rows.push(
        `| ${label} | ${count} ` +
          `| ${pick((x) => x.rps)} | ${pick((x) => x.p99, 1)} | ${runs.reduce((a, x) => a + x.failed, 0)} | ` +
          `${pick((x) => x.service)} ` +
          `| ${pick((x) => x.nginx)} ` +
          `| ${pick((x) => x.pgbouncer)} ` +
          `| ${pick((x) => x.postgres)} | ${pick((x) => x.rest)} | ${pick((x) => x.cores, 2)} |`,
      )
    }
  }
  return rows.join('\n')
}

async function main(): Promise<void> {
  if (oneOf('BENCH_TOPOLOGY', ['on', 'off'], 'on') === 'off') return
  assertWrk()
  mkdirSync(outDir, { recursive: true })
  const serverUrl = env.DATABASE_URL ?? startLocalCluster()
  const admin = connect(serverUrl, { max: 1, statementTimeoutMs: 30 * 60_000 })
  let bouncer: PgBouncer | undefined
  let db: Seeded | undefined
  try {
    log(`seeding ${settings.rows.toLocaleString('en')} users and products`)
    db = await createBenchDatabase(admin, serverUrl, settings.rows)
    // Through a transaction pooler the time-outs are the role's (src/core/db/pooler.ts):
    // the service checks them at start.
    await admin`ALTER ROLE CURRENT_USER IN DATABASE ${admin(db.name)} SET statement_timeout = 5000`
    await admin`ALTER ROLE CURRENT_USER IN DATABASE ${admin(db.name)} SET idle_in_transaction_session_timeout = 5000`
    // Server connections for two instances' pools: with three, PgBouncer shares them for real.
    bouncer = await launchPgBouncer(serverUrl, { poolSize: settings.pool * 2 })
    const options: ServerOptions = {
      root,
      outDir,
      databaseUrl: bouncer.urlFor(db.url),
      rows: db.rows,
      pool: settings.pool,
      jwt,
      serviceMain: join(root, 'dist', 'main.js'),
      serviceNodeArgs: [],
      logLevel: 'info',
      serviceEnv: { DATABASE_LISTEN_URL: db.url },
    }
    const direct: ServerOptions = { ...options, databaseUrl: db.url, serviceEnv: {} }
    const results: Results = {}
    let seed = 0
    for (let round = 0; round < settings.rounds; round++) {
      for (const layout of settings.layouts) {
        const count = layout === 'direct' ? 1 : layout
        await withTopology(count, layout === 'direct' ? direct : options, async (t) => {
          for (const e of ENDPOINTS) {
            await measure(t, bouncer!, admin, db!, e.load, 1, ++seed + 1000)
            const figures = await measure(t, bouncer!, admin, db!, e.load, settings.seconds, ++seed)
            ;((results[e.label] ??= {})[layout] ??= []).push(figures)
            const cpu = figures.service + figures.nginx + figures.pgbouncer + figures.postgres + figures.rest
            log(
              `round ${round + 1}/${settings.rounds}, ` +
                (layout === 'direct' ? '1 instance without PgBouncer' : `${count} instance(s)`) +
                `, ${e.label}: ${figures.rps.toFixed(0)} req/s, ` +
                `${cpu.toFixed(0)} ` +
                `µs CPU/req in all, failed ${figures.failed}`,
            )
          }
        })
      }
    }
    const text = [
      `## Through nginx and PgBouncer: 1, 2 and 3 ` +
        `instances, ${new Date().toISOString().slice(0, 16).replace('T', ' ')} UTC`,
      '',
      `wrk (1 thread, ${settings.connections} connections) → nginx (deploy/nginx.conf) → instances (dist/main.js, a ` +
        `pool of ${settings.pool} each, through ${bouncer.version} in transaction mode) → PostgreSQL; ` +
        `${settings.rows.toLocaleString('en')} users and ` +
        `products; ${settings.rounds} rounds ` +
        `of ${settings.seconds} s per endpoint and instance count, each after 1 s of warm-up; median (min–max). ` +
        'CPU µs/req: utime + stime of each part over the run ÷ successful responses; "the rest" is the machine\'s ' +
        "busy time less the parts (wrk, the kernel's loopback, everything else); cores busy: the machine's busy time " +
        "÷ the run's length.",
      '',
      table(results),
      '',
    ].join('\n')
    process.stdout.write('\n' + text + '\n')
    writeFileSync(
      join(outDir, `topology-${new Date().toISOString().replace(/[:.]/g, '-').slice(0, 19)}.md`),
      text + '\n',
    )
  } finally {
    await bouncer?.stop()
    if (db) await dropBenchDatabase(admin, db.name).catch(() => {})
    await admin.end({ timeout: 5 })
  }
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.stack : err)
  process.exit(1)
})
