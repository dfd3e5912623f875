import { randomBytes } from 'node:crypto'
import { signJwt } from '../../src/auth/jwt.js'
import { PASSWORD_HASH_COST } from '../../src/config.js'
import { PasswordHasher } from '../../src/auth/password.js'
import { loadConfig, type Config } from '../../src/config.js'
import { connect } from '../../src/core/db/connect.js'
import { migrate } from '../../src/core/db/migrate.js'
import { resolvePooler } from '../../src/core/db/pooler.js'
import { createLogger } from '../../src/core/log.js'
import { startLocalCluster } from '../../src/dev/local-cluster.js'
import { createService, type Service } from '../../src/service.js'
import type { FaultSection } from './section.js'

// Timing channels, at the production hash cost (PASSWORD_HASH_COST 15). The
// tests assert that an unknown account costs the work a known one does, in
// hashes and statements (test/auth-flows, test/login-lockout,
// test/account-recovery), and what a login flood leaves a client
// (test/auth-flows, test/login-abuse); this section shows the times a client
// measures, all from one run so that they compare:
// - a login with a wrong password, with an unknown e-mail and for an account
//   without a password (each 401 after one scrypt hash, a decoy's for the
//   last two);
// - a password reset for a known and an unknown address (202 before the
//   work), beside one refused before any work (422), the floor of this
//   machine's noise;
// - probes (GET /healthz, GET /products/{id}) and an owner's login from
//   another address, alone and during a flood of 100 logins for random
//   accounts from one address (2 hashing, 64 waiting, the rest turned away;
//   the queue serves addresses in turn): the ratios the tests once bounded,
//   the slowest probe at 20 times the median alone (test/auth-flows), the
//   owner's login at 10 times (test/login-abuse).
// One service in this process (createService) on a database of its own,
// created and migrated on DATABASE_URL's server (or the local cluster) and
// dropped at the end; TRUST_PROXY=1 and an address per attempt, so no
// failure count locks anything; RATE_LIMIT=0; mail taken by a transport that
// drops it. Requests go one at a time but the flood's, the cases of a
// comparison interleaved so that the machine's drift falls on all alike.

const ROUNDS = 11
const PROBES_ALONE = 20
const PROBE_EVERY_MS = 10
const FLOOD = 100
/** Logins the hash queue holds, running and waiting (PasswordHasher): the rest of a flood is answered at once. */
const QUEUE_HOLDS = 2 + 64
const OWNER_LOGINS = 3

const secret = randomBytes(32).toString('base64url')
let octet = 0
/** An address of its own for each attempt (X-Forwarded-For, TRUST_PROXY=1). */
const freshAddress = () => `198.51.${100 + Math.floor(++octet / 250)}.${octet % 250}`
const nobody = () => `nobody-${randomBytes(4).toString('hex')}@example.com`

interface Served {
  service: Service
  url: string
  config: Config
}

async function serve(databaseUrl: string): Promise<Served> {
  const loaded: Config = {
    ...loadConfig({
      PORT: '0',
      HOST: '127.0.0.1',
      LOG_LEVEL: 'error',
      JWT_SECRETS: `bench:${secret}`,
      RATE_LIMIT: '0',
      TRUST_PROXY: '1',
      PASSWORD_HASH_COST: String(PASSWORD_HASH_COST.default),
      PASSWORD_RESET_URL: 'https://app.example.com/reset?token={token}',
    }),
    databaseUrl,
  }
  const config: Config = { ...loaded, databasePooler: await resolvePooler({ ...loaded, databaseUrl }) }
  const service = createService(config, {
    log: createLogger('error', () => {}),
    mail: { transport: { name: 'hook', send: async () => {} } },
  })
  const { port } = await service.listen(0, '127.0.0.1')
  return { service, url: `http://127.0.0.1:${port}`, config }
}

interface Timed {
  status: number
  ms: number
}

/** One request and how long it took to its last byte. */
async function timed(url: string, method: string, body?: unknown, headers: Record<string, string> = {}) {
  const started = performance.now()
  const res = await fetch(url, {
    method,
    headers: { ...headers, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  await res.arrayBuffer()
  return { status: res.status, ms: performance.now() - started } satisfies Timed
}

const login = (on: Served, email: string, password: string, from = freshAddress()) =>
  timed(`${on.url}/auth/login`, 'POST', { email, password }, { 'x-forwarded-for': from })

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b)
  return (s[Math.floor((s.length - 1) / 2)]! + s[Math.ceil((s.length - 1) / 2)]!) / 2
}

type Cases = Record<string, { expect: number; run: () => Promise<Timed> }>

/** `cases` run ROUNDS times, interleaved; each answer must have its expected status. Times in ms by case. */
async function interleaved(cases: Cases): Promise<Map<string, number[]>> {
  const times = new Map(Object.keys(cases).map((name) => [name, [] as number[]]))
  for (let i = 0; i < ROUNDS; i++) {
    for (const [name, { expect, run }] of Object.entries(cases)) {
      const { status, ms } = await run()
      if (status !== expect) throw new Error(`timing channels: ${name} answered ${status}, not ${expect}`)
      times.get(name)!.push(ms)
    }
  }
  return times
}

/** A row per case: how many, its median, its slowest, and its median over the first case's. */
function rowsOf(flow: string, times: Map<string, number[]>): string[][] {
  const first = median([...times.values()][0]!)
  return [...times].map(([name, ms]) => [
    flow,
    name,
    String(ms.length),
    median(ms).toFixed(1),
    Math.max(...ms).toFixed(1),
    (median(ms) / first).toFixed(2),
  ])
}

async function loginRows(on: Served, email: string, withoutPassword: string): Promise<string[][]> {
  const wrong = () => `wrong-${randomBytes(4).toString('hex')}`
  return rowsOf(
    'POST /auth/login (401)',
    await interleaved({
      'wrong password': { expect: 401, run: () => login(on, email, wrong()) },
      'unknown e-mail': { expect: 401, run: () => login(on, nobody(), wrong()) },
      'account without a password': { expect: 401, run: () => login(on, withoutPassword, wrong()) },
    }),
  )
}

async function resetRows(on: Served, email: string): Promise<string[][]> {
  const reset = (body: unknown) => async () => {
    // Each answer alone: the work of the one before it is done.
    while (on.service.deps.recoveryRequests.held > 0) await new Promise((resolve) => setTimeout(resolve, 5))
    return timed(`${on.url}/auth/password-reset`, 'POST', body, { 'x-forwarded-for': freshAddress() })
  }
  return rowsOf(
    'POST /auth/password-reset',
    await interleaved({
      'known address (202)': { expect: 202, run: reset({ email }) },
      'unknown address (202)': { expect: 202, run: reset({ email: nobody() }) },
      'refused before any work (422)': { expect: 422, run: reset({ email: 1 }) },
    }),
  )
}

/** Logins for random accounts from one address, all at once; resolves once those past the queue are turned away. */
async function floodOfLogins(on: Served): Promise<{ flood: Promise<Timed[]>; settled: () => boolean }> {
  const attacker = freshAddress()
  let answered = 0
  let settled = false
  const flood = Promise.all(
    Array.from({ length: FLOOD }, async () => {
      const answer = await login(on, nobody(), 'whatever-1', attacker)
      answered++
      return answer
    }),
  ).finally(() => (settled = true))
  while (answered < FLOOD - QUEUE_HOLDS && !settled) await new Promise((resolve) => setTimeout(resolve, 5))
  return { flood, settled: () => settled }
}

/**
 * Probes and an owner's logins alone, then while one address floods logins: a probe every
 * PROBE_EVERY_MS and OWNER_LOGINS logins of the owner, one after another, until the flood is over.
 */
async function floodRows(on: Served, probe: () => Promise<Timed[]>, owner: () => Promise<Timed>): Promise<string[][]> {
  const probes = { alone: [] as number[], during: [] as number[] }
  const logins = { alone: [] as number[], during: [] as number[] }
  for (let i = 0; i < PROBES_ALONE; i++) for (const { ms } of await probe()) probes.alone.push(ms)
  for (let i = 0; i < OWNER_LOGINS; i++) logins.alone.push((await owner()).ms)
  const { flood, settled } = await floodOfLogins(on)
  const probing = (async () => {
    while (!settled()) {
      for (const { ms } of await probe()) probes.during.push(ms)
      await new Promise((resolve) => setTimeout(resolve, PROBE_EVERY_MS))
    }
  })()
  while (!settled() && logins.during.length < OWNER_LOGINS) logins.during.push((await owner()).ms)
  const turnedAway = (await flood).filter((a) => a.status === 429).length
  await probing
  const cases = ({ alone, during }: typeof probes) =>
    new Map([
      ['alone', alone],
      ['during the flood', during],
    ])
  return [
    ...rowsOf(`probes, a flood of ${FLOOD} logins (${turnedAway} turned away)`, cases(probes)),
    ...rowsOf("an owner's login, from another address", cases(logins)),
  ]
}

/** The service on a new database of DATABASE_URL's server, with what the section needs; both dropped after `work`. */
async function withService<T>(work: (on: Served) => Promise<T>): Promise<T> {
  const serverUrl = process.env.DATABASE_URL ?? startLocalCluster()
  const admin = connect(serverUrl, { max: 1, statementTimeoutMs: 60_000 })
  const name = `upa_bench_timing_${process.pid}`
  const url = new URL(serverUrl)
  url.pathname = `/${name}`
  let on: Served | undefined
  try {
    await admin`DROP DATABASE IF EXISTS ${admin(name)} WITH (FORCE)`
    await admin`CREATE DATABASE ${admin(name)}`
    const db = connect(url.toString(), { max: 1, statementTimeoutMs: 60_000 })
    try {
      await migrate(db)
    } finally {
      await db.end({ timeout: 5 })
    }
    on = await serve(url.toString())
    return await work(on)
  } finally {
    await on?.service.close()
    await admin`DROP DATABASE IF EXISTS ${admin(name)} WITH (FORCE)`
    await admin.end({ timeout: 5 })
  }
}

export function measure(): Promise<FaultSection> {
  return withService(async (on) => {
    const { sql } = on.service.deps
    const password = `pw-${randomBytes(6).toString('hex')}`
    const hash = await new PasswordHasher(PASSWORD_HASH_COST.default).hash(password)
    const [user] = await sql<[{ id: number; email: string }]>`
      INSERT INTO users (name, email, role, password_hash)
      VALUES ('Timing', ${`timing-${process.pid}@example.com`}, 'user', ${hash}) RETURNING id, email`
    const [bare] = await sql<[{ email: string }]>`
      INSERT INTO users (name, email, role)
      VALUES ('No password', ${`bare-${process.pid}@example.com`}, 'user') RETURNING email`
    const [product] = await sql<[{ id: number }]>`
      INSERT INTO products (sku, name, price, currency) VALUES ('TIMING-1', 'Timing', 100, 'EUR') RETURNING id`
    const now = Math.floor(Date.now() / 1000)
    // A session no session has and the epoch of a new user, as test/helpers/server.ts signs them.
    const token = signJwt(
      {
        sub: String(user.id),
        iss: on.config.jwtIssuer,
        aud: on.config.jwtAudience,
        iat: now,
        exp: now + 3600,
        role: 'user',
        scope: 'products:read',
        sid: String(2 ** 53),
        gen: 0,
      },
      on.config.jwtSecrets[0]!,
    )
    const probe = async () => [
      await timed(`${on.url}/healthz`, 'GET'),
      await timed(`${on.url}/products/${product.id}`, 'GET', undefined, { authorization: `Bearer ${token}` }),
    ]
    const owner = async () => {
      const answer = await login(on, user.email, password)
      if (answer.status !== 200) throw new Error(`timing channels: the owner's login answered ${answer.status}`)
      return answer
    }
    return {
      title: `Timing channels (PASSWORD_HASH_COST ${PASSWORD_HASH_COST.default})`,
      columns: ['flow', 'case', 'n', 'median ms', 'max ms', 'median / first case'],
      rows: [
        ...(await loginRows(on, user.email, bare.email)),
        ...(await resetRows(on, user.email)),
        ...(await floodRows(on, probe, owner)),
      ],
      note:
        'The tests assert equal work (hashes and statements) for known and unknown accounts, and what a client sees ' +
        'of a flood; these are the times. A login is one scrypt hash whatever the account; a reset answers before ' +
        'its work. During a flood the tests once bounded the slowest probe at max(1 s, 20 times the median alone) ' +
        "and an owner's login at 10 times its time alone; they now hold the queue full and assert the answers and " +
        'the order of service.',
    }
  })
}
