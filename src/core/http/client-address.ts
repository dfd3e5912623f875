import type { IncomingMessage } from 'node:http'
import { isIP } from 'node:net'

// The client's address. X-Forwarded-For is written by every proxy on the way
// and by the client itself, so only the entries added by proxies we trust can
// be believed. Walking from the socket's peer leftwards:
// - TRUST_PROXY=n: the n-th address from the right, the peer counting as the
//   last hop. When the header has fewer addresses than that, or one of them is
//   not an IP address, the request did not come through the proxies as
//   configured and entries further left may be the client's own writing: the
//   peer is used;
// - a list of proxy addresses: the right-most address that is not a listed
//   proxy. An entry that is not an IP address stops the walk at the proxy
//   right of it; a chain of proxies only gives the left-most.
// A client that rotates the header only changes entries we never read.

/** Proxy addresses in the one spelling `clientAddress` compares (made by `trustedProxies`). */
export type ProxyList = ReadonlySet<string> & { readonly [normalizedBrand]: true }
declare const normalizedBrand: unique symbol
export type TrustProxy = number | ProxyList

/** The configured proxy addresses, normalized once when the configuration is read rather than per request. */
export function trustedProxies(addresses: Iterable<string>): ProxyList {
  return new Set([...addresses].map((a) => normalize(a) ?? a)) as ReadonlySet<string> as ProxyList
}

export function clientAddress(req: IncomingMessage, trust: TrustProxy): string {
  const peer = normalize(req.socket.remoteAddress ?? '') ?? ''
  if (trust === 0) return peer
  const header = req.headers['x-forwarded-for']
  const forwarded = (Array.isArray(header) ? header.join(',') : (header ?? '')).split(',')
  if (typeof trust === 'number') {
    const entry = forwarded.length - trust
    return (
      (entry >= 0 && forwarded.slice(entry).every((e) => normalize(e) !== undefined) && normalize(forwarded[entry]!)) ||
      peer
    )
  }
  let address = peer
  for (let i = forwarded.length - 1; i >= 0 && trust.has(address); i--) {
    const next = normalize(forwarded[i]!)
    if (next === undefined) return address
    address = next
  }
  return address
}

/**
 * Says once, when a request carries X-Forwarded-For while TRUST_PROXY is 0,
 * that the header is not believed: behind a proxy that adds it, the operator
 * probably forgot TRUST_PROXY, and every client then shares the proxy's
 * address for rate limits, login throttling and logs. A client may send the
 * header itself, hence a warning and not an error. Once per instance (one
 * per process); afterwards, and with TRUST_PROXY set, it costs one boolean.
 */
export class UntrustedForwardingNotice {
  private pending: boolean

  constructor(
    trust: TrustProxy,
    private readonly warn: (message: string, fields: Record<string, unknown>) => void,
  ) {
    this.pending = trust === 0
  }

  check(req: IncomingMessage): void {
    if (!this.pending || req.headers['x-forwarded-for'] === undefined) return
    this.pending = false
    this.warn('X-Forwarded-For is ignored: TRUST_PROXY is 0', {
      hint:
        "behind a proxy, every client counts as the proxy's address for rate limits, login throttling and logs; " +
        'set TRUST_PROXY to the proxy hops (or addresses) in front of the service',
      peer: normalize(req.socket.remoteAddress ?? '') ?? null,
    })
  }
}

/**
 * One spelling per address, or undefined when `text` is not one: ports go
 * (`1.2.3.4:5678`, `[::1]:80`), as do IPv6 zone ids; `::ffff:1.2.3.4` (IPv4
 * on a dual-stack socket) is `1.2.3.4`; hex digits are lower case.
 */
function normalize(text: string): string | undefined {
  let address = text.trim().toLowerCase()
  const bracketed = /^\[([^\]]+)\](?::[0-9]{1,5})?$/.exec(address)
  if (bracketed) address = bracketed[1]!
  else if (/^[0-9.]+:[0-9]{1,5}$/.test(address)) address = address.slice(0, address.indexOf(':'))
  address = address.replace(/%[0-9a-z._-]+$/, '')
  if (address.startsWith('::ffff:') && isIP(address.slice(7)) === 4) address = address.slice(7)
  return isIP(address) ? address : undefined
}

/**
 * The rate-limit bucket of an address. An IPv6 client usually owns a whole
 * /64 and could rotate through it to escape a per-address limit (and flood
 * the limiter's table), so IPv6 addresses count by their /64 prefix.
 */
export function addressBucket(address: string): string {
  if (!address.includes(':')) return `address ${address}`
  const [head = '', tail = ''] = address.split('::')
  const left = head ? head.split(':') : []
  const right = tail ? tail.split(':') : []
  const groups = address.includes('::') ? [...left, ...Array(8 - left.length - right.length).fill('0'), ...right] : left
  return `address ${groups
    .slice(0, 4)
    .map((g) => g.toLowerCase().replace(/^0+(?=.)/, ''))
    .join(':')}::/64`
}
