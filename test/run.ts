import { spawnSync } from 'node:child_process'
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { connect } from '../src/core/db/connect.js'
import { startLocalCluster } from '../src/dev/local-cluster.js'
import { migrate } from '../src/core/db/migrate.js'
import { createCertificateAuthority } from './helpers/certificates.js'

// The test harness behind `make test`. It creates a migrated template database
// for this run on the server of DATABASE_URL (or the local cluster), runs every
// test file with `node --test` (each file copies the template into a database
// of its own), and drops all of them afterwards, pass or fail. It also makes the
// run's certificate authority, which every test process trusts (servers over
// HTTPS the service must trust, like the OpenID provider, get certificates from
// it): Node reads NODE_EXTRA_CA_CERTS only when it starts.

const FILE_TIMEOUT_MS = 180_000
const FILES_AT_ONCE = 3

const serverUrl = process.env.DATABASE_URL ?? startLocalCluster()
const template = `upa_test_${Date.now().toString(36)}_${process.pid}`
const admin = connect(serverUrl, { max: 1, statementTimeoutMs: 60_000 })
const caDir = mkdtempSync(join(tmpdir(), 'upa-test-ca-'))

async function withTemplate(): Promise<number> {
  await admin`CREATE DATABASE ${admin(template)}`
  const url = new URL(serverUrl)
  url.pathname = `/${template}`
  const db = connect(url.toString(), { max: 1, statementTimeoutMs: 60_000 })
  await migrate(db)
  await db.end({ timeout: 5 })

  const ca = createCertificateAuthority(caDir)
  // Authorities the caller already trusts this way (a proxy's, say) stay trusted.
  const trusted = join(caDir, 'trusted.pem')
  const inherited = process.env.NODE_EXTRA_CA_CERTS ? readFileSync(process.env.NODE_EXTRA_CA_CERTS, 'utf8') + '\n' : ''
  writeFileSync(trusted, inherited + readFileSync(ca.cert, 'utf8'))

  const only = process.argv.slice(2)
  const files = only.length ? only : readdirSync('test').filter((f) => f.endsWith('.test.ts')).sort().map((f) => `test/${f}`)
  // A file that has not finished in FILE_TIMEOUT_MS fails (its process killed) instead of holding the run until CI gives up.
  // Three files at a time on two cores: most of a file's time is spent waiting (time-outs, expiries,
  // other processes), so a third file fills the cores; a fourth makes the files with timing bounds compete.
  const result = spawnSync(process.execPath, ['--import', 'tsx', '--test', `--test-concurrency=${FILES_AT_ONCE}`, `--test-timeout=${FILE_TIMEOUT_MS}`, ...files], {
    stdio: 'inherit',
    env: { ...process.env, TEST_SERVER_URL: serverUrl, TEST_TEMPLATE_DB: template, NODE_EXTRA_CA_CERTS: trusted, TEST_CA_CERT: ca.cert, TEST_CA_KEY: ca.key },
  })
  return result.status ?? 1
}

let status = 1
try {
  status = await withTemplate()
} finally {
  rmSync(caDir, { recursive: true, force: true })
  const leftovers = await admin<Array<{ datname: string }>>`SELECT datname FROM pg_database WHERE datname LIKE ${template + '%'}`
  for (const { datname } of leftovers) await admin`DROP DATABASE IF EXISTS ${admin(datname)} WITH (FORCE)`
  await admin.end({ timeout: 5 })
}
process.exit(status)
