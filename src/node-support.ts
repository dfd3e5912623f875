import type { Logger } from './core/log.js'

// Which Node.js release lines still get security fixes. An end-of-life Node
// runs the service as well as before, so start-up does not refuse it; it warns
// once, so that an operator sees in the logs which line to install.

/**
 * End-of-life date of each release line, from the Node.js release schedule
 * (github.com/nodejs/Release, schedule.json), from 18 on: the ended lines that
 * still run somewhere, so that the warning gives their date. Every line older
 * than the first row ended before it did. Odd lines are short-lived (about eight
 * months), so they are here too. A line newer than the last row is taken as
 * supported; add a row when a line is released, and keep `engines` in
 * package.json and the builds of src/dev/node-line.mjs in step.
 */
export const RELEASE_LINES: ReadonlyArray<{ line: number; endOfLife: string }> = [
  { line: 18, endOfLife: '2025-04-30' },
  { line: 19, endOfLife: '2023-06-01' },
  { line: 20, endOfLife: '2026-04-30' },
  { line: 21, endOfLife: '2024-06-01' },
  { line: 22, endOfLife: '2027-04-30' },
  { line: 23, endOfLife: '2025-06-01' },
  { line: 24, endOfLife: '2028-04-30' },
  { line: 25, endOfLife: '2026-06-01' },
  { line: 26, endOfLife: '2029-04-30' },
]

/** The lines not ended on `today`, oldest first. */
export function supportedLines(today: Date): number[] {
  return RELEASE_LINES.filter((r) => !ended(r.endOfLife, today)).map((r) => r.line)
}

/**
 * Why `version` (as `process.version` gives it, "v20.19.5") should
 * be replaced on `today`, or undefined while it is supported.
 */
export function endOfLifeNotice(
  version: string,
  today: Date,
): { msg: string; fields: Record<string, unknown> } | undefined {
  const line = Number(/^v?(\d+)\./.exec(version)?.[1])
  if (!Number.isInteger(line) || line > RELEASE_LINES[RELEASE_LINES.length - 1]!.line) return undefined
  const row = RELEASE_LINES.find((r) => r.line === line)
  if (row && !ended(row.endOfLife, today)) return undefined
  // No row: a line older than the table's first, which ended before that line did (an odd line before the next even
  // one, an even line before the next even one).
  const endOfLife = row?.endOfLife ?? `before ${RELEASE_LINES[0]!.endOfLife}`
  const install = supportedLines(today)
  return {
    msg:
      `Node.js ${version} is end-of-life (ended ${endOfLife}) and gets no security fixes; install a supported ` +
      `release line (${install.join(', ')})`,
    fields: { node_version: version, end_of_life: endOfLife, supported_lines: install },
  }
}

/** At start-up: one warning when this process runs on an end-of-life Node. */
export function warnIfEndOfLife(log: Logger, version = process.version, today = new Date()): void {
  const notice = endOfLifeNotice(version, today)
  if (notice) log.warn(notice.msg, notice.fields)
}

/** A line ends at the start of its end-of-life day (UTC): the schedule gives dates, not times. */
const ended = (endOfLife: string, today: Date) => today.getTime() >= Date.parse(`${endOfLife}T00:00:00Z`)
