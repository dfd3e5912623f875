import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { constants, tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

// The flake ledger behind `make test-repeat N=5`: `node --import tsx test/repeat.ts <runs> [files...]`
// runs test/run.ts that many times in a row, each a full run of its own (template database included),
// and then names every test that failed in any run and in how many. A test that fails in some runs
// only is a flake: the suite must pass on every run, so the ledger must be empty.

const [runsArgument = '', ...files] = process.argv.slice(2)
const runs = Number(runsArgument)
if (!Number.isInteger(runs) || runs < 1) {
  console.error('usage: node --import tsx test/repeat.ts <runs> [files...]')
  process.exit(2)
}

interface RunResult {
  seconds: number
  code: number | null
  failures: Set<string>
}

let interruptedBy: NodeJS.Signals | undefined
let current: ReturnType<typeof spawn> | undefined
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  // Ctrl-C reaches test/run.ts too; a signal sent to this process alone is passed on. Either way
  // the run cleans up (its databases, its processes) before this process reports and exits.
  process.on(signal, () => {
    interruptedBy ??= signal
    current?.kill(signal)
  })
}

const runner = fileURLToPath(new URL('run.ts', import.meta.url))
const folder = mkdtempSync(join(tmpdir(), 'upa-test-repeat-'))
const results: RunResult[] = []
try {
  for (let k = 1; k <= runs && !interruptedBy; k++) {
    console.log(`\n=== run ${k} of ${runs} ===`)
    const failuresFile = join(folder, `run-${k}.txt`)
    const started = performance.now()
    current = spawn(process.execPath, ['--import', 'tsx', runner, ...files], {
      stdio: 'inherit',
      env: { ...process.env, TEST_FAILURES_FILE: failuresFile },
    })
    const [code] = (await once(current, 'exit')) as [number | null]
    current = undefined
    if (interruptedBy) break
    const named = existsSync(failuresFile) ? readFileSync(failuresFile, 'utf8').split('\n').filter(Boolean) : []
    const failures = new Set(named)
    if (code !== 0 && failures.size === 0) failures.add(`test/run.ts :: (exit code ${code}, no failed test named)`)
    results.push({ seconds: (performance.now() - started) / 1000, code, failures })
  }
} finally {
  rmSync(folder, { recursive: true, force: true })
}

const ledger = new Map<string, number>()
for (const { failures } of results) for (const line of failures) ledger.set(line, (ledger.get(line) ?? 0) + 1)

console.log(`\n${results.length} of ${runs} runs${interruptedBy ? ` (interrupted by ${interruptedBy})` : ''}:`)
for (const [i, { seconds, failures }] of results.entries()) {
  const outcome = failures.size ? `${failures.size} failed` : 'passed'
  console.log(`  run ${i + 1}  ${seconds.toFixed(1).padStart(6)} s  ${outcome}`)
}
if (ledger.size === 0) {
  console.log(`flake ledger: empty (${results.length} runs${results.length ? ', all passed' : ''})`)
} else {
  console.log(`flake ledger (${ledger.size} tests failed at least once):`)
  const entries = [...ledger].sort(([a, m], [b, n]) => n - m || a.localeCompare(b))
  for (const [line, count] of entries) console.log(`  failed ${count} of ${results.length} runs  ${line}`)
}
process.exit(interruptedBy ? 128 + constants.signals[interruptedBy] : ledger.size ? 1 : 0)
