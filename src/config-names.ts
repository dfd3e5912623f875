import { closestName, editDistance } from './core/lib/closest-name.js'

// Environment variables that are not the service's but look as if they were
// meant to be: a slip (DATABSE_URL), the wrong case (database_url), `_FILE`
// on a variable that is not a secret (PORT_FILE), or a name in one of the
// service's own families that it does not read (DATABASE_HOST). Such a
// variable is ignored, so whatever it was meant to say is lost: the service
// would start on a default (the local development database, for one)
// believing it was configured.
//
// The rest of a process's environment must never be reported: a shell's,
// a container's (HOSTNAME, HOME, NODE_VERSION), npm's (npm_*), a CI
// runner's, and the links Kubernetes and Docker add for every service
// (DATABASE_SERVICE_HOST, DATABASE_PORT_5432_TCP for a service named
// "database"). Hence the prefixes below are the service's distinctive ones
// only, and short names are matched more strictly (closest-name.ts).

/** Name families of the service: a variable starting with one of these is the service's, or a mistake. */
export const SERVICE_PREFIXES = [
  'DATABASE_',
  'JWT_',
  'TLS_',
  'WEBHOOK_',
  'ADMIN_',
  'SMTP_',
  'MAIL_',
  'OIDC_',
  'PASSWORD_RESET_',
  'VERIFY_EMAIL_',
  'EMAIL_RESTORE_',
] as const

/**
 * Well-known variables of other software that happen to be near one of the
 * service's names: OpenSSL's certificate bundle (SSL_CERT_FILE is two edits
 * from TLS_CERT_FILE), set on many machines and CI runners.
 */
const FOREIGN_VARIABLES: ReadonlySet<string> = new Set(['SSL_CERT_FILE', 'SSL_CERT_DIR'])

/** A variable that looks like one of the service's. */
export interface Suspect {
  name: string
  /** The known variables it was probably meant to be (none: a family the service has no variable of yet). */
  meant: string[]
  /** One line naming it and what to do. */
  message: string
}

/**
 * The suspects of `env`, whose known variables are `known`, of which
 * `secrets` may also be given as `<NAME>_FILE`. Empty variables carry
 * nothing and are not reported.
 */
export function suspectVariables(
  env: Record<string, string | undefined>,
  known: ReadonlySet<string>,
  secrets: readonly string[],
): Suspect[] {
  const suspects: Suspect[] = []
  for (const [name, value] of Object.entries(env)) {
    if (!value || known.has(name) || FOREIGN_VARIABLES.has(name) || isServiceLink(name, env)) continue
    const suspect = judge(name, known, secrets)
    if (suspect) suspects.push(suspect)
  }
  return suspects
}

function judge(name: string, known: ReadonlySet<string>, secrets: readonly string[]): Suspect | undefined {
  const upper = name.toUpperCase()
  if (known.has(upper))
    return { name, meant: [upper], message: `${name}: not read (names are case-sensitive); did you mean ${upper}?` }
  const base = upper.endsWith('_FILE') ? upper.slice(0, -'_FILE'.length) : undefined
  if (base && known.has(base)) {
    return {
      name,
      meant: [base],
      message:
        `${name}: not read: ` + `only ${secrets.join(', ')} can be read from a file (<NAME>_FILE); set ${base} itself`,
    }
  }
  const near = closestName(upper, known)
  if (near) return { name, meant: [near], message: `${name}: not a variable of this service; did you mean ${near}?` }
  const prefix = SERVICE_PREFIXES.find((p) => upper.startsWith(p))
  if (!prefix) return undefined
  // The _FILE twins go without saying; the nearest first.
  const isTwin = (k: string) => k.endsWith('_FILE') && known.has(k.slice(0, -'_FILE'.length))
  const family = [...known]
    .filter((k) => k.startsWith(prefix) && !isTwin(k))
    .sort((a, b) => editDistance(upper, a) - editDistance(upper, b))
  const hint = family.length ? `its ${prefix}… variables are ${family.join(', ')}` : `it has no ${prefix}… variable`
  return {
    name,
    meant: family,
    message: `${name}: not a variable of this service (${hint}; docs/operations.md lists them all)`,
  }
}

/**
 * What Kubernetes (for each service in the namespace, unless
 * enableServiceLinks is off) and Docker's legacy links put in the
 * environment: `<SERVICE>_SERVICE_HOST`, `<SERVICE>_SERVICE_PORT[_<port name>]`,
 * `<SERVICE>_PORT[_<n>_<PROTO>[_ADDR|_PORT|_PROTO]]`, and for Docker links
 * `<ALIAS>_NAME` and `<ALIAS>_ENV_<variable>`. A name of that shape counts
 * as one only when its service's own marks are there: `_SERVICE_HOST`, or
 * `_PORT` holding `tcp://…`, so that an operator's DATABASE_PORT on its own
 * is still reported.
 */
function isServiceLink(name: string, env: Record<string, string | undefined>): boolean {
  const m =
    /^(.+?)_(?:SERVICE_(?:HOST|PORT(?:_.+)?)|PORT(?:_\d+_(?:TCP|UDP|SCTP)(?:_(?:ADDR|PORT|PROTO))?)?|NAME|ENV_.+)$/.exec(
      name,
    )
  if (!m) return false
  const service = m[1]!
  return env[`${service}_SERVICE_HOST`] !== undefined || /^(tcp|udp|sctp):\/\//.test(env[`${service}_PORT`] ?? '')
}
