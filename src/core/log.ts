// One JSON object per line on stdout: what log shippers in containers expect.
// Fields are passed explicitly by callers; nothing here serializes a request
// or an error wholesale, so secrets cannot slip in by accident.

export type LogLevel = 'debug' | 'info' | 'warn' | 'error'

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
 * A sink for stdout that writes what was logged within `delayMs` together,
 * rather than one write(2) per request line. At most 64 KiB wait; `flush`
 * writes what waits at once (the entry point calls it on exit, so the last
 * lines, a fatal error's included, are not lost; a SIGKILL loses at most
 * `delayMs` of them).
 */
export function batchedWriter(write: (text: string) => void, delayMs = 20): { write(line: string): void; flush(): void } {
  let pending = ''
  let timer: NodeJS.Timeout | undefined
  const flush = () => {
    clearTimeout(timer)
    timer = undefined
    if (pending === '') return
    const text = pending
    pending = ''
    write(text)
  }
  return {
    write(line) {
      pending += line
      if (pending.length >= 65536) flush()
      else timer ??= setTimeout(flush, delayMs).unref()
    },
    flush,
  }
}

/** What an unexpected error may contribute to a log line: its class, message and stack, never its other properties (a postgres.js error carries query parameters). */
export function describeError(err: unknown): LogFields {
  if (err instanceof Error) return { error: err.name, error_message: err.message, stack: err.stack }
  return { error: typeof err }
}
