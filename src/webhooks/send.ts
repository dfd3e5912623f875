import type { LookupFunction } from 'node:net'
import { LookupRefusal, requestOnce, type OutboundOutcome } from '../core/http/outbound.js'
import { refusalOfAddresses, refusalOfUrl, type Resolver, type UrlPolicy } from './address-policy.js'

// One POST of a webhook, and what came of it: src/core/http/outbound.ts
// sends it (time-out, bounded answer, no redirect); this adds where a
// webhook may go (address-policy.ts). The URL's shape is checked first, and
// a custom `lookup` resolves the name, checks every address and hands the
// socket only checked ones, so nothing can change between the check and the
// connect (DNS rebinding).

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

export type SendOutcome = OutboundOutcome

export function sendWebhook(options: SendOptions): Promise<SendOutcome> {
  const refused = (error: string): Promise<SendOutcome> =>
    Promise.resolve({ status: undefined, durationMs: 0, error, ok: false })
  let url: URL
  try {
    url = new URL(options.url)
  } catch {
    return refused('the URL is not valid')
  }
  // Checked again at every delivery: WEBHOOK_ALLOW_PRIVATE or WEBHOOK_ALLOWED_PORTS
  // may have changed since registration.
  const refusal = refusalOfUrl(url, options.policy)
  if (refusal) return refused(`refused: the URL ${refusal}`)
  const { headers, body, timeoutMs, maxResponseBytes, signal } = options
  return requestOnce({
    url,
    headers,
    body,
    timeoutMs,
    maxResponseBytes,
    signal,
    // A literal address never reaches `lookup` (net connects to it directly); refusalOfUrl checked it above.
    lookup: options.policy.webhookAllowPrivate ? undefined : checkedLookup(options.resolve),
  })
}

/** A `lookup` for net.connect that resolves with `resolve` and passes on only addresses that pass the policy. */
function checkedLookup(resolve: Resolver): LookupFunction {
  return (hostname, options, callback) => {
    resolve(hostname).then(
      (addresses) => {
        const refusal = refusalOfAddresses(hostname, addresses)
        if (refusal) return callback(new LookupRefusal(refusal), '', 0)
        const wanted =
          options.family === 4 || options.family === 6
            ? addresses.filter((a) => a.family === options.family)
            : addresses
        if (options.all) return (callback as unknown as (err: null, all: typeof wanted) => void)(null, wanted)
        const first = wanted[0]
        if (!first) return callback(new LookupRefusal(`${hostname} has no IPv${options.family} address`), '', 0)
        callback(null, first.address, first.family)
      },
      (err: NodeJS.ErrnoException) => callback(err, '', 0),
    )
  }
}
