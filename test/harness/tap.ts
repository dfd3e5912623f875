// Reads the TAP that node:test's tap reporter writes for one file: the summary it ends with, the
// tests that failed (named through their suites), and the diagnostics tests printed. Subtests are
// indented four spaces per level; a test's YAML block sits two spaces deeper, between `---` and `...`.

export interface TapCounts {
  tests: number
  pass: number
  fail: number
  cancelled: number
  skipped: number
  todo: number
}

export interface TapDiagnostic {
  /** The test that printed it (`t.diagnostic`), when the line follows that test's result. */
  test?: string
  text: string
}

export interface TapReport {
  /** Undefined when the output ends without a summary (the process crashed or was killed). */
  counts?: TapCounts
  /** `suite > test` for every failed test; a suite that failed only through its tests is not named again. */
  failures: string[]
  diagnostics: TapDiagnostic[]
}

const INDENT = 4
const RESULT = /^( *)(ok|not ok) \d+ - (.*)$/
const SUBTEST = /^( *)# Subtest: (.*)$/
const DIAGNOSTIC = /^( *)# (.*)$/
const PLAN = /^1\.\.\d+$/
const SUMMARY = /^(tests|suites|pass|fail|cancelled|skipped|todo|duration_ms) ([\d.]+)$/
// The reporter escapes `#` and `\` in names, so the first bare `#` starts the directive.
const NAME_AND_DIRECTIVE = /^((?:[^#\\]|\\.)*?)(?: # (SKIP|TODO)\b.*)?$/i

const unescape = (name: string) => name.replace(/\\([#\\])/g, '$1')

export function parseTap(output: string): TapReport {
  const failures: string[] = []
  const diagnostics: TapDiagnostic[] = []
  const suites: string[] = []
  // failedInside[d]: a test at depth d + 1 failed since the subtest at depth d began.
  const failedInside: boolean[] = []
  let yamlEnd: string | undefined
  let lastResult: { depth: number; name: string } | undefined
  let planned = false
  let summary: Partial<Record<string, number>> | undefined

  for (const line of output.split('\n')) {
    if (yamlEnd !== undefined) {
      if (line === yamlEnd) yamlEnd = undefined
      continue
    }
    const subtest = SUBTEST.exec(line)
    if (subtest) {
      const depth = subtest[1]!.length / INDENT
      suites.length = depth
      suites.push(unescape(subtest[2]!))
      failedInside[depth] = false
      lastResult = undefined
      continue
    }
    const result = RESULT.exec(line)
    if (result) {
      const depth = result[1]!.length / INDENT
      const [, rawName = '', directive] = NAME_AND_DIRECTIVE.exec(result[3]!) ?? []
      const name = unescape(rawName)
      if (result[2] === 'not ok' && !directive) {
        if (!failedInside[depth]) failures.push([...suites.slice(0, depth), name].join(' > '))
        if (depth > 0) failedInside[depth - 1] = true
      }
      lastResult = { depth, name }
      yamlEnd = undefined
      continue
    }
    if (lastResult && line === `${' '.repeat(lastResult.depth * INDENT + 2)}---`) {
      yamlEnd = `${' '.repeat(lastResult.depth * INDENT + 2)}...`
      continue
    }
    if (PLAN.test(line)) {
      planned = true
      continue
    }
    const diagnostic = DIAGNOSTIC.exec(line)
    if (!diagnostic) continue
    const depth = diagnostic[1]!.length / INDENT
    const entry = planned && depth === 0 ? SUMMARY.exec(diagnostic[2]!) : null
    if (entry) (summary ??= {})[entry[1]!] = Number(entry[2])
    else diagnostics.push({ test: lastResult?.depth === depth ? lastResult.name : undefined, text: diagnostic[2]! })
  }

  const counts =
    summary?.tests === undefined
      ? undefined
      : {
          tests: summary.tests,
          pass: summary.pass ?? 0,
          fail: summary.fail ?? 0,
          cancelled: summary.cancelled ?? 0,
          skipped: summary.skipped ?? 0,
          todo: summary.todo ?? 0,
        }
  return { counts, failures, diagnostics }
}
