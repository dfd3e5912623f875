import { spawn, spawnSync } from 'node:child_process'
import { chownSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { superviseChild } from './child-process.js'
import { onFreePorts, PortTaken } from './ports.js'
import { installedProgram } from './programs.js'

// A real PgBouncer (Debian's package, 1.18; `make test` installs it when
// missing) in transaction mode, in front of the run's database server
// (TEST_SERVER_URL, test/run.ts): every database of that server under its
// own name, on a free loopback port, with pools smaller than the service's
// so that server connections are shared for real. It refuses to run as
// root, so as root it runs as the account the local cluster runs as
// (`postgres`, or `nobody`), switched to by its own `-u`. Stopped in `after`
// of the test file that starts it.

export interface PgBouncer {
  port: number
  /** Its process (for CPU figures). */
  pid: number
  /** What `pgbouncer --version` says first, e.g. "PgBouncer 1.18.0". */
  version: string
  /** The URL of `databaseUrl`'s database (a URL of TEST_SERVER_URL's server) through PgBouncer. */
  urlFor(databaseUrl: string): string
  /** What PgBouncer logged (stderr). */
  log(): string
  /** Immediate shutdown (SIGTERM); resolves when it has exited. */
  stop(): Promise<void>
}

export interface PgBouncerOptions {
  /** Server connections per database and user (default_pool_size). */
  poolSize?: number
  /**
   * The role every connection logs in as, on both sides (default: the server URL's user); the server must trust it on
   * its socket.
   */
  user?: string
}

/** As root, the account PgBouncer runs as (as src/dev/local-cluster.ts chooses for PostgreSQL). */
function account(): string | undefined {
  if (process.getuid?.() !== 0) return undefined
  const user = ['postgres', 'nobody'].find((u) => spawnSync('id', ['-u', u]).status === 0)
  if (!user) throw new Error('running as root without a postgres or nobody account for PgBouncer to run as')
  return user
}

/** A value of a [databases] entry, quoted (PgBouncer's src/loader.c: a quote is doubled; a backslash is no escape). */
const value = (v: string) => `'${v.replaceAll("'", "''")}'`

/** PgBouncer in front of the run's database server, stopped when the test file's tests are done. */
export async function startPgBouncer(options: PgBouncerOptions = {}): Promise<PgBouncer> {
  const serverUrl = process.env.TEST_SERVER_URL
  if (!serverUrl)
    throw new Error('Run the tests with `make test` (test/run.ts names the database server in TEST_SERVER_URL).')
  const bouncer = await launchPgBouncer(serverUrl, options)
  after(bouncer.stop)
  return bouncer
}

/** PgBouncer in front of the server of `serverUrl`, outside a test (the benchmark): the caller stops it. */
export async function launchPgBouncer(
  serverUrl: string,
  { poolSize = 3, user: asUser }: PgBouncerOptions = {},
): Promise<PgBouncer> {
  const server = new URL(serverUrl)
  const user = asUser ?? (decodeURIComponent(server.username) || 'postgres')
  const target = [
    `host=${value(server.searchParams.get('host') ?? server.hostname)}`,
    `port=${server.port || 5432}`,
    `user=${value(user)}`,
    ...(server.password && !asUser ? [`password=${value(decodeURIComponent(server.password))}`] : []),
  ].join(' ')
  const runAs = account()
  const dir = mkdtempSync(join(tmpdir(), 'upa-pgbouncer-'))
  writeFileSync(join(dir, 'users.txt'), `"${user}" ""\n`)
  const owner = runAs && {
    uid: Number(spawnSync('id', ['-u', runAs], { encoding: 'utf8' }).stdout),
    gid: Number(spawnSync('id', ['-g', runAs], { encoding: 'utf8' }).stdout),
  }
  const started = onFreePorts(1, async ([port]): Promise<PgBouncer> => {
    const ini = `[databases]
* = ${target}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = ${port}
unix_socket_dir =
auth_type = trust
auth_file = ${join(dir, 'users.txt')}
pool_mode = transaction
default_pool_size = ${poolSize}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
ignore_startup_parameters =
`
    writeFileSync(join(dir, 'pgbouncer.ini'), ini)
    if (owner) for (const file of ['', 'pgbouncer.ini', 'users.txt']) chownSync(join(dir, file), owner.uid, owner.gid)
    const args = [...(runAs ? ['-u', runAs] : []), join(dir, 'pgbouncer.ini')]
    const child = spawn(installedProgram('pgbouncer'), args, { stdio: ['ignore', 'ignore', 'pipe'] })
    let stderr = ''
    child.stderr.setEncoding('utf8').on('data', (text: string) => (stderr += text))
    const supervised = superviseChild(child)
    const stop = async () => {
      await supervised.stop()
      rmSync(dir, { recursive: true, force: true })
    }
    // It says when it listens: then the port is its own.
    for (const deadline = Date.now() + 30_000; !stderr.includes(`listening on 127.0.0.1:${port}`);) {
      if (!supervised.running() && /Address already in use/.test(stderr)) throw new PortTaken(stderr)
      if (!supervised.running() || Date.now() > deadline) {
        await stop()
        throw new Error(`PgBouncer did not start on port ${port}:\n${stderr}`)
      }
      await sleep(20)
    }
    return {
      port: port!,
      pid: child.pid!,
      version: spawnSync(installedProgram('pgbouncer'), ['--version'], { encoding: 'utf8' })
        .stdout.split('\n')[0]!
        .trim(),
      urlFor(databaseUrl) {
        const database = new URL(databaseUrl).pathname
        return `postgres://${encodeURIComponent(user)}@127.0.0.1:${port}${database}`
      },
      log: () => stderr,
      stop,
    }
  })
  return started.catch((err: unknown) => {
    rmSync(dir, { recursive: true, force: true })
    throw err
  })
}
