import { execFileSync, spawnSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { existsSync, mkdirSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

// A PostgreSQL cluster of the project's own for development and tests, used
// when DATABASE_URL is unset. It lives in .data/ (ignored by git), survives
// between runs, and listens only on a Unix socket in its own folder, so it
// cannot collide with any other PostgreSQL on the machine.
//
// PostgreSQL refuses to run as root. As root (a container, a CI runner) we do
// what the official postgres image does: hand the cluster's folders to the
// unprivileged `postgres` user (or `nobody`) and run the server tools as it.
// That account must be able to reach the folders: a checkout in root's home
// (mode 0700) or in a `mktemp -d` folder is closed to it, and initdb would
// fail there. The cluster then lives in a folder of its own under /var/tmp,
// named after the checkout's path, so each checkout still has one cluster.

export const projectRoot = fileURLToPath(new URL('../../', import.meta.url))
export const dataRoot = join(projectRoot, '.data')
const DEV_DATABASE = 'users_products_dev'
/** Where a checkout the server's account cannot enter keeps its cluster (survives reboots, unlike /tmp). */
export const OUTSIDE_ROOT = '/var/tmp'

export class LocalClusterError extends Error {}

const missingBinaries = `PostgreSQL server binaries (initdb, pg_ctl, postgres) were not found.
Either install them:
  Debian/Ubuntu:  apt-get install postgresql        (any version from 13; 15 is tested)
  Fedora/RHEL:    dnf install postgresql-server
  macOS:          brew install postgresql@15
and, if they are not in /usr/lib/postgresql/<version>/bin or on PATH, set PG_BIN to their folder;
or set DATABASE_URL to an existing server, e.g. DATABASE_URL=postgres://user:password@host:5432/dbname`

/**
 * The folder of the PostgreSQL server's programs (initdb, pg_ctl, postgres; beside them psql, pg_dump, pg_restore of
 * the same version).
 */
export function findBinaries(): string {
  const has = (dir: string) => ['initdb', 'pg_ctl', 'postgres'].every((b) => existsSync(join(dir, b)))
  const candidates: string[] = []
  if (process.env.PG_BIN) candidates.push(process.env.PG_BIN)
  for (const base of ['/usr/lib/postgresql', '/usr/local/opt', '/opt/homebrew/opt']) {
    if (!existsSync(base)) continue
    const versions = readdirSync(base).filter((d) => /^(postgresql@)?[0-9]+$/.test(d))
    versions.sort((a, b) => Number(b.replace(/\D/g, '')) - Number(a.replace(/\D/g, '')))
    candidates.push(...versions.map((v) => join(base, v, 'bin')))
  }
  candidates.push('/usr/local/pgsql/bin', ...(process.env.PATH ?? '').split(':').filter(Boolean))
  const found = candidates.find(has)
  if (!found) throw new LocalClusterError(missingBinaries)
  return found
}

/** As root, the unprivileged account the server runs as; otherwise undefined (run as ourselves). */
function serverAccount(): string | undefined {
  if (process.getuid?.() !== 0) return undefined
  for (const user of ['postgres', 'nobody']) {
    if (spawnSync('id', ['-u', user]).status === 0) return user
  }
  throw new LocalClusterError(
    'Running as root, and neither a "postgres" nor a "nobody" account exists to run PostgreSQL as. Create one ' +
      '(useradd -r postgres) or set DATABASE_URL.',
  )
}

const checkoutKey = () => createHash('sha256').update(projectRoot).digest('hex').slice(0, 12)

/** Whether `account` can reach the checkout (search permission on it and every folder above). */
function canReach(account: string, dir: string): boolean {
  return spawnSync('runuser', ['-u', account, '--', 'test', '-x', dir]).status === 0
}

/** The folder holding the cluster (`pg`) and, when its path is short enough, its socket (`run`). */
export function clusterHome(account: string | undefined): string {
  if (!account || canReach(account, projectRoot)) return dataRoot
  return join(OUTSIDE_ROOT, `users-products-api-${checkoutKey()}`)
}

// A Unix socket path must fit in 107 bytes; a deep checkout gets one under the temp folder instead.
function socketDir(home: string): string {
  const inHome = join(home, 'run')
  if (inHome.length <= 80) return inHome
  return join(tmpdir(), `upa-${checkoutKey()}`)
}

function run(
  bin: string,
  tool: string,
  args: string[],
  account: string | undefined,
): { status: number | null; output: string } {
  const [cmd, argv] = account ? ['runuser', ['-u', account, '--', join(bin, tool), ...args]] : [join(bin, tool), args]
  const result = spawnSync(cmd, argv, { encoding: 'utf8' })
  return {
    status: result.status,
    output: `${result.stdout ?? ''}${result.stderr ?? ''}${result.error ? String(result.error) : ''}`,
  }
}

/** Connection URL of the server (maintenance database); initializes and starts it when needed. */
export function startLocalCluster(): string {
  const bin = findBinaries()
  const account = serverAccount()
  const home = clusterHome(account)
  const clusterDir = join(home, 'pg')
  const sockets = socketDir(home)
  const log = join(sockets, 'postgres.log')
  // 0755: the server's account passes through it to its own folders (0700).
  mkdirSync(home, { recursive: true, mode: 0o755 })
  for (const dir of [clusterDir, sockets]) {
    mkdirSync(dir, { recursive: true, mode: 0o700 })
    if (account) execFileSync('chown', [`${account}:`, dir])
  }
  if (!existsSync(join(clusterDir, 'PG_VERSION'))) {
    // Trust authentication is safe here only because the socket folder is
    // private (mode 0700) and no TCP port is opened.
    const init = run(
      bin,
      'initdb',
      ['-D', clusterDir, '-U', 'postgres', '--auth=trust', '--encoding=UTF8', '--no-locale', '--no-instructions'],
      account,
    )
    if (init.status !== 0) throw new LocalClusterError(`initdb failed:\n${init.output}`)
  }
  if (run(bin, 'pg_ctl', ['status', '-D', clusterDir], account).status !== 0) {
    // Non-durable, as PostgreSQL's documentation advises for data that can be made again (14.5): a
    // commit does not wait for the disk, and a checkpoint (every DROP DATABASE forces one) writes to the
    // OS cache instead of waiting on fsync, which under a test run's writes took up to 39 s. A crash of
    // the machine may lose or damage this cluster: `make clean` and start again.
    const durability = '-c fsync=off -c synchronous_commit=off -c full_page_writes=off'
    const options =
      `-c listen_addresses='' -c ` + `unix_socket_directories='${sockets}' -c max_connections=200 ${durability}`
    const start = run(bin, 'pg_ctl', ['start', '-D', clusterDir, '-w', '-t', '60', '-l', log, '-o', options], account)
    // Another `make` may have started it a moment ago.
    if (start.status !== 0 && run(bin, 'pg_ctl', ['status', '-D', clusterDir], account).status !== 0) {
      throw new LocalClusterError(`PostgreSQL did not start (log: ${log}):\n${start.output}`)
    }
  }
  return `postgres://postgres@localhost/postgres?host=${encodeURIComponent(sockets)}`
}

export function stopLocalCluster(): string {
  const account = serverAccount()
  const clusterDir = join(clusterHome(account), 'pg')
  if (!existsSync(join(clusterDir, 'PG_VERSION'))) return 'No local cluster.'
  const result = run(findBinaries(), 'pg_ctl', ['stop', '-D', clusterDir, '-m', 'fast', '-w'], account)
  return result.status === 0 ? 'Local PostgreSQL stopped.' : 'Local PostgreSQL was not running.'
}

/** Stops the cluster and deletes it when it lives outside the checkout (`make clean` deletes .data/ itself). */
export function removeLocalCluster(): string {
  const stopped = stopLocalCluster()
  const home = clusterHome(serverAccount())
  if (home === dataRoot) return stopped
  rmSync(home, { recursive: true, force: true })
  return `${stopped} Removed ${home}.`
}

/**
 * The role the service connects as in development, made by the script that
 * makes it in production (deploy/postgres/runtime-role.psql): it may read and
 * write the tables, not change the schema, so that code needing more (a
 * TRUNCATE, a temporary table) fails here first rather than in production.
 */
export const DEV_RUNTIME_ROLE = 'users_products_runtime'

export interface LocalDatabase {
  /** As DEV_RUNTIME_ROLE: what the service connects as (DATABASE_URL's part). */
  url: string
  /** As the cluster's superuser, the database's owner: migrations and the commands (DATABASE_MIGRATION_URL's part). */
  ownerUrl: string
}

/** The development database on the local cluster, created on first use, with its runtime role. */
export async function localDevelopmentDatabase(): Promise<LocalDatabase> {
  const serverUrl = startLocalCluster()
  const { connect } = await import('../core/db/connect.js')
  const sql = connect(serverUrl, { max: 1, statementTimeoutMs: 30_000 })
  try {
    const [exists] = await sql`SELECT 1 FROM pg_database WHERE datname = ${DEV_DATABASE}`
    if (!exists) await sql`CREATE DATABASE ${sql(DEV_DATABASE)}`
  } finally {
    await sql.end({ timeout: 5 })
  }
  const ownerUrl = serverUrl.replace('/postgres?', `/${DEV_DATABASE}?`)
  // On every start (idempotent, some 50 ms): also a database made before the role existed gets it.
  const script = join(projectRoot, 'deploy/postgres/runtime-role.psql')
  const granted = spawnSync(
    join(findBinaries(), 'psql'),
    ['--no-psqlrc', '--quiet', '-d', ownerUrl, '-v', `runtime_role=${DEV_RUNTIME_ROLE}`, '-f', script],
    { encoding: 'utf8' },
  )
  if (granted.status !== 0)
    throw new LocalClusterError(
      `Could not give the development database its runtime role (psql ` +
        `-f ${script}):\n${granted.stderr}${granted.error ?? ''}`,
    )
  return { url: ownerUrl.replace('postgres://postgres@', `postgres://${DEV_RUNTIME_ROLE}@`), ownerUrl }
}

// `tsx src/dev/local-cluster.ts start|stop|url` for the Makefile.
if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const command = process.argv[2]
  try {
    if (command === 'stop') console.log(stopLocalCluster())
    else if (command === 'remove') console.log(removeLocalCluster())
    else if (command === 'start') console.log(`Local PostgreSQL is running: ${startLocalCluster()}`)
    else if (command === 'url') {
      // It connects (to create the database), so it refuses an unpatched driver as the service does (src/start.ts).
      const [{ assertDriverPatched }, { PATCH_SCRIPT, patchProblem }] = await Promise.all([
        import('../core/db/driver-check.js'),
        import('../../src/driver-patch/postgres.mjs'),
      ])
      assertDriverPatched({ problem: patchProblem, script: PATCH_SCRIPT })
      console.log((await localDevelopmentDatabase()).ownerUrl)
    } else throw new LocalClusterError('usage: local-cluster start|stop|remove|url')
  } catch (err) {
    console.error(err instanceof LocalClusterError ? err.message : err)
    process.exit(1)
  }
}
