import { isIP } from 'node:net'

// SMTP_URL: where mail goes and how the connection is protected.
//   smtp://user:password@host:587   STARTTLS, required (the default)
//   smtps://user:password@host:465  TLS from the first byte (RFC 8314)
//   smtp://127.0.0.1:25?starttls=off  plain text, only to this machine (a local relay)
// A server that does not offer STARTTLS is never written to in clear instead:
// that is the downgrade a man in the middle gets by deleting one line of the
// EHLO reply. Lines about the URL never hold it: it carries a password.

export type SmtpSecurity = 'tls' | 'starttls' | 'none'

export interface SmtpServer {
  host: string
  port: number
  security: SmtpSecurity
  /** Percent-decoded; both or neither. */
  credentials?: { user: string; password: string }
  /** The name said in EHLO (`?helo=`); the machine's host name without it. */
  helo?: string
}

const DEFAULT_PORTS = { 'smtp:': 587, 'smtps:': 465 } as const
const SHAPE = 'must be smtp://user:password@host:port (STARTTLS) or smtps://user:password@host:port (TLS)'
const HOST_NAME = /^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.?$/

/** Whether `host` is this machine: the only place a message may go in clear. */
export function isLoopback(host: string): boolean {
  if (host === 'localhost' || host === '::1') return true
  return isIP(host) === 4 && host.startsWith('127.')
}

/** Percent-decoded, or undefined for a % not followed by two hexadecimal digits. */
function decoded(part: string): string | undefined {
  try {
    return decodeURIComponent(part)
  } catch {
    return undefined
  }
}

/**
 * SMTP_URL as a server to send through, or a line saying what is wrong (for
 * `SMTP_URL: <line>`; it never repeats the URL or its password).
 */
export function parseSmtpUrl(value: string): SmtpServer | string {
  if (!URL.canParse(value)) return `${SHAPE} (it does not parse as a URL)`
  const url = new URL(value)
  if (url.protocol !== 'smtp:' && url.protocol !== 'smtps:')
    return `${SHAPE} (the scheme is ${JSON.stringify(url.protocol.slice(0, 20))})`
  const host = url.hostname.replace(/^\[(.*)\]$/, '$1')
  if (!host || (!isIP(host) && !HOST_NAME.test(host))) return `${SHAPE} (the host is missing or not a host name)`
  if (url.pathname !== '' && url.pathname !== '/')
    return `${SHAPE} (a path has no meaning here; is a / in the password not percent-encoded as %2F?)`
  if (url.hash) return `${SHAPE} (a fragment has no meaning here; is a # in the password not percent-encoded as %23?)`
  const port = url.port ? Number(url.port) : DEFAULT_PORTS[url.protocol]
  if (port === 0) return `${SHAPE} (port 0)`

  const user = decoded(url.username)
  const password = decoded(url.password)
  if (user === undefined || password === undefined) {
    return (
      'its user or password holds a % not followed by two hexadecimal digits; write a % as %25 (percent-encode ' +
      'them: encodeURIComponent)'
    )
  }
  if (Boolean(user) !== Boolean(password))
    return 'give both a user and a password (smtp://user:password@host), or neither'

  let security: SmtpSecurity = url.protocol === 'smtps:' ? 'tls' : 'starttls'
  let helo: string | undefined
  for (const [key, setting] of url.searchParams) {
    if (key === 'starttls' && setting === 'off' && security === 'starttls') {
      if (!isLoopback(host))
        return (
          '?starttls=off is allowed only for a server on this machine (localhost, 127.0.0.1, ::1): elsewhere ' +
          'the password and the messages would cross the network in clear'
        )
      security = 'none'
    } else if (key === 'helo' && HOST_NAME.test(setting)) helo = setting
    else
      return (
        `${SHAPE}, with ?starttls=off (smtp:// to this machine only) or ?helo=<host name> (the ` +
        `option ${JSON.stringify(key.slice(0, 40))} is not one of them or its value is not allowed)`
      )
  }
  return {
    host,
    port,
    security,
    ...(user && password ? { credentials: { user, password } } : {}),
    ...(helo ? { helo } : {}),
  }
}
