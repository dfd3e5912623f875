import { appendFileSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { constants, tmpdir } from 'node:os'
import { join, relative, resolve } from 'node:path'
import { connect } from '../src/core/db/connect.js'
import { projectRoot, startLocalCluster } from '../src/dev/local-cluster.js'
import { migrate } from '../src/core/db/migrate.js'
import { createCertificateAuthority } from './helpers/certificates.js'
import { fileReport, outcomeOf, runSummary, type FileOutcome } from './harness/report.js'
import { buildService } from './harness/build.js'
import { runFile } from './harness/run-file.js'
import { inLanes, longestFirst, readTimings, saveTimings } from './harness/schedule.js'

// The test harness behind `make test`: `node --import tsx test/run.ts [files...]` (all files without
// arguments). It builds dist/ (test/harness/build.ts), creates a migrated template database for this run on
// the server of DATABASE_URL (or the local cluster), runs each test file in a process of its own (each file
// copies the template into databases of its own, named with a prefix of the file's), drops a file's databases
// once it has ended, while others run, and whatever is left at the end, pass or fail, interrupted or not. It
// also makes the run's certificate authority, which every test process trusts (servers over HTTPS the service must
// trust, like the OpenID provider, get certificates from it): Node reads NODE_EXTRA_CA_CERTS only when it
// starts. With TEST_FAILURES_FILE set, each failed test is appended to that file as a line (test/repeat.ts
// counts them over several runs).

// A file that has not finished in FILE_TIMEOUT_MS fails (its processes killed) instead of holding the run
// until CI gives up.
const FILE_TIMEOUT_MS = 180_000
// Three files at a time on two cores: most of a file's time is spent waiting (time-outs, expiries,
// other processes), so a third file fills the cores; a fourth makes the files with timing bounds compete.
const FILES_AT_ONCE = 3
const TIMINGS_NAME = '.data/test-times.json'
const OUTPUT_DIR = join(projectRoot, '.data', 'test-output')
const TIMINGS_FILE = join(projectRoot, TIMINGS_NAME)
const TEST_FOLDERS = ['test', 'test/harness']

const interruption = new AbortController()
let interruptedBy: NodeJS.Signals | undefined
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (!interruptedBy) console.log(`\n${signal}: ending the running files, then cleaning up`)
    interruptedBy ??= signal
    interruption.abort()
  })
}

const serverUrl = process.env.DATABASE_URL ?? startLocalCluster()
const template = `upa_test_${Date.now().toString(36)}_${process.pid}`
const admin = connect(serverUrl, { max: 1, statementTimeoutMs: 60_000 })
const caDir = mkdtempSync(join(tmpdir(), 'upa-test-ca-'))

function testFiles(): string[] {
  const only = process.argv.slice(2)
  if (only.length) return only.map((file) => relative(projectRoot, resolve(file)))
  return TEST_FOLDERS.flatMap((dir) =>
    readdirSync(join(projectRoot, dir))
      .filter((f) => f.endsWith('.test.ts'))
      .map((f) => `${dir}/${f}`),
  )
}

async function migratedTemplate(): Promise<void> {
  await admin`CREATE DATABASE ${admin(template)}`
  const url = new URL(serverUrl)
  url.pathname = `/${template}`
  const db = connect(url.toString(), { max: 1, statementTimeoutMs: 60_000 })
  await migrate(db)
  await db.end({ timeout: 5 })
}

async function withTemplate(): Promise<boolean> {
  await Promise.all([buildService(projectRoot), migratedTemplate()])

  const ca = createCertificateAuthority(caDir)
  // Authorities the caller already trusts this way (a proxy's, say) stay trusted.
  const trusted = join(caDir, 'trusted.pem')
  const extra = process.env.NODE_EXTRA_CA_CERTS
  const inherited = extra ? readFileSync(extra, 'utf8') + '\n' : ''
  writeFileSync(trusted, inherited + readFileSync(ca.cert, 'utf8'))
  const env = {
    ...process.env,
    TEST_SERVER_URL: serverUrl,
    TEST_TEMPLATE_DB: template,
    NODE_EXTRA_CA_CERTS: trusted,
    TEST_CA_CERT: ca.cert,
    TEST_CA_KEY: ca.key,
  }

  mkdirSync(OUTPUT_DIR, { recursive: true })
  const files = longestFirst(testFiles(), readTimings(TIMINGS_FILE))
  console.log(`${files.length} files, ${FILES_AT_ONCE} at a time, longest first by the times in ${TIMINGS_NAME}`)
  const started = performance.now()
  const failuresFile = process.env.TEST_FAILURES_FILE
  const outcomes = await inLanes(
    files,
    FILES_AT_ONCE,
    interruption.signal,
    async (file, index): Promise<FileOutcome> => {
      const prefix = `${template}_${index}_`
      const options = {
        env: { ...env, TEST_DATABASE_PREFIX: prefix },
        timeoutMs: FILE_TIMEOUT_MS,
        signal: interruption.signal,
      }
      const outcome = outcomeOf(file, await runFile(join(projectRoot, file), options), FILE_TIMEOUT_MS)
      // One after another on the one admin connection, in the background: the lane goes on to its next file.
      drops = drops.then(() => dropDatabases(prefix)).then((n) => void (droppedEarly += n))
      console.log(fileReport(outcome))
      // Every file's whole TAP, with each test's duration_ms, for a look at where a file spends its time.
      writeFileSync(join(OUTPUT_DIR, file.replaceAll('/', '_') + '.tap'), outcome.stdout)
      if (failuresFile) appendFileSync(failuresFile, outcome.failureLines.map((line) => line + '\n').join(''))
      return outcome
    },
  )
  const finished = outcomes.filter((o) => !o.aborted)
  saveTimings(TIMINGS_FILE, Object.fromEntries(finished.map((o) => [o.file, Math.round(o.seconds * 10) / 10])))
  console.log(runSummary(finished, (performance.now() - started) / 1000, files.length - finished.length))
  return finished.length === files.length && finished.every((o) => o.passed)
}

let drops: Promise<unknown> = Promise.resolve()
let droppedEarly = 0

/** Drops the databases whose names start with `prefix` (their connections ended): how many. */
async function dropDatabases(prefix: string): Promise<number> {
  const names = await admin<
    Array<{ datname: string }>
  >`SELECT datname FROM pg_database WHERE starts_with(datname, ${prefix})`
  for (const { datname } of names) await admin`DROP DATABASE IF EXISTS ${admin(datname)} WITH (FORCE)`
  return names.length
}

let passed = false
try {
  passed = await withTemplate()
} finally {
  rmSync(caDir, { recursive: true, force: true })
  const dropping = performance.now()
  await drops.catch((err: unknown) => console.log(`dropping a file's databases failed: ${String(err)}`))
  const atEnd = await dropDatabases(template)
  console.log(
    `dropped ${droppedEarly} databases as their files ended, ` +
      `and ${atEnd} at the end in ${((performance.now() - dropping) / 1000).toFixed(1)} s`,
  )
  await admin.end({ timeout: 5 })
}
process.exit(interruptedBy ? 128 + constants.signals[interruptedBy] : passed ? 0 : 1)
