import { request as httpRequest, type IncomingMessage } from 'node:http'
import { request as httpsRequest } from 'node:https'
import { isIP, type LookupFunction } from 'node:net'
import { urlOrigin } from '../lib/url-origin.js'

// One POST the service makes to someone else's HTTP server (a webhook, the
// mail hook), and what came of it, bounded in every way a receiver could
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

export interface PostOptions {
  url: URL
  headers: Record<string, string>
  body: string
  /** From the start of the attempt to the end of the answer's body. */
  timeoutMs: number
  /** Bytes of the answer's body read at most; then the connection is closed. */
  maxResponseBytes: number
  /** Ends the attempt at once (the service is stopping); the outcome then has `aborted`. */
  signal?: AbortSignal
  /** Resolves the host instead of the system's resolver; it may fail with a LookupRefusal. Not consulted for an address literal. */
  lookup?: LookupFunction
}

export interface PostOutcome {
  /** The receiver's HTTP status; undefined when there was no answer. */
  status: number | undefined
  durationMs: number
  /** Why the attempt failed, or what was cut short; undefined for a clean 2xx. */
  error: string | undefined
  /** A 2xx status: the receiver took the request (even if its answer was then cut short). */
  ok: boolean
  /** Cut short by `signal`: nothing is known of the receiver's answer. */
  aborted?: boolean
}

/** A `lookup` declining to hand over an address; its message is safe to show (the outcome says `refused: <message>`). */
export class LookupRefusal extends Error {}

export function postOnce(options: PostOptions): Promise<PostOutcome> {
  const started = performance.now()
  const { url } = options
  return new Promise<PostOutcome>((resolve) => {
    let settled = false
    const finish = (status: number | undefined, error: string | undefined, aborted = false) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      options.signal?.removeEventListener('abort', abort)
      req.destroy()
      const outcome: PostOutcome = { status, durationMs: Math.round(performance.now() - started), error, ok: status !== undefined && status >= 200 && status < 300 }
      resolve(aborted ? { ...outcome, aborted } : outcome)
    }
    const send = url.protocol === 'https:' ? httpsRequest : httpRequest
    const req = send(url, {
      method: 'POST',
      headers: { ...options.headers, 'content-length': String(Buffer.byteLength(options.body)) },
      agent: false,
      lookup: options.lookup,
    })
    const timer = setTimeout(() => finish(undefined, `no complete answer within ${options.timeoutMs} ms`), options.timeoutMs)
    const abort = () => finish(undefined, 'the service stopped during the attempt', true)
    if (options.signal?.aborted) abort()
    options.signal?.addEventListener('abort', abort, { once: true })
    req.on('error', (err: NodeJS.ErrnoException) => finish(undefined, err instanceof LookupRefusal ? `refused: ${err.message}` : describeNetworkError(err, hostOf(url))))
    req.on('response', (res: IncomingMessage) => {
      const status = res.statusCode!
      const redirect = status >= 300 && status < 400 ? `redirect to ${urlOrigin(String(res.headers.location ?? ''), url) ?? 'an unreadable location'} not followed` : undefined
      const failed = status >= 300 ? redirect ?? `the receiver answered ${status}` : undefined
      let read = 0
      res.on('data', (chunk: Buffer) => {
        read += chunk.length
        if (read > options.maxResponseBytes) finish(status, [failed, `the answer exceeded ${options.maxResponseBytes} bytes; the rest was not read`].filter(Boolean).join('; '))
      })
      res.on('end', () => finish(status, failed))
      // After 'end' this finds the attempt settled; before it, the receiver cut its answer short.
      const brokeOff = () => finish(status, [failed, 'the answer broke off'].filter(Boolean).join('; '))
      res.on('error', brokeOff)
      res.on('close', brokeOff)
    })
    req.end(options.body)
  })
}

/** A URL's host without the brackets of an IPv6 literal. */
export const hostOf = (url: URL): string => url.hostname.replace(/^\[(.*)\]$/, '$1')

function describeNetworkError(err: NodeJS.ErrnoException, host: string): string {
  switch (err.code) {
    case 'ENOTFOUND': case 'EAI_AGAIN': return `${host} does not resolve`
    case 'ECONNREFUSED': return 'connection refused'
    case 'ECONNRESET': return 'connection reset by the receiver'
    case 'EHOSTUNREACH': case 'ENETUNREACH': return 'the receiver is unreachable'
    default:
      // TLS failures (an expired or mismatched certificate) carry codes such as CERT_HAS_EXPIRED: worth showing as they are.
      return err.code ? `${err.code}${isIP(host) ? '' : ` (${host})`}` : 'the connection failed'
  }
}
