import type { LogLevel } from './config.js'

// One JSON object per line on stdout: what log shippers in containers expect.
// Fields are passed explicitly by callers; nothing here serializes a request
// or an error wholesale, so secrets cannot slip in by accident.

const rank: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 }

export type LogFields = Record<string, unknown>
export interface Logger {
  debug(msg: string, fields?: LogFields): void
  info(msg: string, fields?: LogFields): void
  warn(msg: string, fields?: LogFields): void
  error(msg: string, fields?: LogFields): void
}

export function createLogger(level: LogLevel, write: (line: string) => void = (line) => process.stdout.write(line)): Logger {
  const threshold = rank[level]
  const at = (lvl: LogLevel) => (msg: string, fields?: LogFields) => {
    if (rank[lvl] < threshold) return
    write(JSON.stringify({ time: new Date().toISOString(), level: lvl, msg, ...fields }) + '\n')
  }
  return { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') }
}

/**
 * A sink for stdout that writes the lines of one turn of the event loop
 * together: a write(2) per request line was a measurable part of what a
 * cheap request costs. At most 64 KiB wait, and never past the current turn;
 * `flush` writes what waits at once (the entry point calls it on exit, so
 * the last lines, a fatal error's included, are not lost).
 */
export function batchedWriter(write: (text: string) => void): { write(line: string): void; flush(): void } {
  let pending = ''
  let scheduled = false
  const flush = () => {
    scheduled = false
    if (pending === '') return
    const text = pending
    pending = ''
    write(text)
  }
  return {
    write(line) {
      pending += line
      if (pending.length >= 65536) flush()
      else if (!scheduled) {
        scheduled = true
        setImmediate(flush)
      }
    },
    flush,
  }
}

/** What an unexpected error may contribute to a log line: its class, message and stack, never its other properties (a postgres.js error carries query parameters). */
export function describeError(err: unknown): LogFields {
  if (err instanceof Error) return { error: err.name, error_message: err.message, stack: err.stack }
  return { error: typeof err }
}
