import type { FileRun } from './run-file.js'
import { parseTap, type TapCounts, type TapReport } from './tap.js'

// What the run prints: a line per file as it finishes (a failing file's whole output before it), and
// the totals, the slowest files and every failure at the end.

/** A file over this many seconds is named at the end (issue 35: no file over 20 s). */
export const SLOW_FILE_SECONDS = 20
const SLOWEST_SHOWN = 10

export interface FileOutcome extends FileRun, TapReport {
  file: string
  passed: boolean
  /** Why the file failed other than by its tests' results: its time-out, a crash, its exit code. */
  problem?: string
  /** One line per failure for the ledger: `<file> :: <suite> > <test>`, or why the file itself failed. */
  failureLines: string[]
}

export function outcomeOf(file: string, run: FileRun, timeoutMs: number): FileOutcome {
  const tap = parseTap(run.stdout)
  const passed = run.code === 0 && !run.timedOut && !run.aborted && tap.counts !== undefined && !tap.failures.length
  const problem = run.aborted
    ? undefined
    : run.timedOut
      ? `killed: still running after ${timeoutMs / 1000} s`
      : !tap.counts
        ? `crashed: ${exitOf(run)} before its summary`
        : !passed && !tap.failures.length
          ? `${exitOf(run)} after its tests`
          : undefined
  const lines = run.aborted ? [] : tap.failures.map((name) => `${file} :: ${name}`)
  if (problem) lines.push(`${file} :: (${problem})`)
  return { file, ...run, ...tap, passed, problem, failureLines: lines }
}

const exitOf = (run: FileRun) => (run.signal ? `ended by ${run.signal}` : `exit code ${run.code}`)
const seconds = (s: number) => `${s.toFixed(1).padStart(5)} s`
const sum = (values: number[]) => values.reduce((a, b) => a + b, 0)
const tooSlow = (o: FileOutcome) => (o.seconds > SLOW_FILE_SECONDS ? `  (over ${SLOW_FILE_SECONDS} s)` : '')

export function fileReport(outcome: FileOutcome): string {
  const { file, counts } = outcome
  if (outcome.passed) {
    const tests = `${counts!.tests} test${counts!.tests === 1 ? '' : 's'}`
    const skipped = counts!.skipped ? `, ${counts!.skipped} skipped` : ''
    const head = `ok   ${seconds(outcome.seconds)}  ${file}  (${tests}${skipped})`
    const diagnostics = outcome.diagnostics.map((d) => `        ${d.test ? `${d.test}: ` : ''}${d.text}`)
    return [head, ...diagnostics].join('\n')
  }
  if (outcome.aborted) return `stop ${seconds(outcome.seconds)}  ${file}  (interrupted)`
  // A suite that failed in its own body or hooks is not among the summary's failed tests: count the names.
  const why = outcome.problem ?? `${outcome.failures.length} failed; ${counts!.pass} of ${counts!.tests} tests passed`
  const stderr = outcome.stderr.trim() ? `\n--- stderr of ${file} ---\n${outcome.stderr.trimEnd()}` : ''
  return [
    `=== ${file} ===`,
    outcome.stdout.trimEnd() + stderr,
    `FAIL ${seconds(outcome.seconds)}  ${file}  (${why})`,
    ...outcome.failures.map((name) => `        ${name}`),
  ].join('\n')
}

export function runSummary(outcomes: FileOutcome[], wallSeconds: number, filesNotRun: number): string {
  const total = (key: keyof TapCounts) => sum(outcomes.map((o) => o.counts?.[key] ?? 0))
  const failedFiles = outcomes.filter((o) => !o.passed).length
  const notRun = filesNotRun ? `, ${filesNotRun} not run` : ''
  const rare = (['cancelled', 'todo'] as const)
    .filter((k) => total(k))
    .map((k) => `, ${k} ${total(k)}`)
    .join('')
  const bySeconds = [...outcomes].sort((a, b) => b.seconds - a.seconds)
  const slowest = bySeconds.slice(0, SLOWEST_SHOWN).map((o) => `  ${seconds(o.seconds)}  ${o.file}${tooSlow(o)}`)
  const slow = bySeconds.filter((o) => tooSlow(o)).map((o) => o.file)
  const fileSeconds = sum(bySeconds.map((o) => o.seconds))
  const failures = outcomes.flatMap((o) => o.failureLines).map((line) => `  ${line}`)
  return [
    '',
    `files ${outcomes.length} (${outcomes.length - failedFiles} passed, ${failedFiles} failed${notRun}), ` +
      `tests ${total('tests')}, pass ${total('pass')}, fail ${total('fail')}, skipped ${total('skipped')}${rare}`,
    `wall ${wallSeconds.toFixed(1)} s (the files' own times add up to ${fileSeconds.toFixed(1)} s)`,
    'slowest files:',
    ...slowest,
    slow.length
      ? `over ${SLOW_FILE_SECONDS} s (${slow.length}): ${slow.join(', ')}`
      : `no file over ${SLOW_FILE_SECONDS} s`,
    ...(failures.length ? ['failed:', ...failures] : []),
  ].join('\n')
}
