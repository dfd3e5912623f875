import { lookup } from 'node:dns/promises'
import { isIP } from 'node:net'
import type { Config } from '../config.js'
import { hostOf } from '../core/http/outbound.js'
import { addressList } from '../core/lib/address-list.js'

// Where a webhook may be sent (server-side request forgery). Unless
// WEBHOOK_ALLOW_PRIVATE=true, a URL must be https, and every address its host
// stands for must be a public one: never this host, its link-local metadata
// service (169.254.169.254), a private or carrier-grade NAT network, or a
// multicast group. The rule is applied when a webhook is registered (an early,
// clear answer) and again on every delivery to the address actually connected
// to (src/webhooks/send.ts), since a name can resolve elsewhere later (DNS
// rebinding). Userinfo is refused always: credentials do not belong in a URL
// that admins read back from the API.
//
// IPv6 forms that carry an IPv4 address to a translator or relay: where the
// position of the IPv4 address is fixed (IPv4-mapped, NAT64's well-known
// 64:ff9b::/96, 6to4's 2002::/16) that address is judged by the IPv4 rules,
// so a public one is reachable (an IPv6-only host sees every IPv4 name
// through DNS64 as 64:ff9b::a.b.c.d). Where it is not fixed, or the form is
// not routed on the internet, the whole prefix is refused: the rest of
// 64:ff9b::/32 (64:ff9b:1::/48 is the local-use NAT64 prefix, whose
// operator picks where the IPv4 address goes), SIIT's ::ffff:0:0:0/96,
// IPv4-compatible ::/96 and Teredo's 2001::/32 (a client and a server
// address, one of them inverted).
//
// Ports: the URL's port must be 443 unless WEBHOOK_ALLOWED_PORTS lists it, so
// webhooks cannot probe which ports of a public host answer. With
// WEBHOOK_ALLOW_PRIVATE=true (tests, closed networks) scheme, address and
// port are the operator's to trust.

const blocked = addressList([
  ['0.0.0.0', 8, 'ipv4'], // "this network", 0.0.0.0 included
  ['10.0.0.0', 8, 'ipv4'],
  ['100.64.0.0', 10, 'ipv4'], // carrier-grade NAT
  ['127.0.0.0', 8, 'ipv4'],
  ['169.254.0.0', 16, 'ipv4'],
  ['172.16.0.0', 12, 'ipv4'],
  ['192.0.0.0', 24, 'ipv4'], // IETF protocol assignments
  ['192.168.0.0', 16, 'ipv4'],
  ['198.18.0.0', 15, 'ipv4'], // benchmarking
  ['224.0.0.0', 4, 'ipv4'], // multicast
  ['240.0.0.0', 4, 'ipv4'], // reserved, and the broadcast address
  ['::', 128, 'ipv6'], // unspecified
  ['::1', 128, 'ipv6'],
  ['::', 96, 'ipv6'], // IPv4-compatible (deprecated) forms
  ['::ffff:0:0:0', 96, 'ipv6'], // SIIT's IPv4-translated addresses
  ['2001::', 32, 'ipv6'], // Teredo
  ['100::', 64, 'ipv6'], // discard-only
  ['fc00::', 7, 'ipv6'], // unique local
  ['fe80::', 10, 'ipv6'],
  ['fec0::', 10, 'ipv6'], // site-local (deprecated)
  ['ff00::', 8, 'ipv6'], // multicast
])
// An IPv4-mapped IPv6 address (::ffff:127.0.0.1, ::ffff:7f00:1) is matched against the IPv4 rules.

/** Whether an address literal (v4 or v6) is one a webhook may never reach without WEBHOOK_ALLOW_PRIVATE. */
export function isForbiddenAddress(address: string): boolean {
  const family = isIP(address)
  if (family === 0) return true
  if (family === 4) return blocked.check(address, 'ipv4')
  if (blocked.check(address, 'ipv6')) return true
  const groups = hextets(address.replace(/%.*$/, ''))
  if (!groups) return true
  const nat64 = groups[0] === 0x64 && groups[1] === 0xff9b
  const wellKnownNat64 = nat64 && groups.slice(2, 6).every((g) => g === 0)
  // 64:ff9b::/32 outside the well-known /96 (local-use 64:ff9b:1::/48):
  // where the IPv4 address sits is the operator's choice.
  if (nat64 && !wellKnownNat64) return true
  const embedded = wellKnownNat64
    ? quad(groups[6]!, groups[7]!)
    : groups[0] === 0x2002
      ? quad(groups[1]!, groups[2]!)
      : undefined
  return embedded !== undefined && blocked.check(embedded, 'ipv4')
}

/**
 * Two 16-bit groups as a dotted IPv4 address: what a NAT64 translator or a 6to4 relay would carry the connection on to.
 */
const quad = (hi: number, lo: number) => `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`

/** The eight 16-bit groups of an IPv6 literal (checked by isIP already), a dotted IPv4 tail included. */
function hextets(address: string): number[] | undefined {
  const dotted = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(address)
  const text = dotted
    ? address.slice(0, dotted.index) +
      `${((+dotted[1]! << 8) | +dotted[2]!).toString(16)}:${((+dotted[3]! << 8) | +dotted[4]!).toString(16)}`
    : address
  const [head, tail] = text.split('::') as [string, string | undefined]
  const parse = (part: string | undefined) => (part ? part.split(':').map((h) => parseInt(h, 16)) : [])
  const left = parse(head)
  const right = parse(tail)
  const groups = tail === undefined ? left : [...left, ...Array(8 - left.length - right.length).fill(0), ...right]
  return groups.length === 8 ? groups : undefined
}

export interface ResolvedAddress {
  address: string
  family: number
}
/** Every address of a host name, as `dns.lookup(name, { all: true })` gives them; tests inject their own. */
export type Resolver = (hostname: string) => Promise<ResolvedAddress[]>

export const systemResolver: Resolver = (hostname) => lookup(hostname, { all: true, verbatim: true })

/** Where a webhook may be sent: WEBHOOK_ALLOW_PRIVATE and WEBHOOK_ALLOWED_PORTS. */
export type UrlPolicy = Pick<Config, 'webhookAllowPrivate' | 'webhookAllowedPorts'>

const HTTPS_PORT = 443
/** localhost and its subdomains, which always mean loopback (RFC 6761), with or without the root's dot. */
const LOCALHOST = /^(.+\.)?localhost\.?$/i

/** Why a URL is refused by its shape alone (scheme, userinfo, port, a literal address), or undefined. */
export function refusalOfUrl(url: URL, policy: UrlPolicy): string | undefined {
  const allowPrivate = policy.webhookAllowPrivate
  if (url.protocol !== 'https:' && !(allowPrivate && url.protocol === 'http:')) {
    return allowPrivate
      ? 'must be an http or https URL'
      : 'must be an https URL (http needs WEBHOOK_ALLOW_PRIVATE=true)'
  }
  if (url.username || url.password) return 'must not carry a user name or password'
  if (url.hash) return 'must not carry a fragment'
  const host = hostOf(url)
  if (!host) return 'must name a host'
  if (allowPrivate) return undefined
  // The address before the port: whoever points a webhook at a local receiver needs to hear of WEBHOOK_ALLOW_PRIVATE.
  if (isIP(host) && isForbiddenAddress(host))
    return (
      `must not point at a loopback, link-local, private or reserved address ` +
      `(${host}) unless WEBHOOK_ALLOW_PRIVATE=true`
    )
  if (LOCALHOST.test(host)) return `must not point at ${host}, a loopback name, unless WEBHOOK_ALLOW_PRIVATE=true`
  // The URL parser leaves the port empty when it is the scheme's default.
  const port = url.port === '' ? HTTPS_PORT : Number(url.port)
  if (port !== HTTPS_PORT && !policy.webhookAllowedPorts.has(port))
    return `must use port 443, or one WEBHOOK_ALLOWED_PORTS lists (not ${port})`
  return undefined
}

/**
 * Why a set of resolved addresses is refused: any forbidden one
 * refuses the lot (a mixed answer is how rebinding starts).
 */
export function refusalOfAddresses(host: string, addresses: readonly ResolvedAddress[]): string | undefined {
  if (addresses.length === 0) return `${host} does not resolve`
  const bad = addresses.find((a) => isForbiddenAddress(a.address))
  return bad
    ? `${host} resolves to ${bad.address}, a loopback, link-local, private or reserved address, which only ` +
        `WEBHOOK_ALLOW_PRIVATE=true allows`
    : undefined
}
