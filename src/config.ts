import { availableParallelism } from 'node:os'
import Type, { type Static } from 'typebox'
import { Compile } from 'typebox/compile'
import { ConfigError } from './core/config-error.js'
import { trustedProxies, type TrustProxy } from './core/http/client-address.js'
import type { LogLevel } from './core/log.js'
import { reusePortMissing } from './cluster/reuse-port.js'

// Every setting the service reads, with its default. Values arrive as strings
// from the environment; `loadConfig` turns them into this typed record or
// fails naming the variable, so a typo stops start-up instead of running with
// a silent default.

const Integer = (minimum: number, maximum: number) =>
  Type.String({ pattern: '^[0-9]+$', description: `an integer from ${minimum} to ${maximum}`, minimum, maximum })
/**
 * Each worker is a whole instance with its own pool (DATABASE_POOL_MAX + 6
 * connections, docs/scaling.md): 64 of them hold over 1,000 database
 * connections, ten times PostgreSQL's default max_connections. A host with
 * more cores than that is better split into several instances.
 */
const MAX_WORKERS = 64

const Bool = Type.Union([Type.Literal('true'), Type.Literal('false')], { description: '"true" or "false"' })

const EnvSchema = Type.Object({
  NODE_ENV: Type.Optional(Type.String()),
  PORT: Type.Optional(Integer(0, 65535)),
  HOST: Type.Optional(Type.String({ minLength: 1 })),
  DATABASE_URL: Type.Optional(Type.String({ pattern: '^postgres(ql)?://', description: 'a postgres:// URL' })),
  DATABASE_LISTEN_URL: Type.Optional(Type.String({ pattern: '^postgres(ql)?://', description: 'a postgres:// URL' })),
  DATABASE_POOLER: Type.Optional(Type.Union(['auto', 'transaction', 'none'].map((l) => Type.Literal(l)), { description: 'auto, transaction or none' })),
  DATABASE_POOL_MAX: Type.Optional(Integer(1, 1000)),
  API_PREFIX: Type.Optional(Type.String({ pattern: '^(/[A-Za-z0-9._~-]+)*$', description: 'empty or a path such as /v1' })),
  BODY_LIMIT: Type.Optional(Integer(1, 1073741824)),
  JWT_SECRETS: Type.Optional(Type.String({ minLength: 1 })),
  LOG_LEVEL: Type.Optional(Type.Union(['debug', 'info', 'warn', 'error'].map((l) => Type.Literal(l)), { description: 'debug, info, warn or error' })),
  SHUTDOWN_TIMEOUT: Type.Optional(Integer(0, 3600)),
  SHUTDOWN_DELAY: Type.Optional(Integer(0, 3600)),
  HEADERS_TIMEOUT: Type.Optional(Integer(1, 3600)),
  REQUEST_TIMEOUT: Type.Optional(Integer(1, 3600)),
  KEEP_ALIVE_TIMEOUT: Type.Optional(Integer(1, 3600)),
  MAX_CONNECTIONS: Type.Optional(Integer(1, 1000000)),
  STATEMENT_TIMEOUT: Type.Optional(Integer(1, 3600)),
  ALLOW_SIGNUP: Type.Optional(Bool),
  REQUIRE_IF_MATCH: Type.Optional(Bool),
  RATE_LIMIT: Type.Optional(Integer(0, 1000000)),
  MAX_API_KEYS_PER_USER: Type.Optional(Integer(1, 100000)),
  REAUTH_WINDOW: Type.Optional(Integer(0, 86400)),
  LOGIN_RATE_LIMIT: Type.Optional(Integer(0, 1000000)),
  TRUST_PROXY: Type.Optional(Type.String({
    pattern: '^([0-9]{1,2}|[0-9A-Fa-f:.]+(,[0-9A-Fa-f:.]+)*)$',
    description: 'a number of proxy hops (0 to 99) or a comma-separated list of proxy addresses',
  })),
  CORS_ORIGINS: Type.Optional(Type.String({
    pattern: '^(\\*|https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(,https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?)*)$',
    description: 'a comma-separated list of origins such as https://app.example.com, or *',
  })),
  JWT_ISSUER: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
  JWT_AUDIENCE: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
  ACCESS_TOKEN_TTL: Type.Optional(Integer(1, 86400)),
  REFRESH_TOKEN_TTL: Type.Optional(Integer(60, 31536000)),
  ADMIN_EMAIL: Type.Optional(Type.String({ minLength: 3, maxLength: 254 })),
  ADMIN_PASSWORD: Type.Optional(Type.String({ minLength: 8, maxLength: 256, description: 'a password of 8 to 256 characters' })),
  EVENTS_RETENTION_DAYS: Type.Optional(Integer(1, 3650)),
  TLS_CERT_FILE: Type.Optional(Type.String({ minLength: 1 })),
  TLS_KEY_FILE: Type.Optional(Type.String({ minLength: 1 })),
  WEBHOOK_ALLOW_PRIVATE: Type.Optional(Bool),
  WEBHOOK_ALLOWED_PORTS: Type.Optional(Type.String({
    pattern: '^[0-9]{1,5}(,[0-9]{1,5})*$',
    description: 'a comma-separated list of ports (1 to 65535) webhook URLs may name besides 443',
  })),
  WORKERS: Type.Optional(Type.String({ pattern: '^(auto|[0-9]+)$', description: `auto or an integer from 1 to ${MAX_WORKERS}`, minimum: 1, maximum: MAX_WORKERS })),
})
const checkEnv = Compile(EnvSchema)


export interface Config {
  production: boolean
  port: number
  host: string
  /** undefined: start or reuse the local development cluster */
  databaseUrl: string | undefined
  /**
   * A direct (session) connection to the same database, for LISTEN and
   * migrations, when databaseUrl goes through a transaction pooler;
   * undefined: databaseUrl serves for those too.
   */
  databaseListenUrl: string | undefined
  /**
   * Whether databaseUrl goes through a transaction pooler (src/core/db/pooler.ts):
   * `auto` is found out at start-up by `resolvePooler`, which the entry point
   * runs before `createService` (which needs `transaction` or `none`).
   */
  databasePooler: PoolerSetting
  poolMax: number
  apiPrefix: string
  bodyLimit: number
  /** kid → secret bytes; the first entry signs. Empty until resolved at start-up in development. */
  jwtSecrets: Array<{ kid: string; secret: Buffer }>
  logLevel: LogLevel
  /** How long the drain may take, counted from its start (after shutdownDelayMs). */
  shutdownTimeoutMs: number
  /** From the signal to the drain: /readyz fails, requests are still served, so that load balancers stop routing here first. */
  shutdownDelayMs: number
  headersTimeoutMs: number
  requestTimeoutMs: number
  keepAliveTimeoutMs: number
  /** Open client connections at most (HTTP and HTTPS); the server closes those past it as they arrive. */
  maxConnections: number
  statementTimeoutMs: number
  allowSignup: boolean
  requireIfMatch: boolean
  /** Requests per minute per credential or client address; 0 is off. */
  rateLimit: number
  /** Live (unexpired) API keys one user may hold. */
  maxApiKeysPerUser: number
  /** Seconds after a password login in which creating an API key needs no current_password. */
  reauthWindow: number
  /** Login attempts per minute per client address on one instance, with rateLimit on; 0 is off (the failure counts in the database still lock). */
  loginRateLimit: number
  /** Proxy hops, or proxy addresses, whose X-Forwarded-For entries are believed. */
  trustProxy: TrustProxy
  corsOrigins: ReadonlySet<string>
  jwtIssuer: string
  jwtAudience: string
  /** Seconds. */
  accessTokenTtl: number
  /** Seconds. */
  refreshTokenTtl: number
  /** The first admin, created at start-up when no admin exists. */
  bootstrapAdmin: { email: string; password: string } | undefined
  /** Events and webhook deliveries older than this many days are deleted (src/events/retention.ts). */
  eventsRetentionDays: number
  /** Webhook URLs may be http and point at loopback, link-local and private addresses (tests, closed networks). */
  webhookAllowPrivate: boolean
  /** Ports besides 443 a webhook URL may name (unless webhookAllowPrivate, which allows any). */
  webhookAllowedPorts: ReadonlySet<number>
  /** Processes serving the port (src/cluster/primary.ts); 1: this process alone, no primary. */
  workers: number
  /** Serve HTTPS from these PEM files (reloaded when they change); undefined: plain HTTP, for use behind a proxy. */
  tls: { certFile: string; keyFile: string } | undefined
}

export type PoolerSetting = 'auto' | 'transaction' | 'none'

/** Every variable the service reads (test/k8s.test.ts holds the manifests' names against it). */
export const variableNames: readonly string[] = Object.keys(EnvSchema.properties)

export const secretVariables: ReadonlySet<string> = new Set(['DATABASE_URL', 'DATABASE_LISTEN_URL', 'JWT_SECRETS', 'ADMIN_PASSWORD'])

export function loadConfig(env: Record<string, string | undefined>): Config {
  // An empty variable counts as unset, except API_PREFIX, where empty is a value.
  const present = Object.fromEntries(
    Object.keys(EnvSchema.properties).flatMap((k) => {
      const value = env[k]
      return value === undefined || (value === '' && k !== 'API_PREFIX') ? [] : [[k, value]]
    }),
  )
  const first = checkEnv.Errors(present)[0]
  if (first) {
    const name = first.instancePath.slice(1)
    const schema = (EnvSchema.properties as Record<string, { description?: string }>)[name]
    // Never echo a value that may hold a credential (a URL's password, signing
    // secrets): the message goes to stderr and from there into logs.
    const got = secretVariables.has(name) ? '' : ` (got ${JSON.stringify(env[name])})`
    throw new ConfigError(`${name}: must be ${schema?.description ?? 'valid'}${got}`)
  }
  const e = present as Static<typeof EnvSchema>
  const int = (name: keyof typeof EnvSchema.properties, fallback: number): number => {
    const raw = e[name]
    if (raw === undefined) return fallback
    const { minimum, maximum, description } = EnvSchema.properties[name] as unknown as { minimum: number; maximum: number; description: string }
    const value = Number(raw)
    if (!(value >= minimum && value <= maximum)) throw new ConfigError(`${name}: must be ${description} (got ${JSON.stringify(raw)})`)
    return value
  }
  const production = e.NODE_ENV === 'production'
  for (const name of ['DATABASE_URL', 'DATABASE_LISTEN_URL'] as const) {
    // The pattern passes `postgres://[x`, which only the URL parser refuses; the value is not echoed (a password).
    if (e[name] !== undefined && !URL.canParse(e[name])) throw new ConfigError(`${name}: must be a postgres:// URL (it does not parse as a URL)`)
  }
  if (production && !e.DATABASE_URL) throw new ConfigError('DATABASE_URL: required when NODE_ENV=production')
  if (e.DATABASE_LISTEN_URL && !e.DATABASE_URL) {
    throw new ConfigError('DATABASE_LISTEN_URL: set it with DATABASE_URL (it is a direct connection to the database DATABASE_URL names)')
  }
  if (e.DATABASE_POOLER === 'transaction' && !e.DATABASE_LISTEN_URL) {
    throw new ConfigError('DATABASE_POOLER: `transaction` needs DATABASE_LISTEN_URL, a direct connection to PostgreSQL for LISTEN/NOTIFY and migrations, which a transaction pooler cannot carry')
  }
  if (production && !e.JWT_SECRETS) throw new ConfigError('JWT_SECRETS: required when NODE_ENV=production')
  if (Boolean(e.ADMIN_EMAIL) !== Boolean(e.ADMIN_PASSWORD)) throw new ConfigError('ADMIN_EMAIL and ADMIN_PASSWORD: set both or neither')
  if (Boolean(e.TLS_CERT_FILE) !== Boolean(e.TLS_KEY_FILE)) throw new ConfigError('TLS_CERT_FILE and TLS_KEY_FILE: set both or neither')
  const keepAliveTimeoutMs = int('KEEP_ALIVE_TIMEOUT', 65) * 1000
  const workers = e.WORKERS === 'auto' ? Math.min(availableParallelism(), MAX_WORKERS) : int('WORKERS', 1)
  const cannotShare = workers > 1 ? reusePortMissing() : undefined
  if (cannotShare) throw new ConfigError(`WORKERS=${e.WORKERS}: ${cannotShare}; run one process per instance (WORKERS=1)`)
  return {
    production,
    port: int('PORT', 3000),
    host: e.HOST ?? '0.0.0.0',
    databaseUrl: e.DATABASE_URL,
    databaseListenUrl: e.DATABASE_LISTEN_URL,
    databasePooler: e.DATABASE_POOLER ?? 'auto',
    poolMax: int('DATABASE_POOL_MAX', 10),
    apiPrefix: e.API_PREFIX ?? '',
    bodyLimit: int('BODY_LIMIT', 1048576),
    jwtSecrets: e.JWT_SECRETS ? parseJwtSecrets(e.JWT_SECRETS) : [],
    logLevel: e.LOG_LEVEL ?? 'info',
    shutdownTimeoutMs: int('SHUTDOWN_TIMEOUT', 10) * 1000,
    shutdownDelayMs: int('SHUTDOWN_DELAY', 0) * 1000,
    headersTimeoutMs: int('HEADERS_TIMEOUT', 10) * 1000,
    requestTimeoutMs: int('REQUEST_TIMEOUT', 30) * 1000,
    keepAliveTimeoutMs,
    maxConnections: int('MAX_CONNECTIONS', 10000),
    statementTimeoutMs: int('STATEMENT_TIMEOUT', 5) * 1000,
    allowSignup: e.ALLOW_SIGNUP === 'true',
    requireIfMatch: e.REQUIRE_IF_MATCH === 'true',
    rateLimit: int('RATE_LIMIT', 1200),
    maxApiKeysPerUser: int('MAX_API_KEYS_PER_USER', 100),
    reauthWindow: int('REAUTH_WINDOW', 600),
    loginRateLimit: int('LOGIN_RATE_LIMIT', 30),
    trustProxy: parseTrustProxy(e.TRUST_PROXY),
    corsOrigins: new Set(e.CORS_ORIGINS ? e.CORS_ORIGINS.split(',') : []),
    jwtIssuer: e.JWT_ISSUER ?? 'users-products-api',
    jwtAudience: e.JWT_AUDIENCE ?? 'users-products-api',
    accessTokenTtl: int('ACCESS_TOKEN_TTL', 900),
    refreshTokenTtl: int('REFRESH_TOKEN_TTL', 1209600),
    bootstrapAdmin: e.ADMIN_EMAIL && e.ADMIN_PASSWORD ? { email: e.ADMIN_EMAIL, password: e.ADMIN_PASSWORD } : undefined,
    eventsRetentionDays: int('EVENTS_RETENTION_DAYS', 30),
    webhookAllowPrivate: e.WEBHOOK_ALLOW_PRIVATE === 'true',
    webhookAllowedPorts: parsePorts(e.WEBHOOK_ALLOWED_PORTS),
    workers,
    tls: e.TLS_CERT_FILE && e.TLS_KEY_FILE ? { certFile: e.TLS_CERT_FILE, keyFile: e.TLS_KEY_FILE } : undefined,
  }
}

/** `kid:secret,kid:secret`; each secret is used as its UTF-8 bytes and must be at least 32 of them. */
export function parseJwtSecrets(raw: string): Array<{ kid: string; secret: Buffer }> {
  const seen = new Set<string>()
  return raw.split(',').map((pair, i) => {
    const colon = pair.indexOf(':')
    const kid = pair.slice(0, colon).trim()
    const secret = Buffer.from(pair.slice(colon + 1), 'utf8')
    if (colon < 1 || !/^[A-Za-z0-9._-]{1,64}$/.test(kid)) throw new ConfigError(`JWT_SECRETS: entry ${i + 1} must be kid:secret with a kid of [A-Za-z0-9._-]`)
    if (seen.has(kid)) throw new ConfigError(`JWT_SECRETS: kid "${kid}" appears twice`)
    if (secret.length < 32) throw new ConfigError(`JWT_SECRETS: the secret of kid "${kid}" must be at least 32 bytes`)
    seen.add(kid)
    return { kid, secret }
  })
}

function parsePorts(raw: string | undefined): ReadonlySet<number> {
  const ports = raw ? raw.split(',').map(Number) : []
  const bad = ports.find((p) => p < 1 || p > 65535)
  if (bad !== undefined) throw new ConfigError(`WEBHOOK_ALLOWED_PORTS: ${bad} is not a port (1 to 65535)`)
  return new Set(ports)
}

function parseTrustProxy(raw: string | undefined): TrustProxy {
  if (raw === undefined) return 0
  return /^[0-9]+$/.test(raw) ? Number(raw) : trustedProxies(raw.split(','))
}
