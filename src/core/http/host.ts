import type { IncomingMessage } from 'node:http'
import { isIPv6 } from 'node:net'
import { HttpError } from './problem.js'

// RFC 9112 §3.2: a server answers 400 to an HTTP/1.1 request without Host, and
// to any request with more than one Host line or a Host that is not
// uri-host [ ":" port ] (RFC 9110 §7.2, RFC 3986 §3.2.2). Node keeps the first
// of two Host lines in `headers` and drops the other, so what a proxy in front
// routed by and what the service reads could differ: the lines are counted in
// `rawHeaders`, which the parser fills anyway. A request costs one pass over
// its header names and one test of a short value.

// IP-literal (IPv6 checked by isIPv6, IPvFuture by shape) or reg-name (IPv4 is one), then an optional port.
const HOST =
  /^(?:\[([0-9A-Fa-f:.]+)\]|\[v[0-9A-Fa-f]+\.[\w\-.~!$&'()*+,;=:]+\]|(?:[\w\-.~!$&'()*+,;=]|%[0-9A-Fa-f]{2})*)(?::([0-9]{0,5}))?$/

/** Whether `value` is a Host header's value: uri-host [ ":" port ], the port at most 65535. */
export function validHost(value: string): boolean {
  const m = HOST.exec(value)
  if (!m) return false
  if (m[1] !== undefined && !isIPv6(m[1])) return false
  return m[2] === undefined || Number(m[2]) <= 65_535
}

/** Throws 400 `invalid_request` unless the request has one valid Host, or (HTTP/1.0) none. */
export function requireHost(req: IncomingMessage): void {
  const raw = req.rawHeaders
  let host: string | undefined
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!
    if (name.length === 4 && (name === 'Host' || name === 'host' || name.toLowerCase() === 'host')) {
      if (host !== undefined) throw new HttpError('invalid_request', 'A request must carry one Host header, not more.')
      host = raw[i + 1]!
    }
  }
  if (host === undefined) {
    if (req.httpVersionMajor === 1 && req.httpVersionMinor >= 1)
      throw new HttpError('invalid_request', 'An HTTP/1.1 request must carry a Host header.')
  } else if (!validHost(host)) {
    throw new HttpError('invalid_request', 'The Host header must be a host name or address and an optional port.')
  }
}
