import type { IncomingMessage } from 'node:http'

// The client's address. X-Forwarded-For is written by every proxy on the way
// and by the client itself, so only the entries added by proxies we trust can
// be believed: with TRUST_PROXY=n the address is the n-th from the right
// (counting the peer of the socket as the last hop); with a list of proxy
// addresses, the right-most address that is not one of them. A client that
// rotates the header only changes entries we never read.

export type TrustProxy = number | ReadonlySet<string>

export function clientAddress(req: IncomingMessage, trust: TrustProxy): string {
  const peer = normalize(req.socket.remoteAddress ?? '')
  if (trust === 0) return peer
  const header = req.headers['x-forwarded-for']
  const forwarded = (Array.isArray(header) ? header.join(',') : header ?? '').split(',').map((a) => normalize(a.trim())).filter(Boolean)
  const chain = [...forwarded, peer]
  if (typeof trust === 'number') return chain[Math.max(0, chain.length - 1 - trust)]!
  // The listed proxies are compared in the form given to addresses here: as
  // written (TRUST_PROXY=::ffff:10.0.0.1, or FD00::1) they never matched, and
  // every client then counted as the proxy's address.
  const proxies = normalizedList(trust)
  for (let i = chain.length - 1; i >= 0; i--) if (!proxies.has(chain[i]!)) return chain[i]!
  return chain[0]!
}

// ::ffff:1.2.3.4 (IPv4 on a dual-stack socket) and 1.2.3.4 are the same client;
// IPv6 hex digits in either case are the same address.
const normalize = (address: string) => {
  const lower = address.toLowerCase()
  return lower.startsWith('::ffff:') ? lower.slice(7) : lower
}

// The configured list is one Set for the life of the process: normalized once.
const normalizedLists = new WeakMap<ReadonlySet<string>, ReadonlySet<string>>()
function normalizedList(list: ReadonlySet<string>): ReadonlySet<string> {
  let normalized = normalizedLists.get(list)
  if (!normalized) normalizedLists.set(list, (normalized = new Set([...list].map(normalize))))
  return normalized
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
  return `address ${groups.slice(0, 4).map((g) => g.toLowerCase().replace(/^0+(?=.)/, '')).join(':')}::/64`
}
