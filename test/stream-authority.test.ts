import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { afterEach, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { CATCH_UP_TIMEOUT_MS, HEARTBEAT_MS } from '../src/auth/credential-changes.js'
import { passwordAccount, passwordLogin, type Account } from './helpers/accounts.js'
import { freezeBackend, instanceAndListener } from './helpers/freeze.js'
import { SseClient } from './helpers/sse.js'
import { startServer, type TestServer } from './helpers/server.js'

// An open GET /events/stream lives no longer than the authority that opened
// it. Attacks as a holder of a stream would see them: a stream opened with a
// JWT, an opaque token or an API key with events:read, on instance B, while
// its authority is withdrawn through instance A (logout, logout-all, a
// password change, demotion, deletion, the key deleted) or runs out (expiry).
// Each time: the stream ends, cleanly, within a generous bound; not one
// event committed from the revocation on reaches it (the revocation's own
// user.updated or user.deleted included); and reconnecting with the same
// credential is refused, so that EventSource stops. An instance that cannot
// trust what it remembers checks streams against the database. Streams of
// others go on.

const A = await startServer()
/** The instance holding the streams; the tokens it issues expire in 3 s, for the expiry attacks. */
const TTL_S = 3
const B = await startServer({ ACCESS_TOKEN_TTL: String(TTL_S) }, {}, { databaseUrl: A.databaseUrl })
const { sql } = A

/** How long a withdrawn stream may take to end: the contract says a second; a busy CI machine gets three. */
const END_BOUND_MS = 3000
const INVALID_TOKEN = 'Bearer realm="api", error="invalid_token"'
const unique = () => randomBytes(5).toString('hex')

const clients: SseClient[] = []
afterEach(() => {
  for (const c of clients) c.close()
  clients.length = 0
})

const account = (role: 'admin' | 'user' = 'admin') => passwordAccount(A, role)
/** The access token of a password login. */
const login = async (who: Account, format: 'jwt' | 'opaque', on: TestServer = A) => (await passwordLogin(on, who, format)).access_token

type Kind = 'jwt' | 'opaque' | 'api_key'

interface Held {
  kind: Kind
  headers: Record<string, string>
  /** The API key's id. */
  keyId?: number
}

/** A credential of `who` that may read events. */
/** A credential of `kind`; an API key lives `keyTtlMs` from its creation when given (counted once the login before it is done: a login's hash takes seconds on a busy machine). */
async function credential(who: Account, kind: Kind, on: TestServer = A, keyTtlMs?: number): Promise<Held> {
  if (kind !== 'api_key') return { kind, headers: { authorization: `Bearer ${await login(who, kind, on)}` } }
  const auth = await login(who, 'jwt')
  const res = await A.request('POST', '/api-keys', {
    auth,
    body: { name: 'stream reader', scopes: ['events:read'], ...(keyTtlMs ? { expires_at: new Date(Date.now() + keyTtlMs).toISOString() } : {}) },
  })
  assert.equal(res.status, 201, res.text)
  return { kind, headers: { 'x-api-key': res.body.key }, keyId: res.body.id }
}

let serial = 0
async function createProduct(): Promise<number> {
  const res = await A.request('POST', '/products', { body: { sku: `AUTH-${process.pid}-${++serial}`, name: 'Widget', description: 'x', price: 1, currency: 'EUR', stock: 1 } })
  assert.equal(res.status, 201, res.text)
  await A.published()
  const [row] = await sql<[{ id: number }]>`SELECT max(id)::bigint AS id FROM events WHERE subject_type = 'product' AND subject_id = ${String(res.body.id)}`
  return row.id
}

const newestId = async () => {
  await A.published()
  return (await sql<[{ id: number }]>`SELECT coalesce(max(id), 0)::bigint AS id FROM events`)[0].id
}

/** A stream on `server` that is live: an event committed after it opened has reached it. */
async function follow(server: TestServer, held: Held): Promise<SseClient> {
  const c = await SseClient.open(server.url, '/events/stream', { headers: held.headers })
  clients.push(c)
  assert.equal(c.status, 200, c.text)
  await c.waitFor(() => c.retry !== undefined, 5000, 'retry:')
  const id = await createProduct()
  await c.waitFor(() => c.ids.includes(id), 5000, `event ${id}`)
  return c
}

/** The stream ends cleanly within END_BOUND_MS; how long it took. */
async function ends(c: SseClient, from = performance.now()): Promise<number> {
  const end = await Promise.race([c.ended, sleep(END_BOUND_MS + 1000).then(() => undefined)])
  assert.ok(end, `the stream still runs ${END_BOUND_MS + 1000} ms later`)
  const took = performance.now() - from
  assert.ok(took < END_BOUND_MS, `ended after ${Math.round(took)} ms`)
  assert.deepEqual(end, { clean: true })
  return took
}

/** Reconnecting as EventSource would (Last-Event-ID and all) is refused with `status`, and streams nothing. */
async function refused(server: TestServer, held: Held, last: SseClient, status: 401 | 403): Promise<void> {
  const again = await SseClient.open(server.url, '/events/stream', { headers: { ...held.headers, 'last-event-id': last.ids.at(-1)!.toString() } })
  clients.push(again)
  await again.ended
  assert.equal(again.status, status, again.text)
  assert.match(again.headers['content-type']!, /^application\/problem\+json/)
  if (status === 401) assert.equal(again.headers['www-authenticate'], INVALID_TOKEN)
  assert.equal(again.count, 0)
}

/** B logged the stream's end with this reason, for this user. */
function logged(server: TestServer, who: Account, reason: string): void {
  assert.ok(
    server.logs.some((l) => l.msg === 'event stream closed' && l.reason === reason && l.user_id === String(who.id)),
    `no "event stream closed" line with reason ${reason} for user ${who.id}`,
  )
}

interface Withdrawal {
  name: string
  kinds: Kind[]
  /** Withdraws `who`'s authority through A; `held` is the stream's credential, `session` an opaque token of another session of `who`. */
  withdraw(who: Account, held: Held, session: string): Promise<void>
  /** What a reconnection gets, by kind. */
  status(kind: Kind): 401 | 403
  reason(kind: Kind): string
}

const ok = (res: { status: number; text: string }, status = 204) => assert.equal(res.status, status, res.text)

const withdrawals: Withdrawal[] = [
  {
    name: 'logout with the stream\'s own token',
    kinds: ['jwt', 'opaque'],
    withdraw: async (_, held) => ok(await A.request('POST', '/auth/logout', { headers: held.headers })),
    status: () => 401,
    reason: () => 'credential_revoked',
  },
  {
    name: 'logout-all from another session',
    kinds: ['jwt', 'opaque'],
    withdraw: async (_, __, session) => ok(await A.request('POST', '/auth/logout-all', { auth: session })),
    status: () => 401,
    reason: () => 'credential_revoked',
  },
  {
    name: 'a password change from another session',
    kinds: ['jwt', 'opaque'],
    withdraw: async (who, _, session) =>
      ok(await A.request('PATCH', `/users/${who.id}`, { auth: session, body: { password: `new-${unique()}`, current_password: who.password } }), 200),
    status: () => 401,
    reason: () => 'credential_revoked',
  },
  {
    // A JWT carries its role, so demotion revokes it; an opaque token and a key see the new role, which lacks events:read.
    name: 'demotion of the admin',
    kinds: ['jwt', 'opaque', 'api_key'],
    withdraw: async (who) => ok(await A.request('PATCH', `/users/${who.id}`, { body: { role: 'user' } }), 200),
    status: (kind) => (kind === 'jwt' ? 401 : 403),
    reason: (kind) => (kind === 'jwt' ? 'credential_revoked' : 'access_withdrawn'),
  },
  {
    name: 'deletion of the user',
    kinds: ['jwt', 'opaque', 'api_key'],
    withdraw: async (who) => ok(await A.request('DELETE', `/users/${who.id}`)),
    status: () => 401,
    reason: () => 'credential_revoked',
  },
  {
    name: 'the API key deleted',
    kinds: ['api_key'],
    withdraw: async (_, held, session) => ok(await A.request('DELETE', `/api-keys/${held.keyId}`, { auth: session })),
    status: () => 401,
    reason: () => 'credential_revoked',
  },
]

describe('a stream on B ends when its authority is withdrawn through A; nothing committed from then on reaches it; reconnecting is refused', () => {
  for (const w of withdrawals) {
    for (const kind of w.kinds) {
      test(`${w.name}, ${kind}`, async (t) => {
        const who = await account()
        const held = await credential(who, kind)
        const session = await login(who, 'opaque')
        const c = await follow(B, held)
        const before = await newestId()
        await w.withdraw(who, held, session)
        // From the withdrawal's answer (a password change spends a second on its hash before it).
        const from = performance.now()
        // Committed after the withdrawal: it must not reach the stream, whenever the stream notices.
        const after = await createProduct()
        const took = await ends(c, from)
        t.diagnostic(`ended ${Math.round(took)} ms after the withdrawal's answer`)
        assert.ok(after > before)
        assert.deepEqual(c.ids.filter((id) => id > before), [], 'events committed from the withdrawal on were sent')
        logged(B, who, w.reason(kind))
        await refused(B, held, c, w.status(kind))
      })
    }
  }
})

describe('expiry', () => {
  // The three kinds at once: each waits for its credential to run out, and the waits need not add up.
  test('a stream opened with a JWT, an opaque token or an API key ends at its expiry, not before, and cannot be reopened with it', async () => {
    await Promise.all((['jwt', 'opaque', 'api_key'] as const).map(async (kind) => {
      const who = await account()
      // Tokens issued by B live TTL_S seconds; the key is given as long.
      const held = await credential(who, kind, B, TTL_S * 1000)
      const me = await B.request('GET', '/auth/me', { headers: held.headers })
      assert.equal(me.status, 200, me.text)
      const expiresAt = Date.parse(me.body.credential.expires_at)
      const c = await follow(B, held)
      assert.ok(Date.now() < expiresAt, 'the stream was live before the expiry')
      const end = await Promise.race([c.ended, sleep(expiresAt - Date.now() + END_BOUND_MS).then(() => undefined)])
      assert.deepEqual(end, { clean: true }, `still streaming ${END_BOUND_MS} ms after the expiry`)
      // exp is in whole seconds for a JWT; a timestamp's milliseconds for the others. Never before.
      assert.ok(Date.now() >= expiresAt, `ended ${expiresAt - Date.now()} ms before the expiry`)
      logged(B, who, 'credential_expired')
      await refused(B, held, c, 401)
    }))
  })

  test('a JWT past its exp but within the clock leeway requests accept is refused a stream: it would end at once', async () => {
    const jwt = B.jwtFor(B.admin.id, 'admin', undefined, { exp: Math.floor(Date.now() / 1000) - 2 })
    assert.equal((await B.request('GET', '/auth/me', { auth: jwt })).status, 200, 'within the leeway a request is let in')
    const res = await B.request('GET', '/events/stream', { auth: jwt })
    assert.equal(res.status, 401, res.text)
    assert.equal(res.headers.get('www-authenticate'), INVALID_TOKEN)
  })
})

describe('others, and the cost', () => {
  test('withdrawing one user\'s authority ends that user\'s streams only: another admin\'s streams, of every kind, go on', async () => {
    const [victim, bystander] = [await account(), await account()]
    const theirs = await Promise.all((['jwt', 'opaque', 'api_key'] as const).map(async (kind) => follow(B, await credential(bystander, kind))))
    const doomed = await follow(B, await credential(victim, 'opaque'))
    ok(await A.request('DELETE', `/users/${victim.id}`))
    await ends(doomed)
    const id = await createProduct()
    for (const c of theirs) await c.waitFor(() => c.ids.includes(id), 5000, `event ${id}`)
    // Two more checks of every stream since.
    await sleep(1200)
    for (const c of theirs) assert.equal(c.res.complete, false, 'still open')
  })

  test('checking streams costs the same few statements a second for twenty opaque-token streams as for one', async (t) => {
    const who = await account()
    const rate = async () => {
      const before = B.deps.metrics.queries
      await sleep(2000)
      return (B.deps.metrics.queries - before) / 2
    }
    await follow(B, await credential(who, 'opaque'))
    const one = await rate()
    for (let i = 0; i < 19; i++) await follow(B, await credential(who, 'opaque'))
    const twenty = await rate()
    t.diagnostic(`${one} statements a second with one stream open, ${twenty} with twenty`)
    assert.ok(twenty <= one * 2 + 2, `${one} statements a second for one stream, ${twenty} for twenty`)
  })
})

describe('an instance that cannot trust what it remembers', () => {
  test('its listener frozen: a JWT revoked elsewhere ends its stream there all the same (read from the database), with nothing committed since', async (t) => {
    const { instance: C, listener: pid } = await instanceAndListener(A)
    const who = await account()
    const held = await credential(who, 'jwt')
    const c = await follow(C, held)
    const thaw = await freezeBackend(sql, pid)
    if (!thaw) return t.skip('the database server is not a process of this machine')
    try {
      const deadline = performance.now() + HEARTBEAT_MS + CATCH_UP_TIMEOUT_MS + 3000
      while (C.deps.credentialChanges.trusted) {
        assert.ok(performance.now() < deadline, 'C still trusts its memory')
        await sleep(20)
      }
      const session = await login(who, 'opaque')
      const before = await newestId()
      ok(await A.request('POST', '/auth/logout-all', { auth: session }))
      await createProduct()
      await ends(c)
      // C heard nothing: what ended the stream was the database.
      assert.equal(C.deps.credentialChanges.trusted, false)
      const [{ epoch }] = await sql<[{ epoch: number }]>`SELECT credential_epoch AS epoch FROM users WHERE id = ${who.id}`
      assert.ok(epoch > 0)
      assert.equal(C.deps.revocations.revokes(who.id, 0, 0), false, 'C does not know of the logout-all')
      assert.deepEqual(c.ids.filter((id) => id > before), [])
      logged(C, who, 'credential_revoked')
    } finally {
      thaw()
    }
  })
})
