import { request as httpRequest, type IncomingHttpHeaders, type IncomingMessage } from 'node:http'
import { connect } from 'node:net'
import type { Sql } from 'postgres'
import type { TestServer } from './server.js'

// A small Server-Sent Events client for tests: one raw HTTP request (no
// agent, so every stream has its own connection), the HTML standard's
// parsing of fields, events and comments, and what a client can see of the
// connection's end: a complete chunked body, or a cut.

export interface SseEvent {
  id: string | undefined
  event: string | undefined
  data: string
}

export interface SseOptions {
  headers?: Record<string, string>
  /** Keep only a count and the last event, for many streams at once. */
  light?: boolean
}

export class SseClient {
  readonly events: SseEvent[] = []
  readonly comments: string[] = []
  retry: number | undefined
  count = 0
  last: SseEvent | undefined
  /** The body's text when the answer is not a stream (a problem). */
  text = ''
  /** Resolves when the response is over: `clean` when its body ended properly, false when the connection was cut. */
  readonly ended: Promise<{ clean: boolean }>
  private pending = ''
  private current: { id?: string; event?: string; data: string[] } = { data: [] }
  private readonly watchers = new Set<() => void>()

  private constructor(
    readonly res: IncomingMessage,
    private readonly light: boolean,
  ) {
    res.setEncoding('utf8')
    const stream = /^text\/event-stream/.test(res.headers['content-type'] ?? '')
    res.on('data', (chunk: string) => {
      if (stream) this.feed(chunk)
      else this.text += chunk
      this.notify()
    })
    this.ended = new Promise((resolve) => {
      res.once('end', () => resolve({ clean: true }))
      res.once('error', () => resolve({ clean: false }))
      res.once('aborted', () => resolve({ clean: false }))
    })
    void this.ended.then(() => this.notify())
  }

  static open(url: string, path: string, options: SseOptions = {}): Promise<SseClient> {
    return new Promise((resolve, reject) => {
      const req = httpRequest(
        url + path,
        { agent: false, headers: { accept: 'text/event-stream', ...options.headers } },
        (res) => resolve(new SseClient(res, options.light ?? false)),
      )
      req.once('error', reject)
      req.end()
    })
  }

  get status(): number {
    return this.res.statusCode!
  }

  get headers(): IncomingHttpHeaders {
    return this.res.headers
  }

  get ids(): number[] {
    return this.events.map((e) => Number(e.id))
  }

  /** Resolves once `ready()` holds; rejects after `timeoutMs`, or when the stream ends first. */
  waitFor(ready: () => boolean, timeoutMs = 5000, what = 'condition'): Promise<void> {
    if (ready()) return Promise.resolve()
    return new Promise((resolve, reject) => {
      let ended = false
      void this.ended.then(() => (ended = true))
      const check = () => {
        if (ready()) finish()
        else if (ended) finish(new Error(`stream ended before ${what}`))
      }
      const finish = (err?: Error) => {
        clearTimeout(timer)
        this.watchers.delete(check)
        if (err) reject(err)
        else resolve()
      }
      const timer = setTimeout(
        () => finish(new Error(`timed out waiting for ${what} (${this.count} events)`)),
        timeoutMs,
      )
      this.watchers.add(check)
    })
  }

  /** How the response ended, or undefined when it has not ended within `ms` (no timer is left behind either way). */
  async endedWithin(ms: number): Promise<{ clean: boolean } | undefined> {
    let timer: NodeJS.Timeout | undefined
    const late = new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), ms)))
    try {
      return await Promise.race([this.ended, late])
    } finally {
      clearTimeout(timer)
    }
  }

  waitForEvents(n: number, timeoutMs = 5000): Promise<void> {
    return this.waitFor(() => this.count >= n, timeoutMs, `${n} events`)
  }

  /** Leaves, as a client closing its connection does. */
  close(): void {
    this.res.destroy()
  }

  private notify(): void {
    for (const check of [...this.watchers]) check()
  }

  // The standard's line rules: CRLF, LF or CR end a line; a blank line dispatches the event.
  private feed(chunk: string): void {
    const text = this.pending + chunk
    const lines = text.split(/\r\n|\n|\r/)
    this.pending = lines.pop()!
    for (const line of lines) this.line(line)
  }

  private line(line: string): void {
    if (line === '') return this.dispatch()
    if (line.startsWith(':')) {
      if (!this.light) this.comments.push(line.slice(1).trim())
      return
    }
    const colon = line.indexOf(':')
    const field = colon === -1 ? line : line.slice(0, colon)
    let value = colon === -1 ? '' : line.slice(colon + 1)
    if (value.startsWith(' ')) value = value.slice(1)
    if (field === 'data') this.current.data.push(value)
    else if (field === 'id') this.current.id = value
    else if (field === 'event') this.current.event = value
    else if (field === 'retry' && /^[0-9]+$/.test(value)) this.retry = Number(value)
  }

  private dispatch(): void {
    const { id, event, data } = this.current
    this.current = { data: [] }
    if (data.length === 0) return
    const e: SseEvent = { id, event, data: data.join('\n') }
    this.count++
    this.last = e
    if (!this.light) this.events.push(e)
  }
}

/**
 * Sends bytes as they are (what fetch refuses to send: a NUL in
 * a header) and returns the answer's status line and body.
 */
export function rawRequest(url: string, bytes: string | Buffer): Promise<{ statusLine: string; text: string }> {
  const { hostname, port } = new URL(url)
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname)
    const chunks: Buffer[] = []
    let failure: Error | undefined
    socket.on('data', (d) => chunks.push(d))
    // A server that answers before reading all of a request (a header over the limit) and then closes
    // resets the connection when the rest arrives (RFC 9112, 9.6): the answer came first and is what counts.
    socket.on('error', (err) => (failure = err))
    socket.on('close', () => {
      const text = Buffer.concat(chunks).toString('latin1')
      if (!text && failure) return reject(failure)
      resolve({ statusLine: text.split('\r\n', 1)[0]!, text })
    })
    socket.setTimeout(10_000, () => socket.destroy())
    socket.end(bytes)
  })
}

/** Writes `count` events of about `bytes` each straight into the outbox, faster than any API write could. */
export async function insertEvents(sql: Sql, count: number, bytes = 100): Promise<void> {
  await sql`
    INSERT INTO event_outbox (type, subject_type, subject_id, data)
    SELECT 'product.updated', 'product', g, json_build_object('id', g, 'pad', repeat('x', ${bytes}))
    FROM generate_series(1, ${count}) AS g`
}

/**
 * The id of the newest event, once everything committed has been published: a stream that starts after it gets what
 * comes next.
 */
export async function newestEventId(server: TestServer): Promise<number> {
  await server.published()
  return (await server.sql<[{ id: number }]>`SELECT coalesce(max(id), 0)::bigint AS id FROM events`)[0].id
}
