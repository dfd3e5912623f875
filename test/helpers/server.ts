import { randomBytes } from 'node:crypto'
import type { Socket } from 'node:net'
import { after } from 'node:test'
import type { Sql } from 'postgres'
import type { AppDeps } from '../../src/app-deps.js'
import { loadConfig, type Config } from '../../src/config.js'
import { connect } from '../../src/core/db/connect.js'
import { resolvePooler } from '../../src/core/db/pooler.js'
import type { AnyRoute } from '../../src/core/http/route.js'
import { createLogger } from '../../src/core/log.js'
import { createService, type ServiceOptions } from '../../src/service.js'
import { checkAgainstDocument, contractRouter } from './contract-check.js'
import { signJwt, type JwtClaims } from '../../src/auth/jwt.js'
import type { Registry } from '../../src/registry.js'
import { applicationRegistry } from './registry.js'
import { testHashCostFor } from './passwords.js'
import { TestClock } from './clock.js'

const REQUEST_TIMEOUT_MS = 30_000

// Starts the real application on a random port against a database of this
// test file's own (a copy of the run's migrated template), and stops both
// when the file's tests are done.

export const TEST_JWT_SECRET = 'test-secret-that-is-at-least-32-bytes-long!'

export interface TestResponse {
  status: number
  headers: Headers
  /** Parsed JSON when the response has a JSON body, else undefined. */
  body: any // eslint-disable-line @typescript-eslint/no-explicit-any
  text: string
}

export interface RequestOptions {
  /** A value to send as JSON, or a string/Buffer sent as is. */
  body?: unknown
  headers?: Record<string, string>
  /**
   * The bearer credential to send. Default: the file's admin JWT. `null`: none
   * (anonymous). Ignored when `headers` carries Authorization or X-API-Key.
   */
  auth?: string | null
  /** How long to wait for the answer before failing; default REQUEST_TIMEOUT_MS. */
  timeoutMs?: number
}

export interface TestServer {
  url: string
  /** Direct access to this file's database, for arranging data and checking state. */
  sql: Sql
  deps: AppDeps
  /** Every log line the server wrote, parsed. */
  logs: Array<Record<string, unknown>>
  /** The time the service's own expiry checks read: `clock.advance(ms)` instead of waiting for an expiry. */
  clock: TestClock
  request(method: string, path: string, options?: RequestOptions): Promise<TestResponse>
  databaseUrl: string
  /** The admin every request acts as by default (created in the database at start). */
  admin: { id: number; token: string }
  /**
   * Signs a new JWT for the file's admin at its current credential epoch and
   * makes it the default: for a test that changed the admin's role or
   * password, which voids the JWTs issued before.
   */
  renewAdminToken(): Promise<void>
  /**
   * A JWT for a user id, as login would issue it (without the cost
   * of scrypt). It names no session unless `claims.sid` does.
   */
  jwtFor(userId: number, role: 'admin' | 'user', scopes?: string[], claims?: Record<string, unknown>): string
  /** As jwtFor, naming a session opened now as a password login opens one: a fresh login (REAUTH_WINDOW). */
  loginJwtFor(userId: number, role: 'admin' | 'user', scopes?: string[]): Promise<string>
  /**
   * Inserts a user directly (no password unless given, which costs a scrypt
   * hash, or a ready `passwordHash`); its id and a JWT. Set the password
   * here, not with a later UPDATE: a password change voids the user's JWTs.
   * The JWT names no session, unless `session: true`: then it names one
   * opened now, as a password login would (so it may create API keys
   * without current_password for REAUTH_WINDOW seconds).
   */
  createUser(fields?: NewTestUser): Promise<{ id: number; email: string; token: string }>
  /**
   * Waits until every committed event has left the outbox for the event log
   * (src/events/publisher.ts does it within about 50 ms; this makes it happen
   * now), so that a test reads the events of what it just did.
   */
  published(): Promise<void>
  /**
   * Closes the server's idle keep-alive connections: for memory figures that must not count sockets a client left open.
   */
  closeIdleConnections(): void
  /** The connections the server holds open now (its HTTP server's count). */
  openConnections(): Promise<number>
  /** Calls `listener` with each connection the server accepts. */
  onConnection(listener: (socket: Socket) => void): void
}

/** What test/run.ts tells each file's process: the server, the run's migrated template, the file's database prefix. */
export function testDatabaseServer(): { serverUrl: string; template: string; prefix: string } {
  const { TEST_SERVER_URL: serverUrl, TEST_TEMPLATE_DB: template, TEST_DATABASE_PREFIX: prefix } = process.env
  if (!serverUrl || !template || !prefix)
    throw new Error('Run the tests with `make test` (test/run.ts prepares their database).')
  return { serverUrl, template, prefix }
}

/** A name for a new database of this file's (`purpose` in it): test/run.ts drops the file's databases once it ends. */
export function testDatabaseName(purpose: string): string {
  return `${testDatabaseServer().prefix}${purpose}_${randomBytes(4).toString('hex')}`
}

/**
 * Whether CREATE DATABASE takes STRATEGY FILE_COPY (PostgreSQL 15 and later, whose default, WAL_LOG, writes every
 * page of the template to the WAL: for the suite's hundreds of copies, about twice the server's CPU of copying the
 * files after a checkpoint). Earlier versions copy the files, and know no STRATEGY.
 */
let fileCopyStrategy: boolean | undefined

/** A fresh database copied from the run's template (migrated), or an empty one; its URL. */
export async function createTestDatabase({ empty = false } = {}): Promise<string> {
  const { serverUrl, template } = testDatabaseServer()
  const name = testDatabaseName(empty ? 'empty' : 'db')
  const admin = connect(serverUrl, { max: 1, statementTimeoutMs: 60_000 })
  try {
    fileCopyStrategy ??=
      (await admin<[{ version: number }]>`SELECT current_setting('server_version_num')::int AS version`)[0].version >=
      150000
    const strategy = fileCopyStrategy ? admin`STRATEGY FILE_COPY` : admin``
    if (empty) await admin`CREATE DATABASE ${admin(name)} ${strategy}`
    else await admin`CREATE DATABASE ${admin(name)} TEMPLATE ${admin(template)} ${strategy}`
  } finally {
    await admin.end({ timeout: 5 })
  }
  const url = new URL(serverUrl)
  url.pathname = `/${name}`
  return url.toString()
}

export interface NewTestUser {
  role?: 'admin' | 'user'
  email?: string
  name?: string
  password?: string
  passwordHash?: string
  /** The JWT names a session opened now, as by a password login (see createUser). */
  session?: boolean
}

export interface StartOptions {
  /**
   * Another instance on this database (e.g. another TestServer's databaseUrl), as a load balancer would have; default:
   * a fresh database.
   */
  databaseUrl?: string
  /** Entries per credential cache (createService). */
  cacheSize?: number
  /** Routes appended to the service's own (createService); their answers are checked against /openapi.json too. */
  routes?: readonly AnyRoute[]
  /** The service's resources (createService): the application's and a test's own, src/registry.ts. */
  registry?: Registry
  /** Tuning of streams, webhook deliveries and retention (createService). */
  tuning?: Pick<
    ServiceOptions,
    'streams' | 'webhooks' | 'retention' | 'publisher' | 'mail' | 'identityProvider' | 'recoveryRequests'
  >
}

export async function startServer(
  env: Record<string, string> = {},
  overrides: Partial<Config> = {},
  options: StartOptions = {},
): Promise<TestServer> {
  const databaseUrl = options.databaseUrl ?? (await createTestDatabase())
  const loaded: Config = {
    ...loadConfig({
      PORT: '0',
      HOST: '127.0.0.1',
      LOG_LEVEL: 'debug',
      JWT_SECRETS: `test:${TEST_JWT_SECRET}`,
      RATE_LIMIT: '0',
      ...testHashCostFor(env),
      ...env,
    }),
    databaseUrl,
    ...overrides,
  }
  // As src/main.ts does: DATABASE_POOLER=auto is found out by a probe of the database (a direct one here, unless a test
  // says otherwise).
  const config: Config = {
    ...loaded,
    databasePooler: await resolvePooler({ ...loaded, databaseUrl: loaded.databaseUrl ?? databaseUrl }),
  }
  const logs: Array<Record<string, unknown>> = []
  const log = createLogger(config.logLevel, (line) => void logs.push(JSON.parse(line)))
  const clock = new TestClock()
  const service = createService(config, {
    log,
    clock,
    cacheSize: options.cacheSize,
    routes: options.routes,
    registry: options.registry ?? applicationRegistry,
    ...options.tuning,
  })
  const { deps } = service
  const { sql } = deps
  after(() => service.close())
  const url = `http://127.0.0.1:${(await service.listen(0, '127.0.0.1')).port}`
  const router = contractRouter(deps.registry, options.routes)
  const roleScopes = deps.registry.scopes.byRole

  const jwtFor = (userId: number, role: 'admin' | 'user', scopes?: string[], claims: Record<string, unknown> = {}) => {
    const now = Math.floor(clock.now() / 1000)
    const scope = (scopes ?? [...roleScopes[role]]).join(' ')
    // A session id no session has (sessions are numbered from 1)
    // and the epoch of a new user: revoked only with its user.
    return signJwt(
      {
        sub: String(userId),
        iss: config.jwtIssuer,
        aud: config.jwtAudience,
        iat: now,
        exp: now + 900,
        role,
        scope,
        sid: String(2 ** 53),
        gen: 0,
        ...claims,
      } as JwtClaims,
      config.jwtSecrets[0]!,
    )
  }
  let userCounter = 0
  const createUser = async (fields: NewTestUser = {}) => {
    const email = fields.email ?? `user-${randomBytes(4).toString('hex')}-${++userCounter}@example.com`
    const role = fields.role ?? 'user'
    const password_hash =
      fields.passwordHash ?? (fields.password === undefined ? null : await deps.passwords.hash(fields.password))
    const [row] = await sql<Array<{ id: number }>>`
      INSERT INTO users (name, email, role, password_hash) VALUES
      (${fields.name ?? 'Test User'}, ${email}, ${role}, ${password_hash}) RETURNING id`
    return { id: row!.id, email, token: fields.session ? await loginJwtFor(row!.id, role) : jwtFor(row!.id, role) }
  }
  const loginJwtFor = async (userId: number, role: 'admin' | 'user', scopes?: string[]) =>
    jwtFor(userId, role, scopes, { sid: await openTestSession(userId, role) })
  /** A session as a password login opens one, now; its id as a JWT's `sid`. */
  const openTestSession = async (userId: number, role: 'admin' | 'user') => {
    const [session] = await sql<Array<{ id: number }>>`
      INSERT INTO sessions (user_id, scopes, token_format, expires_at, last_used_at)
      VALUES (${userId}, ${[...roleScopes[role]]}, 'jwt', now() + interval '1 day', now()) RETURNING id`
    return String(session!.id)
  }
  // The default credential acts as a fresh login: it may create API keys as tests have always done.
  const adminUser = await createUser({ role: 'admin', name: 'Test Admin' })
  const adminSid = await openTestSession(adminUser.id, 'admin')
  adminUser.token = jwtFor(adminUser.id, 'admin', undefined, { sid: adminSid })
  const admin = { id: adminUser.id, token: adminUser.token }
  // Tests start from the steady state: revocations loaded and a heartbeat
  // heard (src/auth/revocation/credential-changes.ts).
  for (const deadline = Date.now() + 10_000; !deps.credentialChanges.trusted && Date.now() < deadline;)
    await new Promise((r) => setTimeout(r, 10))
  let document: Parameters<typeof checkAgainstDocument>[0] | undefined

  return {
    url,
    sql,
    deps,
    logs,
    clock,
    databaseUrl,
    admin,
    async renewAdminToken() {
      const [{ epoch }] = await sql<
        [{ epoch: number }]
      >`SELECT credential_epoch AS epoch FROM users WHERE id = ${admin.id}`
      admin.token = adminUser.token = jwtFor(admin.id, 'admin', undefined, { gen: epoch, sid: adminSid })
    },
    jwtFor,
    loginJwtFor,
    createUser,
    closeIdleConnections: () => service.server.closeIdleConnections(),
    openConnections: () =>
      new Promise((resolve, reject) =>
        service.server.getConnections((err, count) => (err ? reject(err) : resolve(count))),
      ),
    onConnection: (listener) => void service.server.on('connection', listener),
    async published() {
      for (const deadline = Date.now() + 5000; ;) {
        await deps.eventPublisher.drain()
        const [waiting] = await sql`SELECT 1 FROM event_outbox LIMIT 1`
        if (!waiting) return
        if (Date.now() > deadline) throw new Error('the event outbox did not empty within 5 s')
        await new Promise((resolve) => setTimeout(resolve, 5))
      }
    },
    async request(method, path, options = {}) {
      const headers: Record<string, string> = { ...options.headers }
      const auth = options.auth === undefined ? adminUser.token : options.auth
      const hasCredential = Object.keys(headers).some((h) => ['authorization', 'x-api-key'].includes(h.toLowerCase()))
      if (auth !== null && !hasCredential) headers.authorization = `Bearer ${auth}`
      let body: string | Buffer | undefined
      if (typeof options.body === 'string' || Buffer.isBuffer(options.body)) body = options.body
      else if (options.body !== undefined) body = JSON.stringify(options.body)
      if (body !== undefined && !Object.keys(headers).some((h) => h.toLowerCase() === 'content-type')) {
        headers['content-type'] = method === 'PATCH' ? 'application/merge-patch+json' : 'application/json'
      }
      // Bounded, so a request the server never answers fails its test instead of holding the file (and a frozen
      // backend) forever.
      const res = await fetch(url + path, {
        method,
        headers,
        body,
        signal: AbortSignal.timeout(options.timeoutMs ?? REQUEST_TIMEOUT_MS),
      })
      const text = await res.text()
      const type = res.headers.get('content-type') ?? ''
      const parsed = /json/.test(type) && text ? JSON.parse(text) : undefined
      document ??= (await (await fetch(`${url}${config.apiPrefix}/openapi.json`)).json()) as never
      checkAgainstDocument(
        document!,
        router,
        method,
        path,
        config.apiPrefix,
        res.status,
        type,
        /json/.test(type) ? parsed : text || undefined,
      )
      return { status: res.status, headers: res.headers, text, body: parsed }
    },
  }
}
