import { request as httpRequest, type IncomingMessage } from 'node:http'
import { request as httpsRequest } from 'node:https'
import { isIP, type LookupFunction } from 'node:net'
import { urlOrigin } from '../lib/url-origin.js'

// One request the service makes to someone else's HTTP server (a webhook or
// the mail hook: a POST; the identity provider's keys: a GET whose answer is
// kept), and what came of it, bounded in every way a receiver could
// hold the service up: one time-out from the start of the attempt to the end
// of the answer's body (connect, TLS, headers, body), at most so many bytes
// of the answer read, no redirect followed (node:http never follows one: a
// 3xx is a failed attempt, and only the origin of where it points is said).
// Sent with node:http(s) rather than the global fetch: fetch (undici)
// resolves and connects by itself, and a caller that must check the address
// actually connected to (the webhooks' SSRF policy) does so with `lookup`. A
// fresh connection per attempt (`agent: false`): a pooled socket would skip
// that lookup, and attempts are minutes apart anyway.
//
// The outcome's `error` is written so that it may be logged and shown to an
// admin: it never holds the request's body, the answer's body, or anything
// of a URL but its origin (a path or query may carry a credential).

export interface OutboundRequest {
  url: URL
  headers: Record<string, string>
  /** What a POST sends. */
  body?: string
  /** Default POST; a GET sends no body. */
  method?: 'GET' | 'POST'
  /** Keep the answer's body (at most maxResponseBytes) in the outcome's `body`. */
  keepBody?: boolean
  /** From the start of the attempt to the end of the answer's body. */
  timeoutMs: number
  /** Bytes of the answer's body read at most; then the connection is closed. */
  maxResponseBytes: number
  /** Ends the attempt at once (the service is stopping); the outcome then has `aborted`. */
  signal?: AbortSignal
  /**
   * Resolves the host instead of the system's resolver; it may fail
   * with a LookupRefusal. Not consulted for an address literal.
   */
  lookup?: LookupFunction
}

export interface OutboundOutcome {
  /** The receiver's HTTP status; undefined when there was no answer. */
  status: number | undefined
  durationMs: number
  /** Why the attempt failed, or what was cut short; undefined for a clean 2xx. */
  error: string | undefined
  /** A 2xx status: the receiver took the request (even if its answer was then cut short). */
  ok: boolean
  /** Cut short by `signal`: nothing is known of the receiver's answer. */
  aborted?: boolean
  /** The answer's body, whole, with `keepBody` and an answer that came complete within its bounds. */
  body?: Buffer
  /** The answer's headers, when there was an answer. */
  headers?: IncomingMessage['headers']
}

/**
 * A `lookup` declining to hand over an address; its message is safe to show (the outcome says `refused: <message>`).
 */
export class LookupRefusal extends Error {}

export function requestOnce(options: OutboundRequest): Promise<OutboundOutcome> {
  const started = performance.now()
  const { url } = options
  return new Promise<OutboundOutcome>((resolve) => {
    let settled = false
    let answer: Pick<OutboundOutcome, 'body' | 'headers'> = {}
    const finish = (status: number | undefined, error: string | undefined, aborted = false) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      options.signal?.removeEventListener('abort', abort)
      req.destroy()
      const outcome: OutboundOutcome = {
        status,
        durationMs: Math.round(performance.now() - started),
        error,
        ok: status !== undefined && status >= 200 && status < 300,
        ...answer,
      }
      resolve(aborted ? { ...outcome, aborted } : outcome)
    }
    const send = url.protocol === 'https:' ? httpsRequest : httpRequest
    const method = options.method ?? 'POST'
    const req = send(url, {
      method,
      headers:
        method === 'GET'
          ? options.headers
          : { ...options.headers, 'content-length': String(Buffer.byteLength(options.body ?? '')) },
      agent: false,
      lookup: options.lookup,
    })
    const timer = setTimeout(
      () => finish(undefined, `no complete answer within ${options.timeoutMs} ms`),
      options.timeoutMs,
    )
    const abort = () => finish(undefined, 'the service stopped during the attempt', true)
    if (options.signal?.aborted) abort()
    options.signal?.addEventListener('abort', abort, { once: true })
    req.on('error', (err: NodeJS.ErrnoException) =>
      finish(
        undefined,
        err instanceof LookupRefusal ? `refused: ${err.message}` : describeNetworkError(err, hostOf(url)),
      ),
    )
    req.on('response', (res: IncomingMessage) => {
      const status = res.statusCode!
      const redirect =
        status >= 300 && status < 400
          ? `redirect to ${urlOrigin(String(res.headers.location ?? ''), url) ?? 'an unreadable location'} not followed`
          : undefined
      const failed = status >= 300 ? (redirect ?? `the receiver answered ${status}`) : undefined
      let read = 0
      const chunks: Buffer[] = []
      answer = { headers: res.headers }
      res.on('data', (chunk: Buffer) => {
        read += chunk.length
        if (read > options.maxResponseBytes)
          finish(
            status,
            [failed, `the answer exceeded ${options.maxResponseBytes} bytes; the rest was not read`]
              .filter(Boolean)
              .join('; '),
          )
        else if (options.keepBody) chunks.push(chunk)
      })
      res.on('end', () => {
        if (options.keepBody) answer = { ...answer, body: Buffer.concat(chunks) }
        finish(status, failed)
      })
      // After 'end' this finds the attempt settled; before it, the receiver cut its answer short.
      const brokeOff = () => finish(status, [failed, 'the answer broke off'].filter(Boolean).join('; '))
      res.on('error', brokeOff)
      res.on('close', brokeOff)
    })
    req.end(method === 'GET' ? undefined : (options.body ?? ''))
  })
}

/** A URL's host without the brackets of an IPv6 literal. */
export const hostOf = (url: URL): string => url.hostname.replace(/^\[(.*)\]$/, '$1')

function describeNetworkError(err: NodeJS.ErrnoException, host: string): string {
  switch (err.code) {
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
      return `${host} does not resolve`
    case 'ECONNREFUSED':
      return 'connection refused'
    case 'ECONNRESET':
      return 'connection reset by the receiver'
    case 'EHOSTUNREACH':
    case 'ENETUNREACH':
      return 'the receiver is unreachable'
    default:
      // TLS failures (an expired or mismatched certificate) carry codes
      // such as CERT_HAS_EXPIRED: worth showing as they are.
      return err.code ? `${err.code}${isIP(host) ? '' : ` (${host})`}` : 'the connection failed'
  }
}
