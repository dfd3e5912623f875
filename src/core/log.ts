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

/** `every`: fields of every line (a worker's number), after `msg`. */
export function createLogger(
  level: LogLevel,
  write: (line: string) => void = (line) => process.stdout.write(line),
  every?: LogFields,
): Logger {
  const threshold = rank[level]
  const at = (lvl: LogLevel) => (msg: string, fields?: LogFields) => {
    if (rank[lvl] < threshold) return
    write(JSON.stringify({ time: new Date().toISOString(), level: lvl, msg, ...every, ...fields }) + '\n')
  }
  return { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') }
}

/**
 * A sink for stdout that writes what was logged within `delayMs` together,
 * rather than one write(2) per request line. At most 64 KiB wait; `flush`
 * writes what waits at once (the entry point calls it on exit, so the last
 * lines, a fatal error's included, are not lost; a SIGKILL loses at most
 * `delayMs` of them).
 *
 * With `atomicBytes`, each write is at most that long and ends at a line's
 * end (but for a single longer line): processes that share one pipe (the
 * workers of src/cluster/) must write at most PIPE_BUF bytes at a time, which
 * the kernel keeps whole, or their lines could interleave mid-line.
 */
export function batchedWriter(
  write: (text: string) => void,
  delayMs = 20,
  atomicBytes = Infinity,
): { write(line: string): void; flush(): void } {
  let pending = ''
  let timer: NodeJS.Timeout | undefined
  const flush = () => {
    clearTimeout(timer)
    timer = undefined
    while (pending !== '') {
      const end = atomicEnd(pending, atomicBytes)
      write(pending.slice(0, end))
      pending = pending.slice(end)
    }
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

/**
 * Where the first write of `text` ends: all of it when it fits in `bytes`, else the most whole lines that do (at least
 * one line).
 */
function atomicEnd(text: string, bytes: number): number {
  if (text.length <= bytes && Buffer.byteLength(text) <= bytes) return text.length
  // A UTF-16 unit is at most 3 bytes of UTF-8 (a pair, 4): cut by characters, then back while too long.
  let end = text.lastIndexOf('\n', bytes - 1) + 1
  while (end > 0 && Buffer.byteLength(text.slice(0, end)) > bytes) end = text.lastIndexOf('\n', end - 2) + 1
  return end || text.indexOf('\n') + 1 || text.length
}

/**
 * What an unexpected error may contribute to a log line: its class, message and stack, never its other properties (a
 * postgres.js error carries query parameters).
 */
export function describeError(err: unknown): LogFields {
  if (err instanceof Error) return { error: err.name, error_message: err.message, stack: err.stack }
  return { error: typeof err }
}
