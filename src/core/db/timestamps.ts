// Timestamps travel as the API writes them, RFC 3339 in UTC with
// milliseconds ("2026-11-22T10:15:30.120Z"), from the driver to the socket:
// no Date is made for a row only to be turned back into text (two Date
// conversions per timestamp are a large part
// of what a page costs; bench/README.md).
//
// The pool's sessions run with TimeZone=UTC and DateStyle=ISO (connect.ts),
// so PostgreSQL writes a timestamptz as "2026-11-22 10:15:30.12+00": trailing
// zeros of the fraction dropped, no fraction at all on a whole second, up to
// six digits in a column without (3). Anything else (a year past 9999, BC,
// infinity) goes the slow way through Date.

const UTC_TEXT = /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.(\d{1,6}))?\+00$/

/** A timestamptz as PostgreSQL sent it, in the API's form. */
export function isoTimestamp(text: string): string {
  const m = UTC_TEXT.exec(text)
  if (m === null) return slowIso(text)
  const fraction = m[1] === undefined ? '000' : m[1].length >= 3 ? m[1].slice(0, 3) : m[1].padEnd(3, '0')
  return `${text.slice(0, 10)}T${text.slice(11, 19)}.${fraction}Z`
}

function slowIso(text: string): string {
  const date = new Date(text)
  return Number.isNaN(date.getTime()) ? text : date.toISOString()
}

/** A timestamp parameter: a Date or anything Date reads, sent as ISO text. */
export const timestampParameter = (value: Date | string | number): string =>
  (value instanceof Date ? value : new Date(value)).toISOString()
