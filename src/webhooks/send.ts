import { request as httpRequest, type IncomingMessage } from 'node:http'
import { request as httpsRequest } from 'node:https'
import { isIP, type LookupFunction } from 'node:net'
import { urlOrigin } from '../core/lib/url-origin.js'
import { hostOf, refusalOfAddresses, refusalOfUrl, type Resolver, type UrlPolicy } from './address-policy.js'

// One POST of a webhook, and what came of it. Sent with node:http(s) rather
// than the global fetch: fetch (undici) resolves and
// connects by itself, and only undici's own Agent (a runtime dependency this
// project does not take) could be told which address to connect to. A custom
// `lookup` here resolves the name, checks every address (address-policy.ts)
// and hands the socket only checked ones, so nothing can change between the
// check and the connect (DNS rebinding). Redirects are not followed (node:http
// never does): a 3xx is a failed attempt. A fresh connection per attempt
// (`agent: false`): a pooled socket would skip the lookup and its check.

export interface SendOptions {
  url: string
  headers: Record<string, string>
  body: string
  /** WEBHOOK_ALLOW_PRIVATE and WEBHOOK_ALLOWED_PORTS. */
  policy: UrlPolicy
  resolve: Resolver
  /** From the start of the attempt to the end of the answer's body (connect, TLS, headers, body). */
  timeoutMs: number
  /** Bytes of the answer's body read at most; then the connection is closed. */
  maxResponseBytes: number
  /** Ends the attempt at once (the service is stopping); the outcome then has `aborted`. */
  signal?: AbortSignal
}

export interface SendOutcome {
  /** The receiver's HTTP status; undefined when there was no answer. */
  status: number | undefined
  durationMs: number
  /** Why the attempt failed, or what was cut short; undefined for a clean 2xx. */
  error: string | undefined
  ok: boolean
  /** Cut short by `signal`: nothing is known of the receiver's answer. */
  aborted?: boolean
}

/** An error whose message is safe to record for an admin (no stack, no internals). */
class Refused extends Error {}

export function sendWebhook(options: SendOptions): Promise<SendOutcome> {
  const started = performance.now()
  const done = (status: number | undefined, error: string | undefined): SendOutcome => ({
    status,
    durationMs: Math.round(performance.now() - started),
    error,
    ok: status !== undefined && status >= 200 && status < 300,
  })
  let url: URL
  try {
    url = new URL(options.url)
  } catch {
    return Promise.resolve(done(undefined, 'the URL is not valid'))
  }
  // Checked again at every delivery: WEBHOOK_ALLOW_PRIVATE or WEBHOOK_ALLOWED_PORTS may have changed since registration.
  const refusal = refusalOfUrl(url, options.policy)
  if (refusal) return Promise.resolve(done(undefined, `refused: the URL ${refusal}`))

  return new Promise<SendOutcome>((resolve) => {
    let settled = false
    const finish = (status: number | undefined, error: string | undefined, aborted = false) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      options.signal?.removeEventListener('abort', abort)
      req.destroy()
      resolve(aborted ? { ...done(status, error), aborted } : done(status, error))
    }
    const send = url.protocol === 'https:' ? httpsRequest : httpRequest
    const req = send(url, {
      method: 'POST',
      headers: { ...options.headers, 'content-length': String(Buffer.byteLength(options.body)) },
      agent: false,
      // A literal address never reaches `lookup` (net connects to it directly); refusalOfUrl checked it above.
      lookup: options.policy.webhookAllowPrivate ? undefined : checkedLookup(options.resolve),
    })
    const timer = setTimeout(() => finish(undefined, `no complete answer within ${options.timeoutMs} ms`), options.timeoutMs)
    const abort = () => finish(undefined, 'the service stopped during the attempt', true)
    if (options.signal?.aborted) abort()
    options.signal?.addEventListener('abort', abort, { once: true })
    req.on('error', (err: NodeJS.ErrnoException) => finish(undefined, err instanceof Refused ? `refused: ${err.message}` : describeNetworkError(err, hostOf(url))))
    req.on('response', (res: IncomingMessage) => {
      const status = res.statusCode!
      // Only the origin of where it points: the path or query may be a credential, and this text is logged and shown (last_error).
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

/** A `lookup` for net.connect that resolves with `resolve` and passes on only addresses that pass the policy. */
function checkedLookup(resolve: Resolver): LookupFunction {
  return (hostname, options, callback) => {
    resolve(hostname).then(
      (addresses) => {
        const refusal = refusalOfAddresses(hostname, addresses)
        if (refusal) return callback(new Refused(refusal), '', 0)
        const wanted = options.family === 4 || options.family === 6 ? addresses.filter((a) => a.family === options.family) : addresses
        if (options.all) return (callback as unknown as (err: null, all: typeof wanted) => void)(null, wanted)
        const first = wanted[0]
        if (!first) return callback(new Refused(`${hostname} has no IPv${options.family} address`), '', 0)
        callback(null, first.address, first.family)
      },
      (err: NodeJS.ErrnoException) => callback(err, '', 0),
    )
  }
}

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
