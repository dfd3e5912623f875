import { availableParallelism } from 'node:os'
import Type, { type Static } from 'typebox'
import { Compile } from 'typebox/compile'
import { ConfigError } from './core/config-error.js'
import { connectionStringProblem } from './core/db/database-tls.js'
import { trustedProxies, type TrustProxy } from './core/http/client-address.js'
import type { LogLevel } from './core/log.js'
import { WORKER_SLOT_VARIABLE } from './cluster/messages.js'
import { reusePortMissing } from './cluster/reuse-port.js'
import { parseMailFrom } from './mail/address.js'
import { hookSettingProblems } from './mail/hook.js'
import { parseSmtpUrl } from './mail/smtp-url.js'
import type { MailSettings } from './mail/transport.js'
import { suspectVariables } from './config-names.js'
import { readSecret } from './secret-files.js'

/**
 * log2 of scrypt's N (src/auth/password.ts): the default, the floor
 * in production, and the range PASSWORD_HASH_COST accepts.
 */
export const PASSWORD_HASH_COST = { default: 15, productionFloor: 15, min: 10, max: 17 } as const

// Every setting the service reads, with its default. Values arrive as strings
// from the environment (secrets also from files: src/secret-files.ts);
// `readConfig` turns them into this typed record or fails naming every bad
// variable, so a typo stops start-up instead of running with a silent default.

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
  DATABASE_MIGRATION_URL: Type.Optional(
    Type.String({ pattern: '^postgres(ql)?://', description: 'a postgres:// URL' }),
  ),
  DATABASE_POOLER: Type.Optional(
    Type.Union(
      ['auto', 'transaction', 'none'].map((l) => Type.Literal(l)),
      { description: 'auto, transaction or none' },
    ),
  ),
  DATABASE_POOL_MAX: Type.Optional(Integer(1, 1000)),
  API_PREFIX: Type.Optional(
    Type.String({ pattern: '^(/[A-Za-z0-9._~-]+)*$', description: 'empty or a path such as /v1' }),
  ),
  BODY_LIMIT: Type.Optional(Integer(1, 1073741824)),
  JWT_SECRETS: Type.Optional(Type.String({ minLength: 1 })),
  LOG_LEVEL: Type.Optional(
    Type.Union(
      ['debug', 'info', 'warn', 'error'].map((l) => Type.Literal(l)),
      { description: 'debug, info, warn or error' },
    ),
  ),
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
  MFA_REQUIRED: Type.Optional(
    Type.Union(
      ['none', 'admin', 'all'].map((l) => Type.Literal(l)),
      { description: 'none, admin or all' },
    ),
  ),
  LOGIN_RATE_LIMIT: Type.Optional(Integer(0, 1000000)),
  TRUST_PROXY: Type.Optional(
    Type.String({
      pattern: '^([0-9]{1,2}|[0-9A-Fa-f:.]+(,[0-9A-Fa-f:.]+)*)$',
      description: 'a number of proxy hops (0 to 99) or a comma-separated list of proxy addresses',
    }),
  ),
  CORS_ORIGINS: Type.Optional(
    Type.String({
      pattern: '^(\\*|https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(,https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?)*)$',
      description: 'a comma-separated list of origins such as https://app.example.com, or *',
    }),
  ),
  JWT_ISSUER: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
  JWT_AUDIENCE: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
  ACCESS_TOKEN_TTL: Type.Optional(Integer(1, 86400)),
  REFRESH_TOKEN_TTL: Type.Optional(Integer(60, 31536000)),
  ADMIN_EMAIL: Type.Optional(Type.String({ minLength: 3, maxLength: 254 })),
  ADMIN_PASSWORD: Type.Optional(
    Type.String({ minLength: 8, maxLength: 256, description: 'a password of 8 to 256 characters' }),
  ),
  EVENTS_RETENTION_DAYS: Type.Optional(Integer(1, 3650)),
  TRASH_RETENTION: Type.Optional(Integer(60, 315360000)),
  TLS_CERT_FILE: Type.Optional(Type.String({ minLength: 1 })),
  TLS_KEY_FILE: Type.Optional(Type.String({ minLength: 1 })),
  WEBHOOK_ALLOW_PRIVATE: Type.Optional(Bool),
  WEBHOOK_ALLOWED_PORTS: Type.Optional(
    Type.String({
      pattern: '^[0-9]{1,5}(,[0-9]{1,5})*$',
      description: 'a comma-separated list of ports (1 to 65535) webhook URLs may name besides 443',
    }),
  ),
  PASSWORD_RESET_URL: Type.Optional(
    Type.String({
      pattern: '^https?://[^\\s]*\\{token\\}',
      maxLength: 1000,
      description: 'an http(s) URL holding {token}',
    }),
  ),
  VERIFY_EMAIL_URL: Type.Optional(
    Type.String({
      pattern: '^https?://[^\\s]*\\{token\\}',
      maxLength: 1000,
      description: 'an http(s) URL holding {token}',
    }),
  ),
  EMAIL_RESTORE_URL: Type.Optional(
    Type.String({
      pattern: '^https?://[^\\s]*\\{token\\}',
      maxLength: 1000,
      description: 'an http(s) URL holding {token}',
    }),
  ),
  PASSWORD_RESET_TTL: Type.Optional(Integer(60, 86400)),
  PASSWORD_HASH_COST: Type.Optional(Integer(PASSWORD_HASH_COST.min, PASSWORD_HASH_COST.max)),
  REQUIRE_VERIFIED_EMAIL: Type.Optional(Bool),
  SMTP_URL: Type.Optional(Type.String({ description: 'an smtp:// or smtps:// URL (src/mail/smtp-url.ts checks it)' })),
  // One line: it becomes a header, and a line break would let it add headers.
  MAIL_FROM: Type.Optional(
    Type.String({
      pattern: '^[^\\r\\n]*@[^\\r\\n]*$',
      maxLength: 320,
      description: 'an address such as "Example <no-reply@example.com>", on one line',
    }),
  ),
  MAIL_HOOK_URL: Type.Optional(Type.String({ description: 'an http(s) URL (src/mail/hook.ts checks it)' })),
  MAIL_HOOK_SECRET: Type.Optional(
    Type.String({ description: 'whsec_ and the base64 of 24 to 64 random bytes (src/mail/hook.ts checks it)' }),
  ),
  OIDC_ISSUER: Type.Optional(
    Type.String({
      pattern: '^https://[^\\s]+$',
      maxLength: 1000,
      description: "the https:// URL of the identity provider, exactly as its tokens' iss says it",
    }),
  ),
  OIDC_AUDIENCE: Type.Optional(
    Type.String({
      pattern: '^[^\\s]+$',
      maxLength: 1000,
      description: "the audience (aud) the provider issues this API's tokens for",
    }),
  ),
  OIDC_ADMIN_CLAIM: Type.Optional(
    Type.String({
      pattern: '^[^\\s]+$',
      maxLength: 200,
      description: 'a claim name or dotted path, such as realm_access.roles',
    }),
  ),
  OIDC_ADMIN_VALUE: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
  OIDC_REPROVISION: Type.Optional(Bool),
  OIDC_LOCAL_PASSWORDS: Type.Optional(Bool),
  WORKERS: Type.Optional(
    Type.String({
      pattern: '^(auto|[0-9]+)$',
      description: `auto or an integer from 1 to ${MAX_WORKERS}`,
      minimum: 1,
      maximum: MAX_WORKERS,
    }),
  ),
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
   * A connection as the schema's owner, for migrations and the `migrate` and
   * `admin` commands, when DATABASE_URL's role may only read and write the
   * tables (deploy/postgres/runtime-role.psql); undefined: they run on
   * databaseListenUrl, else databaseUrl.
   */
  databaseMigrationUrl: string | undefined
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
  /**
   * From the signal to the drain: /readyz fails, requests are still
   * served, so that load balancers stop routing here first.
   */
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
  /** Seconds after a login with every factor in which the same session needs no fresh proof for step-up acts. */
  reauthWindow: number
  /** Who must have a second factor: a user it covers without one gets a credential good only to enrol one. */
  mfaRequired: 'none' | 'admin' | 'all'
  /**
   * Login attempts per minute per client address on one instance, with rateLimit on; 0 is off (the failure counts in
   * the database still lock).
   */
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
  /** Seconds a deleted resource stays in the trash, restorable, before the service purges it (trash-purge.ts). */
  trashRetention: number
  /** Webhook URLs may be http and point at loopback, link-local and private addresses (tests, closed networks). */
  webhookAllowPrivate: boolean
  /** Ports besides 443 a webhook URL may name (unless webhookAllowPrivate, which allows any). */
  webhookAllowedPorts: ReadonlySet<number>
  /** Processes serving the port (src/cluster/primary.ts); 1: this process alone, no primary. */
  workers: number
  /**
   * Account recovery (src/auth/recovery/recovery-routes.ts): link
   * templates with `{token}`; undefined: that flow is off (404).
   */
  passwordResetUrl: string | undefined
  verifyEmailUrl: string | undefined
  /** The link in the notice an address change sends to the old address, which puts that address back. */
  emailRestoreUrl: string | undefined
  /** Seconds a password-reset link lives. */
  passwordResetTtl: number
  /** log2 of scrypt's N for new password hashes (src/auth/password.ts); never below 15 in production. */
  passwordHashCost: number
  /** A password login before the address is verified is 403 email_not_verified. */
  requireVerifiedEmail: boolean
  /**
   * Outgoing mail (src/mail/transport.ts): at most one of SMTP and the hook; neither is the console in development,
   * nothing in production.
   */
  mail: MailSettings
  /** The identity provider whose access tokens are accepted beside ours (src/auth/oidc/); undefined: none. */
  oidc: ProviderSettings | undefined
  /**
   * Users made from the identity provider's tokens may have a local password (OIDC_LOCAL_PASSWORDS): a reset, a
   * password set through the API, a password login. False: they sign in at the provider only, so that what the
   * provider withdraws reaches every way in. Also without OIDC_ISSUER (users made while one was configured).
   */
  oidcLocalPasswords: boolean
  /** Serve HTTPS from these PEM files (reloaded when they change); undefined: plain HTTP, for use behind a proxy. */
  tls: { certFile: string; keyFile: string } | undefined
}

export type PoolerSetting = 'auto' | 'transaction' | 'none'

/** The identity provider whose access tokens are accepted beside ours (OIDC_*, src/auth/oidc/). */
export interface ProviderSettings {
  issuer: string
  audience: string
  /** The claim naming admins: a top-level claim of that name, else a dotted path (`realm_access.roles`). */
  adminClaim: string | undefined
  /** The value of adminClaim (a string, or one element of an array) that makes an admin. */
  adminValue: string | undefined
  /** A later token may create again a user that was deleted (OIDC_REPROVISION). */
  reprovision: boolean
}

/**
 * The secrets: each may also be given as `<NAME>_FILE` (src/secret-files.ts),
 * and no message ever echoes its value. A new secret variable joins here.
 */
export const SECRET_VARIABLES = [
  'DATABASE_URL',
  'DATABASE_LISTEN_URL',
  'DATABASE_MIGRATION_URL',
  'JWT_SECRETS',
  'ADMIN_PASSWORD',
  'SMTP_URL',
  'MAIL_HOOK_SECRET',
] as const
const secretVariables: ReadonlySet<string> = new Set(SECRET_VARIABLES)

/** Variables the service reads outside this schema: the development cluster's binaries, a worker's number. */
const OTHER_VARIABLES = ['PG_BIN', WORKER_SLOT_VARIABLE]

/** Every variable the service reads: what a misspelt one is compared with (src/config-names.ts). */
export const KNOWN_VARIABLES: ReadonlySet<string> = new Set([
  ...Object.keys(EnvSchema.properties),
  ...SECRET_VARIABLES.map((s) => `${s}_FILE`),
  ...OTHER_VARIABLES,
])

type EnvName = keyof typeof EnvSchema.properties

/**
 * What the configuration is read for: serving signs tokens and needs JWT_SECRETS; the `migrate` and `admin` commands
 * sign nothing, so that a migration job is not given the signing secrets.
 */
export type ConfigPurpose = 'serve' | 'migrate' | 'admin'

/** What JWT_SECRETS holds, and a way to make one: said when it is missing. */
const JWT_SECRETS_FORMAT =
  'comma-separated kid:secret pairs, each secret at least 32 bytes, the first signing; make one with ' +
  'echo "k1:$(openssl rand -base64 48)"'

/**
 * The configuration `env` gives, or a ConfigError holding every problem
 * found, one line each naming the variable (all at once: an operator fixes
 * them in one go, not one per restart). `warnings`: lines to log, about
 * variables that look misspelt but lose nothing (src/config-names.ts).
 *
 * A misspelt-looking variable stops start-up when none of the variables it
 * was probably meant to be is set: then its value is what the service lacks
 * (DATABSE_URL alone would leave it on the development database). Beside
 * the variable it was meant to be (a leftover DATABSE_URL beside
 * DATABASE_URL) it is only noise, and a warning.
 */
export function readConfig(
  env: Record<string, string | undefined>,
  purpose: ConfigPurpose = 'serve',
): { config: Config; warnings: string[] } {
  /** Variable → the line about it: its first problem only, so one cause gives one line. */
  const problems = new Map<string, string>()
  const problem = (variable: string, line: string) => void (problems.has(variable) || problems.set(variable, line))
  /** Secrets read from a file are named by their `_FILE` variable in messages: that is what the operator set. */
  const files = new Map<string, string>()
  const label = (name: string) => (files.has(name) ? `${name}_FILE (${files.get(name)})` : name)
  const report = (name: string, text: string) => problem(name, `${label(name)}: ${text}`)

  const secrets = new Map<string, string | undefined>()
  for (const name of SECRET_VARIABLES) {
    const secret = readSecret(env, name)
    if (secret.problem) problem(name, secret.problem)
    else if (secret.file) files.set(name, secret.file)
    secrets.set(name, secret.value)
  }
  // An empty variable counts as unset, except API_PREFIX, where empty is a value.
  const given = Object.fromEntries(
    (Object.keys(EnvSchema.properties) as EnvName[]).flatMap((k) => {
      const value = secretVariables.has(k) ? secrets.get(k) : env[k]
      return value === undefined || (value === '' && k !== 'API_PREFIX') ? [] : [[k, value]]
    }),
  ) as Record<string, string>
  for (const error of checkEnv.Errors(given)) {
    const name = error.instancePath.slice(1)
    const schema = (EnvSchema.properties as Record<string, { description?: string }>)[name]
    if (!schema) continue
    // Never echo a value that may hold a credential (a URL's password, signing
    // secrets): the message goes to stderr and from there into logs.
    report(
      name,
      `must be ${schema.description ?? 'valid'}` +
        (secretVariables.has(name) ? '' : ` (got ${JSON.stringify(given[name])})`),
    )
  }
  // Read as libpq reads them, and as they will be connected with (certificate files read and checked): what cannot
  // work is said now, naming the variable, never echoing the URL (a password).
  for (const name of ['DATABASE_URL', 'DATABASE_LISTEN_URL', 'DATABASE_MIGRATION_URL'] as const) {
    const url = given[name]
    if (url === undefined || problems.has(name)) continue
    const problem = connectionStringProblem(url)
    if (problem) report(name, problem)
  }
  // What passed its own checks; a variable with a problem counts as unset below, so that it gives no second line.
  const e = Object.fromEntries(Object.entries(given).filter(([k]) => !problems.has(k))) as Static<typeof EnvSchema>
  const int = (name: EnvName, fallback: number): number => {
    const raw = e[name]
    if (raw === undefined) return fallback
    const { minimum, maximum, description } = EnvSchema.properties[name] as unknown as {
      minimum: number
      maximum: number
      description: string
    }
    const value = Number(raw)
    if (value >= minimum && value <= maximum) return value
    report(name, `must be ${description} (got ${JSON.stringify(raw)})`)
    return fallback
  }
  const production = e.NODE_ENV === 'production'
  /** Given, even if wrongly: a secret whose file could not be read counts, so that it gives no second line. */
  const isGiven = (name: string) => given[name] !== undefined || problems.has(name)
  if (production && !isGiven('DATABASE_URL')) report('DATABASE_URL', 'required when NODE_ENV=production')
  if (e.DATABASE_LISTEN_URL && !isGiven('DATABASE_URL')) {
    report(
      'DATABASE_LISTEN_URL',
      'set it with DATABASE_URL (it is a direct connection to the database DATABASE_URL names)',
    )
  }
  if (e.DATABASE_MIGRATION_URL && !isGiven('DATABASE_URL')) {
    report(
      'DATABASE_MIGRATION_URL',
      "set it with DATABASE_URL (it is a connection as the schema's owner to the database DATABASE_URL names)",
    )
  }
  if (e.DATABASE_POOLER === 'transaction' && !isGiven('DATABASE_LISTEN_URL')) {
    report(
      'DATABASE_POOLER',
      '`transaction` needs DATABASE_LISTEN_URL, a direct connection to PostgreSQL for LISTEN/NOTIFY and migrations, ' +
        'which a transaction pooler cannot carry',
    )
  }
  if (production && purpose === 'serve' && !isGiven('JWT_SECRETS'))
    report('JWT_SECRETS', `required when NODE_ENV=production: ${JWT_SECRETS_FORMAT}`)
  // A cheap hash turns a stolen table into passwords within hours; the low end of the range is for tests.
  if (production && Number(e.PASSWORD_HASH_COST) < PASSWORD_HASH_COST.productionFloor) {
    report(
      'PASSWORD_HASH_COST',
      `must be at least ${PASSWORD_HASH_COST.productionFloor} when NODE_ENV=production ` +
        `(got ${JSON.stringify(e.PASSWORD_HASH_COST)}); lower costs are for tests`,
    )
  }
  if (isGiven('ADMIN_EMAIL') !== isGiven('ADMIN_PASSWORD'))
    problem('ADMIN_EMAIL', 'ADMIN_EMAIL and ADMIN_PASSWORD: set both or neither')
  if (isGiven('TLS_CERT_FILE') !== isGiven('TLS_KEY_FILE'))
    problem('TLS_CERT_FILE', 'TLS_CERT_FILE and TLS_KEY_FILE: set both or neither')
  // Without links to send, an unverified user could never become verified, and could never log in again.
  if (e.REQUIRE_VERIFIED_EMAIL === 'true' && !isGiven('VERIFY_EMAIL_URL'))
    report(
      'REQUIRE_VERIFIED_EMAIL',
      'needs VERIFY_EMAIL_URL: without verification links, no unverified user could ever log in',
    )
  // Its link rides on the notice an address change sends the old address, which goes out with verification on.
  if (isGiven('EMAIL_RESTORE_URL') && !isGiven('VERIFY_EMAIL_URL'))
    report(
      'EMAIL_RESTORE_URL',
      'needs VERIFY_EMAIL_URL: its link is sent in the notice of an address change, which only address ' +
        'verification sends',
    )
  if (isGiven('SMTP_URL') && isGiven('MAIL_HOOK_URL'))
    problem('SMTP_URL', 'SMTP_URL and MAIL_HOOK_URL: set one of them (mail goes out one way)')
  if (isGiven('SMTP_URL') && !isGiven('MAIL_FROM'))
    report('MAIL_FROM', 'required with SMTP_URL (the From of every message)')
  // The transports' own checks (src/mail/smtp-url.ts, address.ts, hook.ts): what they will be given must parse now, not
  // at the first mail.
  const smtpServer = e.SMTP_URL ? parseSmtpUrl(e.SMTP_URL) : undefined
  if (typeof smtpServer === 'string') report('SMTP_URL', smtpServer)
  const mailFrom = e.MAIL_FROM ? parseMailFrom(e.MAIL_FROM) : undefined
  if (typeof mailFrom === 'string') report('MAIL_FROM', mailFrom)
  for (const { variable, problem: wrong } of hookSettingProblems({
    url: e.MAIL_HOOK_URL,
    secret: e.MAIL_HOOK_SECRET,
    production,
  }))
    report(variable, wrong)
  for (const name of ['PASSWORD_RESET_URL', 'VERIFY_EMAIL_URL', 'EMAIL_RESTORE_URL'] as const) {
    const url = e[name]
    if (url === undefined) continue
    // The link a person is sent: readable by anyone on the way unless it is https.
    if (!URL.canParse(url.replace('{token}', 'x')))
      report(name, `must be an http(s) URL (it does not parse as a URL; got ${JSON.stringify(url)})`)
    else if (production && !url.startsWith('https://'))
      report(name, 'must be an https:// URL when NODE_ENV=production (the link carries a one-time token)')
  }
  if (isGiven('OIDC_ISSUER') !== isGiven('OIDC_AUDIENCE'))
    problem(
      'OIDC_ISSUER',
      "OIDC_ISSUER and OIDC_AUDIENCE: set both or neither (a provider token is accepted only for this API's audience)",
    )
  if (isGiven('OIDC_ADMIN_CLAIM') !== isGiven('OIDC_ADMIN_VALUE'))
    problem('OIDC_ADMIN_CLAIM', 'OIDC_ADMIN_CLAIM and OIDC_ADMIN_VALUE: set both or neither')
  if (!isGiven('OIDC_ISSUER'))
    for (const name of ['OIDC_ADMIN_CLAIM', 'OIDC_REPROVISION'] as const)
      if (isGiven(name)) report(name, 'needs OIDC_ISSUER and OIDC_AUDIENCE')
  if (e.OIDC_ISSUER !== undefined && !URL.canParse(e.OIDC_ISSUER))
    report('OIDC_ISSUER', `must be an https:// URL (it does not parse as a URL; got ${JSON.stringify(e.OIDC_ISSUER)})`)
  // The issuer picks which verification a JWT goes through: ours (HMAC only) or the provider's (keys only).
  if (e.OIDC_ISSUER !== undefined && e.OIDC_ISSUER === (e.JWT_ISSUER ?? 'users-products-api'))
    report('OIDC_ISSUER', "must differ from JWT_ISSUER (the issuer tells the provider's tokens from ours)")
  const jwtSecrets = e.JWT_SECRETS ? jwtSecretsIn(e.JWT_SECRETS) : []
  if (typeof jwtSecrets === 'string') report('JWT_SECRETS', jwtSecrets)
  const webhookAllowedPorts = portsIn(e.WEBHOOK_ALLOWED_PORTS)
  if (typeof webhookAllowedPorts === 'string') report('WEBHOOK_ALLOWED_PORTS', webhookAllowedPorts)
  const workers = e.WORKERS === 'auto' ? Math.min(availableParallelism(), MAX_WORKERS) : int('WORKERS', 1)
  const cannotShare = workers > 1 ? reusePortMissing() : undefined
  if (cannotShare) problem('WORKERS', `WORKERS=${e.WORKERS}: ${cannotShare}; run one process per instance (WORKERS=1)`)

  const warnings: string[] = []
  for (const suspect of suspectVariables(env, KNOWN_VARIABLES, SECRET_VARIABLES)) {
    // Set: the variable, or its _FILE twin (but for the suspect itself: PORT_FILE does not set PORT). A family without
    // any variable yet loses nothing.
    const isSet = (name: string) => Boolean(env[name] || (`${name}_FILE` !== suspect.name && env[`${name}_FILE`]))
    const lost = suspect.meant.length > 0 && !suspect.meant.some(isSet)
    if (lost) problem(suspect.name, suspect.message)
    else warnings.push(suspect.message)
  }

  const config: Config = {
    production,
    port: int('PORT', 3000),
    // Development listens on this machine only: a laptop on a café's
    // network does not serve the API with its generated secret.
    host: e.HOST ?? (production ? '0.0.0.0' : '127.0.0.1'),
    databaseUrl: e.DATABASE_URL,
    databaseListenUrl: e.DATABASE_LISTEN_URL,
    databaseMigrationUrl: e.DATABASE_MIGRATION_URL,
    databasePooler: e.DATABASE_POOLER ?? 'auto',
    poolMax: int('DATABASE_POOL_MAX', 10),
    apiPrefix: e.API_PREFIX ?? '',
    bodyLimit: int('BODY_LIMIT', 1048576),
    jwtSecrets: typeof jwtSecrets === 'string' ? [] : jwtSecrets,
    logLevel: e.LOG_LEVEL ?? 'info',
    shutdownTimeoutMs: int('SHUTDOWN_TIMEOUT', 10) * 1000,
    shutdownDelayMs: int('SHUTDOWN_DELAY', 0) * 1000,
    headersTimeoutMs: int('HEADERS_TIMEOUT', 10) * 1000,
    requestTimeoutMs: int('REQUEST_TIMEOUT', 30) * 1000,
    keepAliveTimeoutMs: int('KEEP_ALIVE_TIMEOUT', 65) * 1000,
    maxConnections: int('MAX_CONNECTIONS', 10000),
    statementTimeoutMs: int('STATEMENT_TIMEOUT', 5) * 1000,
    allowSignup: e.ALLOW_SIGNUP === 'true',
    requireIfMatch: e.REQUIRE_IF_MATCH === 'true',
    rateLimit: int('RATE_LIMIT', 1200),
    maxApiKeysPerUser: int('MAX_API_KEYS_PER_USER', 100),
    reauthWindow: int('REAUTH_WINDOW', 600),
    mfaRequired: e.MFA_REQUIRED ?? 'none',
    loginRateLimit: int('LOGIN_RATE_LIMIT', 30),
    trustProxy: parseTrustProxy(e.TRUST_PROXY),
    corsOrigins: new Set(e.CORS_ORIGINS ? e.CORS_ORIGINS.split(',') : []),
    jwtIssuer: e.JWT_ISSUER ?? 'users-products-api',
    jwtAudience: e.JWT_AUDIENCE ?? 'users-products-api',
    accessTokenTtl: int('ACCESS_TOKEN_TTL', 900),
    refreshTokenTtl: int('REFRESH_TOKEN_TTL', 1209600),
    bootstrapAdmin:
      e.ADMIN_EMAIL && e.ADMIN_PASSWORD ? { email: e.ADMIN_EMAIL, password: e.ADMIN_PASSWORD } : undefined,
    eventsRetentionDays: int('EVENTS_RETENTION_DAYS', 30),
    trashRetention: int('TRASH_RETENTION', 2592000),
    webhookAllowPrivate: e.WEBHOOK_ALLOW_PRIVATE === 'true',
    webhookAllowedPorts: typeof webhookAllowedPorts === 'string' ? new Set() : webhookAllowedPorts,
    workers,
    passwordResetUrl: e.PASSWORD_RESET_URL,
    verifyEmailUrl: e.VERIFY_EMAIL_URL,
    emailRestoreUrl: e.EMAIL_RESTORE_URL,
    passwordResetTtl: int('PASSWORD_RESET_TTL', 3600),
    passwordHashCost: int('PASSWORD_HASH_COST', PASSWORD_HASH_COST.default),
    requireVerifiedEmail: e.REQUIRE_VERIFIED_EMAIL === 'true',
    mail:
      typeof smtpServer === 'object' && typeof mailFrom === 'object'
        ? { via: 'smtp', server: smtpServer, from: mailFrom }
        : e.MAIL_HOOK_URL && e.MAIL_HOOK_SECRET
          ? { via: 'hook', url: e.MAIL_HOOK_URL, secret: e.MAIL_HOOK_SECRET }
          : { via: 'none' },
    oidc:
      e.OIDC_ISSUER && e.OIDC_AUDIENCE
        ? {
            issuer: e.OIDC_ISSUER,
            audience: e.OIDC_AUDIENCE,
            adminClaim: e.OIDC_ADMIN_CLAIM,
            adminValue: e.OIDC_ADMIN_VALUE,
            reprovision: e.OIDC_REPROVISION === 'true',
          }
        : undefined,
    oidcLocalPasswords: e.OIDC_LOCAL_PASSWORDS === 'true',
    tls: e.TLS_CERT_FILE && e.TLS_KEY_FILE ? { certFile: e.TLS_CERT_FILE, keyFile: e.TLS_KEY_FILE } : undefined,
  }
  // Start-up stops anyway: the variables that look misspelt are said with the rest, since they may be why
  // (DATABASE_HOST beside "DATABASE_URL: required").
  if (problems.size) throw new ConfigError([...problems.values(), ...warnings])
  return { config, warnings }
}

/** `readConfig` for callers that log nothing: the configuration, or the ConfigError. */
export const loadConfig = (env: Record<string, string | undefined>, purpose?: ConfigPurpose): Config =>
  readConfig(env, purpose).config

/** `kid:secret,kid:secret`; each secret is used as its UTF-8 bytes and must be at least 32 of them. */
export function parseJwtSecrets(raw: string): Array<{ kid: string; secret: Buffer }> {
  const secrets = jwtSecretsIn(raw)
  if (typeof secrets === 'string') throw new ConfigError(`JWT_SECRETS: ${secrets}`)
  return secrets
}

/** The pairs of `raw`, or what is wrong with it (never a secret). */
function jwtSecretsIn(raw: string): Array<{ kid: string; secret: Buffer }> | string {
  const seen = new Set<string>()
  const secrets: Array<{ kid: string; secret: Buffer }> = []
  for (const [i, pair] of raw.split(',').entries()) {
    const colon = pair.indexOf(':')
    const kid = pair.slice(0, colon).trim()
    const secret = Buffer.from(pair.slice(colon + 1), 'utf8')
    if (colon < 1 || !/^[A-Za-z0-9._-]{1,64}$/.test(kid))
      return `entry ${i + 1} must be kid:secret with a kid of [A-Za-z0-9._-]`
    if (seen.has(kid)) return `kid "${kid}" appears twice`
    if (secret.length < 32) return `the secret of kid "${kid}" must be at least 32 bytes`
    seen.add(kid)
    secrets.push({ kid, secret })
  }
  return secrets
}

/** The ports of `raw`, or what is wrong with them. */
function portsIn(raw: string | undefined): ReadonlySet<number> | string {
  const ports = raw ? raw.split(',').map(Number) : []
  const bad = ports.find((p) => p < 1 || p > 65535)
  return bad === undefined ? new Set(ports) : `${bad} is not a port (1 to 65535)`
}

function parseTrustProxy(raw: string | undefined): TrustProxy {
  if (raw === undefined) return 0
  return /^[0-9]+$/.test(raw) ? Number(raw) : trustedProxies(raw.split(','))
}
