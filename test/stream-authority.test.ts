import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { afterEach, describe, test } from 'node:test'
import { CATCH_UP_TIMEOUT_MS, HEARTBEAT_MS } from '../src/auth/revocation/credential-changes.js'
import { MINUTE } from '../src/core/lib/durations.js'
import { passwordAccount, passwordLogin, type Account } from './helpers/accounts.js'
import { freezeBackend, instanceAndListener } from './helpers/freeze.js'
import { SseClient } from './helpers/sse.js'
import { startServer, type TestServer } from './helpers/server.js'
import { boundFrom, timed } from './helpers/time-bounds.js'
import { waitUntil } from './helpers/wait.js'

// An open GET /events/stream lives no longer than the authority that opened
// it. Attacks as a holder of a stream would see them: a stream opened with a
// JWT, an opaque token or an API key with events:read, on instance B, while
// its authority is withdrawn through instance A (logout, logout-all, a
// password change, demotion, deletion, the key deleted, an e-mail restore) or runs out (expiry,
// reached by moving the instance's clock, not by waiting). Each time: the
// stream ends, cleanly, within the contract's second (or five times what an
// event took from A to the stream, measured first in the same test, when the
// machine is slower: test/helpers/time-bounds.ts); not one event committed
// from the revocation on reaches it (the revocation's own user.updated or
// user.deleted included); and reconnecting with the same credential is
// refused, so that EventSource stops. An instance that cannot trust what it
// remembers checks streams against the database. Streams of others go on.

// A serves e-mail restores (its links need address verification on); its tokens are written here, as an address change
// would have.
const A = await startServer({
  VERIFY_EMAIL_URL: 'https://app.example.com/verify/{token}',
  EMAIL_RESTORE_URL: 'https://app.example.com/restore/{token}',
})
/** The instance holding the streams. */
const B = await startServer({}, {}, { databaseUrl: A.databaseUrl })
const { sql } = A

const INVALID_TOKEN = 'Bearer realm="api", error="invalid_token"'
const unique = () => randomBytes(5).toString('hex')

const clients: SseClient[] = []
afterEach(() => {
  for (const c of clients) c.close()
  clients.length = 0
})

const account = (role: 'admin' | 'user' = 'admin') => passwordAccount(A, role)
/** The access token of a password login. */
const login = async (who: Account, format: 'jwt' | 'opaque', on: TestServer = A) =>
  (await passwordLogin(on, who, format)).access_token

type Kind = 'jwt' | 'opaque' | 'api_key'

interface Held {
  kind: Kind
  headers: Record<string, string>
  /** The API key's id. */
  keyId?: number
}

/**
 * A credential of `who` that may read events, of `kind`, issued by `on`; an
 * API key (made through A) expires at `keyExpiresAt` (ms) when given.
 */
async function credential(who: Account, kind: Kind, on: TestServer = A, keyExpiresAt?: number): Promise<Held> {
  if (kind !== 'api_key') return { kind, headers: { authorization: `Bearer ${await login(who, kind, on)}` } }
  const auth = await login(who, 'jwt')
  const expiry = keyExpiresAt === undefined ? {} : { expires_at: new Date(keyExpiresAt).toISOString() }
  const body = { name: 'stream reader', scopes: ['events:read'], ...expiry }
  const res = await A.request('POST', '/api-keys', { auth, body })
  assert.equal(res.status, 201, res.text)
  return { kind, headers: { 'x-api-key': res.body.key }, keyId: res.body.id }
}

let serial = 0
async function createProduct(): Promise<number> {
  const res = await A.request('POST', '/products', {
    body: {
      sku: `AUTH-${process.pid}-${++serial}`,
      name: 'Widget',
      description: 'x',
      price: 1,
      currency: 'EUR',
      stock: 1,
    },
  })
  assert.equal(res.status, 201, res.text)
  await A.published()
  const [row] = await sql<
    [{ id: number }]
  >`SELECT max(id)::bigint AS id FROM events WHERE subject_type = 'product' AND subject_id = ${String(res.body.id)}`
  return row.id
}

const newestId = async () => {
  await A.published()
  return (await sql<[{ id: number }]>`SELECT coalesce(max(id), 0)::bigint AS id FROM events`)[0].id
}

/** `events` each committed through A and received by every one of `streams`. */
async function received(streams: readonly SseClient[], events = 1): Promise<void> {
  for (let i = 0; i < events; i++) {
    const id = await createProduct()
    for (const c of streams) await c.waitFor(() => c.ids.includes(id), 5000, `event ${id}`)
  }
}

interface Followed {
  stream: SseClient
  /** How long an event took from its POST to A until this stream had it: the baseline of the bounds on its end. */
  eventMs: number
}

/** Streams on `server`, one per credential, that are live: an event committed after they opened has reached each. */
async function followAll(server: TestServer, helds: readonly Held[]): Promise<Followed[]> {
  const streams = await Promise.all(
    helds.map(async (held) => {
      const c = await SseClient.open(server.url, '/events/stream', { headers: held.headers })
      clients.push(c)
      assert.equal(c.status, 200, c.text)
      await c.waitFor(() => c.retry !== undefined, 5000, 'retry:')
      return c
    }),
  )
  const eventMs = await timed(() => received(streams))
  return streams.map((stream) => ({ stream, eventMs }))
}

const follow = async (server: TestServer, held: Held): Promise<Followed> => (await followAll(server, [held]))[0]!

/** The stream ends cleanly within `withinMs` of `from`; how long it took. */
async function ends(c: SseClient, withinMs: number, from = performance.now()): Promise<number> {
  const end = await c.endedWithin(from + withinMs - performance.now())
  const took = performance.now() - from
  assert.ok(end, `the stream still runs ${Math.round(took)} ms later (bound ${Math.round(withinMs)} ms)`)
  assert.deepEqual(end, { clean: true })
  return took
}

/** Reconnecting as EventSource would (Last-Event-ID and all) is refused with `status`, and streams nothing. */
async function refused(server: TestServer, held: Held, last: SseClient, status: 401 | 403): Promise<void> {
  const again = await SseClient.open(server.url, '/events/stream', {
    headers: { ...held.headers, 'last-event-id': last.ids.at(-1)!.toString() },
  })
  clients.push(again)
  await again.ended
  assert.equal(again.status, status, again.text)
  assert.match(again.headers['content-type']!, /^application\/problem\+json/)
  if (status === 401) assert.equal(again.headers['www-authenticate'], INVALID_TOKEN)
  assert.equal(again.count, 0)
}

/**
 * The instance logged `times` streams' ends with this reason, for this user (once its side of each connection closed).
 */
async function logged(server: TestServer, who: Account, reason: string, times = 1): Promise<void> {
  const line = (l: Record<string, unknown>) =>
    l.msg === 'event stream closed' && l.reason === reason && l.user_id === String(who.id)
  const what = `${times} "event stream closed" lines, ${reason}, for user ${who.id}`
  await waitUntil(what, () => server.logs.filter(line).length >= times, 5000)
}

interface Withdrawal {
  name: string
  kinds: Kind[]
  /**
   * Withdraws `who`'s authority through A; `held` is the stream's credential, `session` an opaque token of another
   * session of `who`.
   */
  withdraw(who: Account, held: Held, session: string): Promise<void>
  /** What a reconnection gets, by kind. */
  status(kind: Kind): 401 | 403
  reason(kind: Kind): string
}

const ok = (res: { status: number; text: string }, status = 204) => assert.equal(res.status, status, res.text)

const withdrawals: Withdrawal[] = [
  {
    name: "logout with the stream's own token",
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
      ok(
        await A.request('PATCH', `/users/${who.id}`, {
          auth: session,
          body: { password: `new-${unique()}`, current_password: who.password },
        }),
        200,
      ),
    status: () => 401,
    reason: () => 'credential_revoked',
  },
  {
    // A JWT carries its role, so demotion revokes it; an opaque token
    // and a key see the new role, which lacks events:read.
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
    name: 'an e-mail restore with the link sent to the old address',
    kinds: ['jwt', 'opaque', 'api_key'],
    withdraw: async (who) => {
      const token = `upa_ot_${randomBytes(32).toString('base64url')}`
      await sql`
        INSERT INTO one_time_tokens (purpose, user_id, token_hash, email, expires_at)
        VALUES ('email_restore', ${who.id}, ${createHash('sha256').update(token).digest()},
          ${`before-${unique()}@example.com`}, now() + interval '7 days')`
      ok(await A.request('POST', '/auth/email-restore', { auth: null, body: { token } }))
    },
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

describe(
  'a stream on B ends when its authority is withdrawn through A; nothing committed from then on reaches it; ' +
    'reconnecting is refused',
  () => {
    for (const w of withdrawals) {
      for (const kind of w.kinds) {
        test(`${w.name}, ${kind}`, async (t) => {
          const who = await account()
          const held = await credential(who, kind)
          const session = await login(who, 'opaque')
          const { stream: c, eventMs } = await follow(B, held)
          const within = boundFrom(eventMs)
          const before = await newestId()
          await w.withdraw(who, held, session)
          // From the withdrawal's answer (a password change spends its hash before it).
          const from = performance.now()
          // Committed after the withdrawal: it must not reach the stream, whenever the stream notices.
          const after = await createProduct()
          const took = await ends(c, within, from)
          t.diagnostic(
            `ended ${Math.round(took)} ms after the withdrawal's answer (bound ${Math.round(within)} ms; ` +
              `an event took ${Math.round(eventMs)} ms)`,
          )
          assert.ok(after > before)
          assert.deepEqual(
            c.ids.filter((id) => id > before),
            [],
            'events committed from the withdrawal on were sent',
          )
          await logged(B, who, w.reason(kind))
          await refused(B, held, c, w.status(kind))
        })
      }
    }
  },
)

describe('expiry', () => {
  test(
    'a stream opened with a JWT, an opaque token or an API key ends at its expiry, not before, and cannot be ' +
      'reopened with it',
    async (t) => {
      // An instance of its own, whose clock goes on to each expiry in turn: A's and B's stay with the database's.
      const E = await startServer({}, {}, { databaseUrl: A.databaseUrl })
      const who = await account()
      // The opaque token (its expiry is the database's time) first, the JWT (the clock's) two minutes of E's clock
      // later, the key in half an hour: each expiry comes alone.
      const opaque = await credential(who, 'opaque', E)
      E.clock.advance(2 * MINUTE)
      const jwt = await credential(who, 'jwt', E)
      const key = await credential(who, 'api_key', E, E.clock.now() + 30 * MINUTE)
      const helds = [opaque, jwt, key]
      const expiries = await Promise.all(
        helds.map(async (held) => {
          const me = await E.request('GET', '/auth/me', { headers: held.headers })
          assert.equal(me.status, 200, me.text)
          return Date.parse(me.body.credential.expires_at)
        }),
      )
      const streams = await followAll(E, helds)
      const open = new Set(streams.map((s) => s.stream))
      const roundMs = E.deps.eventHub.settings.authorityCheckMs
      for (const [i, { stream, eventMs }] of streams.entries()) {
        const expiresAt = expiries[i]!
        const kind = helds[i]!.kind
        // Not before: with the clock short of the expiry by what an event's trip may take, a check passes it.
        const margin = boundFrom(eventMs)
        E.clock.advance(expiresAt - margin - E.clock.now())
        await received([...open])
        // At the expiry (a JWT's exp in whole seconds, the others' to the millisecond): the next round ends it.
        E.clock.advance(expiresAt - E.clock.now())
        const took = await ends(stream, roundMs + margin)
        t.diagnostic(`${kind}: ended ${Math.round(took)} ms after the clock reached its expiry (rounds: ${roundMs} ms)`)
        open.delete(stream)
        await logged(E, who, 'credential_expired', i + 1)
      }
      // The database's time passes as E's clock did: the opaque token and the key have expired there too.
      const passed = E.clock.now() - Date.now()
      await sql`UPDATE access_tokens SET expires_at = expires_at - ${passed} * interval '1 millisecond'
      WHERE session_id IN (SELECT id FROM sessions WHERE user_id = ${who.id})`
      await sql`UPDATE api_keys SET expires_at = expires_at - ${passed} * interval '1 millisecond'
      WHERE id = ${key.keyId!}`
      for (const [i, held] of helds.entries()) await refused(E, held, streams[i]!.stream, 401)
    },
  )

  test(
    'a JWT past its exp but within the clock leeway requests accept is refused a stream: it would end at ' + 'once',
    async () => {
      const jwt = B.jwtFor(B.admin.id, 'admin', undefined, { exp: Math.floor(B.clock.now() / 1000) - 2 })
      assert.equal(
        (await B.request('GET', '/auth/me', { auth: jwt })).status,
        200,
        'within the leeway a request is let in',
      )
      const res = await B.request('GET', '/events/stream', { auth: jwt })
      assert.equal(res.status, 401, res.text)
      assert.equal(res.headers.get('www-authenticate'), INVALID_TOKEN)
    },
  )
})

describe('others, and the cost', () => {
  test(
    "withdrawing one user's authority ends that user's streams only: another admin's streams, of every kind, go " +
      'on',
    async () => {
      const [victim, bystander] = [await account(), await account()]
      const kinds = ['jwt', 'opaque', 'api_key'] as const
      const helds = await Promise.all(kinds.map((kind) => credential(bystander, kind)))
      const theirs = (await followAll(B, helds)).map((f) => f.stream)
      const { stream: doomed, eventMs } = await follow(B, await credential(victim, 'opaque'))
      ok(await A.request('DELETE', `/users/${victim.id}`))
      await ends(doomed, boundFrom(eventMs))
      // Three checks of every stream since: an event is written to a stream only once it has passed a check begun
      // after the event was read.
      await received(theirs, 3)
      for (const c of theirs) assert.equal(c.res.complete, false, 'still open')
    },
  )

  test(
    'checking the authority of twenty opaque-token streams costs the statements that checking one ' + 'does',
    async (t) => {
      const who = await account()
      // B's statements while events reach every stream: per event its read, and the check of every stream
      // before it is written.
      const perEvent = async (streams: readonly Followed[], events = 5) => {
        const before = B.deps.metrics.queries
        await received(
          streams.map((f) => f.stream),
          events,
        )
        return (B.deps.metrics.queries - before) / events
      }
      const first = await follow(B, await credential(who, 'opaque'))
      const one = await perEvent([first])
      const more = await followAll(B, await Promise.all(Array.from({ length: 19 }, () => credential(who, 'opaque'))))
      const twenty = await perEvent([first, ...more])
      t.diagnostic(`${one} statements an event with one stream open, ${twenty} with twenty`)
      assert.ok(twenty <= one * 2 + 2, `${one} statements an event for one stream, ${twenty} for twenty`)
    },
  )
})

describe('an instance that cannot trust what it remembers', () => {
  test(
    'its listener frozen: a JWT revoked elsewhere ends its stream there all the same (read from the database), ' +
      'with nothing committed since',
    async (t) => {
      const { instance: C, listener: pid } = await instanceAndListener(A)
      const who = await account()
      const held = await credential(who, 'jwt')
      const { stream: c, eventMs } = await follow(C, held)
      const thaw = await freezeBackend(sql, pid)
      if (!thaw) return t.skip('the database server is not a process of this machine')
      try {
        // The heartbeat's bound (test/revocation.test.ts holds an instance to it); here only the state matters.
        const distrusted = () => !C.deps.credentialChanges.trusted
        await waitUntil('C stops trusting its memory', distrusted, HEARTBEAT_MS + CATCH_UP_TIMEOUT_MS + 10_000)
        const session = await login(who, 'opaque')
        const before = await newestId()
        ok(await A.request('POST', '/auth/logout-all', { auth: session }))
        await createProduct()
        // C's listener is the frozen one, so no notification wakes its reader: a round of its period ends the stream.
        await ends(c, C.deps.eventHub.settings.authorityCheckMs + boundFrom(eventMs))
        // C heard nothing: what ended the stream was the database.
        assert.equal(C.deps.credentialChanges.trusted, false)
        const [{ epoch }] = await sql<
          [{ epoch: number }]
        >`SELECT credential_epoch AS epoch FROM users WHERE id = ${who.id}`
        assert.ok(epoch > 0)
        assert.equal(C.deps.revocations.revokes(who.id, 0, 0), false, 'C does not know of the logout-all')
        assert.deepEqual(
          c.ids.filter((id) => id > before),
          [],
        )
        await logged(C, who, 'credential_revoked')
      } finally {
        thaw()
      }
    },
  )
})
