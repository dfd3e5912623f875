import { isIP } from 'node:net'

// A database URL read as libpq reads a connection URI (PostgreSQL's
// documentation, "Connection Strings" and "Parameter Key Words"), so that the
// URL an operator tested with psql means the same here: postgres.js reads
// URLs with the WHATWG parser, which refuses libpq's socket form
// (`postgres://user@/db?host=/run/postgresql`), and passes `sslrootcert`,
// `sslcert` and `sslkey` to the server as settings instead of using them.
//
// postgres(ql)://[user[:password]@][host][:port][,host[:port]…][/dbname][?param=value&…]
//
// Each part is percent-decoded; a host that starts with / (percent-encoded in
// the host part, %2Frun%2Fpostgresql, or given as ?host=) is the folder of a
// Unix socket. A parameter overrides the part of the same meaning (host,
// port, user, password, dbname). As libpq does, a parameter libpq does not
// know is refused: a misspelt `sslmod=verify-full` must not leave the
// connection unchecked. Of those libpq knows, the ones below that change
// nothing an operator relies on are accepted and ignored; the others are
// refused, since the service cannot do what they ask.

export const SSL_MODES = ['disable', 'allow', 'prefer', 'require', 'verify-ca', 'verify-full'] as const
export type SslMode = (typeof SSL_MODES)[number]

const TLS_VERSIONS = ['TLSv1', 'TLSv1.1', 'TLSv1.2', 'TLSv1.3'] as const
type TlsVersion = (typeof TLS_VERSIONS)[number]

const SESSION_ATTRS = ['any', 'read-write', 'read-only', 'primary', 'standby', 'prefer-standby'] as const
type SessionAttrs = (typeof SESSION_ATTRS)[number]

/** A database URL as libpq reads it. */
export interface ConnectionString {
  /** TCP: host names or addresses, each with its port in `ports`. Empty with `socket`. */
  hosts: string[]
  ports: number[]
  /** The folder of the Unix socket (`<socket>/.s.PGSQL.<port>`); TLS is never used there, as with libpq. */
  socket: string | undefined
  user: string | undefined
  password: string | undefined
  database: string | undefined
  /** As libpq applies it: `prefer` when unset, `verify-full` with sslrootcert=system. */
  sslmode: SslMode
  /** A PEM file of trusted certificate authorities, or `system`: the CAs this process trusts. */
  sslrootcert: string | undefined
  /** The client's certificate and key (PEM files), for the server's `cert` authentication. */
  sslcert: string | undefined
  sslkey: string | undefined
  /** Opens an encrypted sslkey. */
  sslpassword: string | undefined
  sslMinProtocolVersion: TlsVersion | undefined
  sslMaxProtocolVersion: TlsVersion | undefined
  applicationName: string | undefined
  /** The server's command-line options for the session (`-c name=value …`). */
  options: string | undefined
  targetSessionAttrs: SessionAttrs | undefined
}

/** What is wrong with a database URL, in words that never repeat its password. */
export class ConnectionStringError extends Error {}

/** Parameters of libpq the service accepts and does without: what they tune, it has its own answer to. */
const IGNORED: ReadonlySet<string> = new Set([
  // The service names itself (application_name is honoured).
  'fallback_application_name',
  // The pool's own time-out (5 s) and TCP keep-alive apply.
  'connect_timeout',
  'keepalives',
  'keepalives_idle',
  'keepalives_interval',
  'keepalives_count',
  'tcp_user_timeout',
  // SNI is sent for a host name, never for an address, whatever this says.
  'sslsni',
  // Obsolete: no current OpenSSL compresses.
  'sslcompression',
])

/** Parameters accepted with these values only, each the default or a mode that asks nothing of the client. */
const ACCEPTED_VALUES: Readonly<Record<string, readonly string[]>> = {
  client_encoding: ['UTF8', 'utf8', 'auto'],
  gssencmode: ['disable', 'prefer'],
  channel_binding: ['disable', 'prefer'],
  sslcertmode: ['allow'],
  sslnegotiation: ['postgres'],
  load_balance_hosts: ['disable'],
}

/** Parameters of libpq the service cannot honour, with what to do instead. */
const UNSUPPORTED: Readonly<Record<string, string>> = {
  hostaddr: 'give the address as the host (with sslmode=verify-full, a name the certificate holds)',
  passfile: 'put the password in the URL, percent-encoded, or the whole URL in DATABASE_URL_FILE',
  service: 'write the connection out in the URL',
  sslcrl: 'certificate revocation lists are not read',
  sslcrldir: 'certificate revocation lists are not read',
  sslkeylogfile: 'TLS keys are never logged',
  require_auth: 'the server decides how the role authenticates (pg_hba.conf)',
  requirepeer: 'peer checks on a Unix socket are not made',
  krbsrvname: 'GSSAPI is not supported',
  gsslib: 'GSSAPI is not supported',
  gssdelegation: 'GSSAPI is not supported',
  replication: 'a replication connection cannot serve the API',
  min_protocol_version: 'the service speaks protocol 3.0',
  max_protocol_version: 'the service speaks protocol 3.0',
  oauth_issuer: 'OAuth sign-in to PostgreSQL is not supported',
  oauth_client_id: 'OAuth sign-in to PostgreSQL is not supported',
  oauth_client_secret: 'OAuth sign-in to PostgreSQL is not supported',
  oauth_scope: 'OAuth sign-in to PostgreSQL is not supported',
}

/** Parameters read below (beside IGNORED and ACCEPTED_VALUES). */
const READ: ReadonlySet<string> = new Set([
  'host',
  'port',
  'dbname',
  'user',
  'password',
  'sslmode',
  'sslrootcert',
  'sslcert',
  'sslkey',
  'sslpassword',
  'ssl_min_protocol_version',
  'ssl_max_protocol_version',
  'application_name',
  'options',
  'target_session_attrs',
])

const BAD_ESCAPE = /%(?![0-9A-Fa-f]{2})/

/** `raw` percent-decoded; `part` names it in the message (never its value: it may be a password). */
function decode(raw: string, part: string): string {
  try {
    return decodeURIComponent(raw)
  } catch {
    throw new ConnectionStringError(
      BAD_ESCAPE.test(raw)
        ? `${part} holds a % that is not followed by two hexadecimal digits; write a % as %25 (percent-encode ` +
            'the password: encodeURIComponent)'
        : `${part} holds percent-encoded bytes that are not UTF-8`,
    )
  }
}

const NOT_A_URL = 'must be a postgres:// URL'
const USER_PART = 'its user, password or host'

function oneOf<T extends string>(name: string, value: string, allowed: readonly T[]): T {
  if ((allowed as readonly string[]).includes(value)) return value as T
  throw new ConnectionStringError(`${name} must be ${allowed.join(', ')} (got ${JSON.stringify(value)})`)
}

function portOf(raw: string): number {
  const port = /^[0-9]{1,5}$/.test(raw) ? Number(raw) : NaN
  if (!(port >= 1 && port <= 65535))
    throw new ConnectionStringError(`the port must be an integer from 1 to 65535 (got ${JSON.stringify(raw)})`)
  return port
}

/**
 * The host part: `host[:port]` or `[v6 address][:port]`, comma-separated. A
 * port that is no number is not quoted: it may be a piece of a password whose
 * `/` was not encoded.
 */
function hostList(raw: string): Array<{ host: string; port: string | undefined }> {
  if (raw === '') return []
  return raw.split(',').map((entry) => {
    const v6 = /^\[([^\]]*)\](?::(.*))?$/.exec(entry)
    if (!v6 && (entry.includes('[') || entry.includes(']')))
      throw new ConnectionStringError(`${NOT_A_URL} (an IPv6 address in its host part lacks its closing ])`)
    const colon = entry.indexOf(':')
    const [host, port] = v6
      ? [v6[1]!, v6[2]]
      : colon < 0
        ? [decode(entry, USER_PART), undefined]
        : [decode(entry.slice(0, colon), USER_PART), entry.slice(colon + 1)]
    if (port !== undefined && !/^[0-9]{1,5}$/.test(port))
      throw new ConnectionStringError(
        'the port after its host must be an integer from 1 to 65535 (percent-encode a / in the password: ' +
          'encodeURIComponent)',
      )
    return { host, port }
  })
}

/**
 * `text` read as libpq reads a connection URI, or a ConnectionStringError
 * saying what is wrong (never with the password). Nothing is read from
 * disk: `tlsOptions` (src/core/db/database-tls.ts) reads the files.
 */
export function parseConnectionString(text: string): ConnectionString {
  const scheme = /^postgres(?:ql)?:\/\//.exec(text)
  if (!scheme) throw new ConnectionStringError(NOT_A_URL)
  const rest = text.slice(scheme[0].length)
  // As libpq: the user part is whatever comes before an @ ahead of the first /, so a ? in a password needs no
  // encoding; the last such @ ends it, so that an unencoded @ in a password reads as meant too.
  const slash = rest.indexOf('/')
  const at = (slash < 0 ? rest : rest.slice(0, slash)).lastIndexOf('@')
  const userInfo = at < 0 ? undefined : rest.slice(0, at)
  const afterUser = rest.slice(at + 1)
  const hostEnd = afterUser.search(/[/?]/)
  const hostPart = hostEnd < 0 ? afterUser : afterUser.slice(0, hostEnd)
  const afterAuthority = hostEnd < 0 ? '' : afterUser.slice(hostEnd)

  const given = new Map<string, string>()
  if (userInfo !== undefined) {
    const colon = userInfo.indexOf(':')
    const user = decode(colon < 0 ? userInfo : userInfo.slice(0, colon), USER_PART)
    if (user) given.set('user', user)
    if (colon >= 0) given.set('password', decode(userInfo.slice(colon + 1), USER_PART))
  }
  const entries = hostList(hostPart)
  if (entries.some((e) => e.host)) given.set('host', entries.map((e) => e.host).join(','))
  if (entries.some((e) => e.port)) given.set('port', entries.map((e) => e.port ?? '').join(','))

  const query = afterAuthority.indexOf('?')
  const path = query < 0 ? afterAuthority : afterAuthority.slice(0, query)
  // What a password with an unencoded / leaves behind (postgres://u:a/b@db/app), which would be told as the name of
  // the database; a database name with an @ takes %40.
  if (path.includes('@'))
    throw new ConnectionStringError(
      'its database name holds an @, as when a password holds an unencoded /: percent-encode the password ' +
        '(encodeURIComponent), and an @ in the name as %40',
    )
  if (path.length > 1) given.set('dbname', decode(path.slice(1), 'its database name'))
  if (query >= 0) {
    for (const pair of afterAuthority.slice(query + 1).split('&')) {
      if (pair === '') continue
      const eq = pair.indexOf('=')
      if (eq < 0)
        throw new ConnectionStringError(
          /^[a-z_]+$/.test(pair) ? `its parameter ${pair} has no = and value` : 'a parameter of it has no = and value',
        )
      const key = decode(pair.slice(0, eq), 'a parameter name')
      const value = decode(pair.slice(eq + 1), `the value of ${key}`)
      // libpq's one alias, for URLs written for JDBC.
      if (key === 'ssl' && value === 'true') given.set('sslmode', 'require')
      else given.set(key, value)
    }
  }
  for (const [key, value] of given) {
    if (READ.has(key) || IGNORED.has(key)) continue
    const accepted = ACCEPTED_VALUES[key]
    if (accepted) {
      if (!accepted.includes(value))
        throw new ConnectionStringError(
          `${key}=${value} is not supported (the service accepts ${accepted.join(', ')}; docs/operations.md, ` +
            '"TLS to the database")',
        )
    } else if (key in UNSUPPORTED) {
      throw new ConnectionStringError(`the parameter ${key} is not supported: ${UNSUPPORTED[key]}`)
    } else {
      throw new ConnectionStringError(
        `${JSON.stringify(key)} is not a parameter of a PostgreSQL connection URL (libpq's; docs/operations.md, ` +
          '"TLS to the database", lists those read)',
      )
    }
  }
  return settingsOf(given)
}

function settingsOf(given: ReadonlyMap<string, string>): ConnectionString {
  const hosts = (given.get('host') ?? '').split(',')
  const rawPorts = given.get('port')?.split(',') ?? []
  if (rawPorts.length > 1 && rawPorts.length !== hosts.length)
    throw new ConnectionStringError(`it gives ${rawPorts.length} ports for ${hosts.length} hosts`)
  const ports = hosts.map((_, i) => {
    const raw = rawPorts.length === 1 ? rawPorts[0]! : rawPorts[i]
    return raw ? portOf(raw) : 5432
  })
  if (hosts.some((h) => h === ''))
    throw new ConnectionStringError(
      'names no host: give one (postgres://user@db.example.com/app) or the folder of a Unix socket ' +
        "(postgres://user@/app?host=/var/run/postgresql); libpq's default socket folder differs between builds",
    )
  const socket = hosts.find((h) => h.startsWith('/'))
  if (socket && hosts.length > 1)
    throw new ConnectionStringError('a Unix socket folder cannot be listed with other hosts')

  const sslrootcert = given.get('sslrootcert') || undefined
  const mode = given.get('sslmode')
  const sslmode = mode === undefined ? (sslrootcert === 'system' ? 'verify-full' : 'prefer') : mode
  oneOf('sslmode', sslmode, SSL_MODES)
  // libpq's rule: any certificate a public CA issued for a name its owner controls would pass a weaker check.
  if (sslrootcert === 'system' && sslmode !== 'verify-full')
    throw new ConnectionStringError(
      `sslrootcert=system needs sslmode=verify-full (got ${sslmode}): anyone can have a public CA certify a name ` +
        'they control, so only the host name check makes it safe',
    )
  const sslcert = given.get('sslcert') || undefined
  const sslkey = given.get('sslkey') || undefined
  if (Boolean(sslcert) !== Boolean(sslkey))
    throw new ConnectionStringError('sslcert and sslkey: give both (the client certificate and its key) or neither')
  const version = (name: string) => {
    const value = given.get(name)
    return value ? oneOf(name, value, TLS_VERSIONS) : undefined
  }
  const attrs = given.get('target_session_attrs')
  return {
    hosts: socket ? [] : hosts,
    ports,
    socket,
    user: given.get('user') || undefined,
    password: given.get('password'),
    database: given.get('dbname') || undefined,
    sslmode: sslmode as SslMode,
    sslrootcert,
    sslcert,
    sslkey,
    sslpassword: given.get('sslpassword'),
    sslMinProtocolVersion: version('ssl_min_protocol_version'),
    sslMaxProtocolVersion: version('ssl_max_protocol_version'),
    applicationName: given.get('application_name') || undefined,
    options: given.get('options') || undefined,
    targetSessionAttrs: attrs ? oneOf('target_session_attrs', attrs, SESSION_ATTRS) : undefined,
  }
}

/** Whether `host` is an IP address rather than a name (a certificate names addresses apart). */
export const isAddress = (host: string): boolean => isIP(host) !== 0
