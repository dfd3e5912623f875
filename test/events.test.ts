import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { testPasswords } from './helpers/passwords.js'
import { recordEvents } from '../src/core/resources/change-events.js'
import { createOrResetAdmin } from '../src/users/admin-bootstrap.js'
import type { TransactionSql } from 'postgres'
import { startServer, type TestResponse } from './helpers/server.js'

// Events through the real server: every write records exactly its event, in
// its transaction (a refused or rolled-back write records none), with the
// actor, the request id and the subject as GET shows it, never a secret;
// GET /events lists them in commit order, and a reader following it never
// skips an event that commits late; retention deletes old ones in batches.
//
// Top-level tests run one after another, so a test may rely on what it arranged.

const api = await startServer({}, {}, { tuning: { retention: { batchSize: 7, pauseMs: 1 } } })
const { sql } = api
const unique = () => randomBytes(4).toString('hex')
/** Every password, token and key this file handles: none may appear in an event. */
const secrets = new Set<string>()
const keep = <T extends string>(secret: T) => (secrets.add(secret), secret)

interface Event {
  id: number
  type: string
  occurred_at: string
  subject: { type: string; id: number | null }
  actor: { user_id: number | null; credential: string | null }
  request_id: string | null
  data: Record<string, unknown>
}

/** The id of the last published event, the point a test's own events come after. */
async function head(): Promise<number> {
  await api.published()
  const [row] = await sql<[{ id: number | null }]>`SELECT max(id) AS id FROM events`
  return row.id ?? 0
}

/** Every event after `since`, through GET /events, following its Link headers. */
async function eventsAfter(since: number, filter = ''): Promise<Event[]> {
  const found: Event[] = []
  let path: string | undefined = `/events?id[gt]=${since}&limit=200${filter}`
  while (path) {
    const res = await api.request('GET', path)
    assert.equal(res.status, 200, res.text)
    found.push(...(res.body as Event[]))
    path = /<([^>]+)>; rel="next"/.exec(res.headers.get('link') ?? '')?.[1]
  }
  return found
}

/** Runs `write`, then returns the events it recorded (and only those: tests run one at a time). */
async function eventsOf(
  write: () => Promise<TestResponse | void>,
): Promise<{ events: Event[]; res: TestResponse | void }> {
  const since = await head()
  const res = await write()
  await api.published()
  return { events: await eventsAfter(since), res }
}

function assertOneEvent(
  events: Event[],
  expected: { type: string; subject: Event['subject']; actor: Event['actor']; request_id?: string | null },
): Event {
  assert.equal(events.length, 1, `expected exactly one event, got ${JSON.stringify(events.map((e) => e.type))}`)
  const [event] = events
  assert.equal(event!.type, expected.type)
  assert.deepEqual(event!.subject, expected.subject)
  assert.deepEqual(event!.actor, expected.actor)
  if (expected.request_id !== undefined) assert.equal(event!.request_id, expected.request_id)
  assert.match(event!.occurred_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/)
  return event!
}

const asAdmin = { user_id: api.admin.id, credential: 'jwt' }
const newProduct = () => ({
  sku: `EV-${unique()}`,
  name: 'Evented',
  price: 1250,
  currency: 'EUR',
  description: 'Line one\nline "two" \\ ü',
})
const requestIdOf = (res: TestResponse | void) => res!.headers.get('x-request-id')

describe('a write records exactly its event, with the subject as GET shows it', () => {
  test(
    'products: created, updated (PATCH and PUT), deleted; a PATCH that changes nothing records ' + 'nothing',
    async () => {
      const created = await eventsOf(() => api.request('POST', '/products', { body: newProduct() }))
      const product = (created.res as TestResponse).body
      const event = assertOneEvent(created.events, {
        type: 'product.created',
        subject: { type: 'product', id: product.id },
        actor: asAdmin,
        request_id: requestIdOf(created.res),
      })
      assert.deepEqual(event.data, product)

      const patched = await eventsOf(() =>
        api.request('PATCH', `/products/${product.id}`, {
          body: { price: 99 },
          headers: { 'if-match': created.res!.headers.get('etag')! },
        }),
      )
      assert.equal(patched.res!.status, 200)
      const update = assertOneEvent(patched.events, {
        type: 'product.updated',
        subject: { type: 'product', id: product.id },
        actor: asAdmin,
        request_id: requestIdOf(patched.res),
      })
      assert.deepEqual(update.data, (await api.request('GET', `/products/${product.id}`)).body)
      assert.equal(update.data.price, 99)

      const replaced = await eventsOf(() =>
        api.request('PUT', `/products/${product.id}`, {
          body: { ...newProduct(), sku: product.sku, price: 7 },
          headers: { 'if-match': patched.res!.headers.get('etag')! },
        }),
      )
      assert.equal(replaced.res!.status, 200)
      assert.equal(
        assertOneEvent(replaced.events, {
          type: 'product.updated',
          subject: { type: 'product', id: product.id },
          actor: asAdmin,
        }).data.price,
        7,
      )

      const unchanged = await eventsOf(() =>
        api.request('PATCH', `/products/${product.id}`, {
          body: {},
          headers: { 'if-match': replaced.res!.headers.get('etag')! },
        }),
      )
      assert.equal(unchanged.res!.status, 200)
      assert.deepEqual(unchanged.events, [])

      const last = (await api.request('GET', `/products/${product.id}`)).body
      const deleted = await eventsOf(() =>
        api.request('DELETE', `/products/${product.id}`, {
          headers: { 'if-match': replaced.res!.headers.get('etag')! },
        }),
      )
      assert.equal(deleted.res!.status, 204)
      // A deletion's data is the subject as it was.
      assert.deepEqual(
        assertOneEvent(deleted.events, {
          type: 'product.deleted',
          subject: { type: 'product', id: product.id },
          actor: asAdmin,
          request_id: requestIdOf(deleted.res),
        }).data,
        last,
      )
    },
  )

  test('users: created, updated, deleted; the data has no password or hash', async () => {
    const email = `ev-${unique()}@example.com`
    const created = await eventsOf(() =>
      api.request('POST', '/users', { body: { name: 'Eve Vent', email, password: 'correct horse battery' } }),
    )
    const user = (created.res as TestResponse).body
    assert.deepEqual(
      assertOneEvent(created.events, { type: 'user.created', subject: { type: 'user', id: user.id }, actor: asAdmin })
        .data,
      user,
    )
    assert.equal(Object.hasOwn(created.events[0]!.data, 'password'), false)
    assert.equal(Object.hasOwn(created.events[0]!.data, 'password_hash'), false)

    const renamed = await eventsOf(() =>
      api.request('PATCH', `/users/${user.id}`, {
        body: { name: 'Eve Renamed' },
        headers: { 'if-match': created.res!.headers.get('etag')! },
      }),
    )
    assert.equal(
      assertOneEvent(renamed.events, { type: 'user.updated', subject: { type: 'user', id: user.id }, actor: asAdmin })
        .data.name,
      'Eve Renamed',
    )

    const deleted = await eventsOf(() =>
      api.request('DELETE', `/users/${user.id}`, { headers: { 'if-match': renamed.res!.headers.get('etag')! } }),
    )
    assert.equal(deleted.res!.status, 204)
    assertOneEvent(deleted.events, { type: 'user.deleted', subject: { type: 'user', id: user.id }, actor: asAdmin })
  })

  test('API keys: created (never the key) and revoked; a write with the key names the api_key credential', async () => {
    const created = await eventsOf(() =>
      api.request('POST', '/api-keys', { body: { name: 'ci', scopes: ['products:read', 'products:write'] } }),
    )
    const { key, ...shown } = (created.res as TestResponse).body
    keep(key)
    const event = assertOneEvent(created.events, {
      type: 'api_key.created',
      subject: { type: 'api_key', id: shown.id },
      actor: asAdmin,
    })
    assert.deepEqual(event.data, shown)
    assert.deepEqual(event.data, (await api.request('GET', `/api-keys/${shown.id}`)).body)

    const byKey = await eventsOf(() =>
      api.request('POST', '/products', { body: newProduct(), headers: { 'x-api-key': key } }),
    )
    assert.equal(byKey.res!.status, 201)
    assertOneEvent(byKey.events, {
      type: 'product.created',
      subject: { type: 'product', id: (byKey.res as TestResponse).body.id },
      actor: { user_id: api.admin.id, credential: 'api_key' },
    })

    const revoked = await eventsOf(() => api.request('DELETE', `/api-keys/${shown.id}`))
    assert.equal(revoked.res!.status, 204)
    assertOneEvent(revoked.events, {
      type: 'api_key.revoked',
      subject: { type: 'api_key', id: shown.id },
      actor: asAdmin,
    })
  })

  test(
    'sessions: a login creates one (actor: the user, by password), logout and DELETE /auth/sessions/{id} revoke ' +
      'one, logout-all each',
    async () => {
      const pw = keep('a-good-password-1')
      const user = await api.createUser({ password: pw })
      const login = async (format = 'jwt') => {
        const res = await api.request('POST', '/auth/login', {
          auth: null,
          body: { email: user.email, password: pw, token_format: format },
        })
        keep(res.body.access_token)
        keep(res.body.refresh_token)
        return res
      }
      const first = await eventsOf(() => login('opaque'))
      assert.equal(first.res!.status, 200)
      const opened = assertOneEvent(first.events, {
        type: 'session.created',
        subject: first.events[0]!.subject,
        actor: { user_id: user.id, credential: 'password' },
        request_id: requestIdOf(first.res),
      })
      assert.equal(opened.subject.type, 'session')
      assert.equal(opened.data.user_id, user.id)
      assert.equal(opened.data.token_format, 'opaque')
      assert.equal(opened.data.revoked_at, null)

      // An opaque access token is the `token` credential.
      const tokens = (first.res as TestResponse).body
      const out = await eventsOf(() => api.request('POST', '/auth/logout', { auth: tokens.access_token }))
      assert.equal(out.res!.status, 204)
      const ended = assertOneEvent(out.events, {
        type: 'session.revoked',
        subject: opened.subject,
        actor: { user_id: user.id, credential: 'token' },
      })
      assert.match(String(ended.data.revoked_at), /Z$/)
      // Ending it again changes nothing and records nothing.
      assert.deepEqual(
        (
          await eventsOf(() =>
            api.request('POST', '/auth/logout', { auth: null, body: { refresh_token: tokens.refresh_token } }),
          )
        ).events,
        [],
      )

      const a = (await login()).body
      const b = (await login()).body
      const sessions = (await api.request('GET', '/auth/sessions', { auth: a.access_token })).body as Array<{
        id: number
        current: boolean
      }>
      const other = sessions.find((s) => !s.current)!
      const one = await eventsOf(() => api.request('DELETE', `/auth/sessions/${other.id}`, { auth: a.access_token }))
      assertOneEvent(one.events, {
        type: 'session.revoked',
        subject: { type: 'session', id: other.id },
        actor: { user_id: user.id, credential: 'jwt' },
      })

      await login()
      const all = await eventsOf(() => api.request('POST', '/auth/logout-all', { auth: a.access_token }))
      assert.equal(all.res!.status, 204)
      assert.deepEqual(
        all.events.map((e) => e.type),
        ['session.revoked', 'session.revoked'],
      )
      assert.ok(all.events.every((e) => e.actor.user_id === user.id && e.actor.credential === 'jwt'))
      assert.ok(!all.events.some((e) => e.subject.id === other.id), 'a session ended before is not ended again')
      void b
    },
  )

  test('a reused refresh token revokes its session with an unknown actor', async () => {
    const pw = keep('a-good-password-2')
    const user = await api.createUser({ password: pw })
    const { refresh_token: refresh } = (
      await api.request('POST', '/auth/login', { auth: null, body: { email: user.email, password: pw } })
    ).body
    keep(refresh)
    assert.equal(
      (await api.request('POST', '/auth/refresh', { auth: null, body: { refresh_token: refresh } })).status,
      200,
    )
    const reuse = await eventsOf(() =>
      api.request('POST', '/auth/refresh', { auth: null, body: { refresh_token: refresh } }),
    )
    assert.equal(reuse.res!.status, 401)
    const event = assertOneEvent(reuse.events, {
      type: 'session.revoked',
      subject: reuse.events[0]!.subject,
      actor: { user_id: null, credential: 'refresh_token' },
    })
    assert.equal(event.data.user_id, user.id)
  })

  test(
    'a failed login is recorded, for a known account and an unknown address alike, without the ' + 'password',
    async () => {
      const pw = keep('a-good-password-3')
      const user = await api.createUser({ password: pw })
      const wrong = await eventsOf(() =>
        api.request('POST', '/auth/login', {
          auth: null,
          body: { email: user.email.toUpperCase(), password: 'not-the-password' },
        }),
      )
      assert.equal(wrong.res!.status, 401)
      const event = assertOneEvent(wrong.events, {
        type: 'login.failed',
        subject: { type: 'user', id: user.id },
        actor: { user_id: null, credential: null },
        request_id: requestIdOf(wrong.res),
      })
      assert.equal(event.data.email, user.email.toLowerCase())
      assert.equal(typeof event.data.client_address, 'string')
      assert.ok(!JSON.stringify(event).includes('not-the-password'))

      const nobody = await eventsOf(() =>
        api.request('POST', '/auth/login', {
          auth: null,
          body: { email: `nobody-${unique()}@example.com`, password: 'whatever-it-is' },
        }),
      )
      assertOneEvent(nobody.events, {
        type: 'login.failed',
        subject: { type: 'user', id: null },
        actor: { user_id: null, credential: null },
      })
    },
  )

  test(
    "a password change records the user update and the end of the user's other sessions, in that " + 'transaction',
    async () => {
      const pw = keep('a-good-password-4')
      const user = await api.createUser({ password: pw })
      const mine = (await api.request('POST', '/auth/login', { auth: null, body: { email: user.email, password: pw } }))
        .body
      await api.request('POST', '/auth/login', { auth: null, body: { email: user.email, password: pw } })
      const etag = (await api.request('GET', `/users/${user.id}`, { auth: mine.access_token })).headers.get('etag')!
      const changed = await eventsOf(() =>
        api.request('PATCH', `/users/${user.id}`, {
          auth: mine.access_token,
          body: { password: keep('a-new-password-4'), current_password: pw },
          headers: { 'if-match': etag },
        }),
      )
      assert.equal(changed.res!.status, 200, changed.res!.text)
      assert.deepEqual(
        changed.events.map((e) => e.type),
        ['session.revoked', 'user.updated'],
      )
      assert.ok(changed.events.every((e) => e.actor.user_id === user.id && e.request_id === requestIdOf(changed.res)))

      // The change voided the user's JWTs (sql/005): a new login, with the new password.
      const again = (
        await api.request('POST', '/auth/login', {
          auth: null,
          body: { email: user.email, password: 'a-new-password-4' },
        })
      ).body
      const wrong = await eventsOf(() =>
        api.request('PATCH', `/users/${user.id}`, {
          auth: again.access_token,
          body: { password: 'another-password', current_password: 'not-it-at-all' },
          headers: { 'if-match': changed.res!.headers.get('etag')! },
        }),
      )
      assert.equal(wrong.res!.status, 403)
      assertOneEvent(wrong.events, {
        type: 'login.failed',
        subject: { type: 'user', id: user.id },
        actor: { user_id: user.id, credential: 'jwt' },
      })
    },
  )

  test('the first admin made by the service itself has the system actor', async () => {
    const email = `boot-${unique()}@example.com`
    const made = await eventsOf(
      async () => void (await createOrResetAdmin(sql, testPasswords, email, keep('a-bootstrap-password'))),
    )
    const event = assertOneEvent(made.events, {
      type: 'user.created',
      subject: made.events[0]!.subject,
      actor: { user_id: null, credential: 'system' },
      request_id: null,
    })
    assert.equal(event.data.email, email)
    assert.equal(event.data.role, 'admin')
    const reset = await eventsOf(
      async () => void (await createOrResetAdmin(sql, testPasswords, email, 'another-bootstrap-password')),
    )
    assert.deepEqual(
      reset.events.map((e) => [e.type, e.actor.credential]),
      [['user.updated', 'system']],
    )
  })
})

test(
  'api_time is inlined into the statement of the change: the plan shows to_char, not a call of ' + 'api_time',
  async () => {
    // A SQL function is inlined only when it claims no more than its body's
    // volatility; not inlined, it costs each write a sixth of its database time.
    const plan = (
      await sql.unsafe<Array<{ 'QUERY PLAN': string }>>(
        'EXPLAIN (VERBOSE) SELECT api_time(created_at) FROM users LIMIT 1',
      )
    )
      .map((r) => r['QUERY PLAN'])
      .join('\n')
    assert.match(plan, /to_char\(/)
    assert.doesNotMatch(plan, /api_time\(/)
    const [row] = await sql<[{ text: string }]>`SELECT api_time('2026-11-22 10:15:30.12+00'::timestamptz) AS text`
    assert.equal(row.text, '2026-11-22T10:15:30.120Z')
  },
)

test(
  'the outbox refuses a malformed type or subject type, whatever writes it; each part may have 1 to 40 of ' + '[a-z_]',
  async () => {
    const a40 = 'a'.repeat(40)
    const accepted = ['user.created', `${a40}.${a40}`, 'x_y.z_w']
    const refused = [
      'user',
      '.created',
      'user.',
      'user.created.twice',
      'User.created',
      'user .created',
      `${a40}a.b`,
      `a.${a40}b`,
      'user.created\n',
      '',
    ]
    const subjectsRefused = ['', `${a40}a`, 'a.b', 'A', 'user\n']
    // Each insert rolls back: these rows must never reach the publisher.
    const tryInsert = (type: string, subject: string) =>
      sql
        .begin(async (tx) => {
          await tx`INSERT INTO event_outbox (type, subject_type, subject_id, data) VALUES
            (${type}, ${subject}, 1, '{}')`
          throw new Error('rolled back')
        })
        .then(
          () => 'inserted',
          (err: { code?: string; message: string }) => (err.message === 'rolled back' ? 'accepted' : err.code),
        )
    for (const type of accepted) assert.equal(await tryInsert(type, 'user'), 'accepted', type)
    for (const type of refused) assert.equal(await tryInsert(type, 'user'), '23514', JSON.stringify(type))
    assert.equal(await tryInsert('user.created', a40), 'accepted')
    for (const subject of subjectsRefused)
      assert.equal(await tryInsert('user.created', subject), '23514', JSON.stringify(subject))
  },
)

describe('a refused or rolled-back write records nothing', () => {
  test('validation, conflicts, preconditions, authorization and rules checked in the transaction', async () => {
    const product = (await api.request('POST', '/products', { body: newProduct() })).body
    const user = await api.createUser()
    const since = await head()
    const refused: Array<[number, Promise<TestResponse>]> = [
      [422, api.request('POST', '/products', { body: { ...newProduct(), price: 'free' } })],
      [422, api.request('POST', '/products', { body: { ...newProduct(), name: 'nul\u0000byte' } })],
      [422, api.request('POST', '/products', { body: { ...newProduct(), extra: 1 } })],
      [409, api.request('POST', '/products', { body: { ...newProduct(), sku: product.sku } })],
      [412, api.request('PATCH', `/products/${product.id}`, { body: { price: 1 }, headers: { 'if-match': '"999"' } })],
      [404, api.request('DELETE', '/products/999999999')],
      [403, api.request('POST', '/products', { body: newProduct(), auth: user.token })],
      [403, api.request('PATCH', `/users/${user.id}`, { body: { role: 'admin' }, auth: user.token })],
      [401, api.request('DELETE', `/products/${product.id}`, { auth: 'forged.jwt.token' })],
      [
        415,
        api.request('POST', '/products', {
          body: JSON.stringify(newProduct()),
          headers: { 'content-type': 'text/plain' },
        }),
      ],
    ]
    for (const [status, pending] of refused) assert.equal((await pending).status, status)
    await api.published()
    // The last admin cannot demote itself: the UPDATE ran, the hook threw, the transaction rolled back.
    const onlyAdminApi = await startServer()
    const demote = await onlyAdminApi.request('PATCH', `/users/${onlyAdminApi.admin.id}`, { body: { role: 'user' } })
    assert.equal(demote.status, 409)
    const [{ count }] = await onlyAdminApi.sql<
      [{ count: number }]
    >`SELECT count(*)::int AS count FROM events WHERE subject_type = 'user'`
    assert.equal(count, 0)
    assert.deepEqual(await eventsAfter(since), [])
  })

  test('an event written in a transaction that rolls back is never seen, and its id is never taken', async () => {
    const since = await head()
    await sql
      .begin(async (tx) => {
        await recordEvents(
          tx,
          [{ type: 'product.updated', subject: { type: 'product', id: 1 }, data: { doomed: true } }],
          { actorId: null, credential: 'system', requestId: null },
        )
        await tx`SELECT 1/0`
      })
      .catch(() => {})
    await api.published()
    assert.deepEqual(await eventsAfter(since), [])
    const [{ count }] = await sql<
      [{ count: number }]
    >`SELECT count(*)::int AS count FROM events WHERE data::text LIKE '%doomed%'`
    assert.equal(count, 0)
  })
})

describe('commit order', () => {
  test(
    'two writers whose commits are forced out of order: the one that wrote first and committed last comes after, ' +
      "and a reader's cursor does not skip it",
    async () => {
      const since = await head()
      const origin = { actorId: null, credential: 'system' as const, requestId: null }
      const write = (tx: TransactionSql, name: string) =>
        recordEvents(tx, [{ type: 'product.updated', subject: { type: 'product', id: 1 }, data: { name } }], origin)
      let releaseFirst!: () => void
      const firstMayCommit = new Promise<void>((resolve) => (releaseFirst = resolve))
      let firstWrote!: () => void
      const firstHasWritten = new Promise<void>((resolve) => (firstWrote = resolve))
      // The first writer inserts its event first, then waits before committing.
      const first = sql.begin(async (tx) => {
        await write(tx, 'first')
        firstWrote()
        await firstMayCommit
      })
      await firstHasWritten
      // The second inserts after it and commits before it.
      await sql.begin((tx) => write(tx, 'second'))

      // A reader follows the feed: it sees the second, and its cursor moves past it.
      await api.published()
      const seen = await eventsAfter(since)
      assert.deepEqual(
        seen.map((e) => e.data.name),
        ['second'],
      )
      const cursor = seen[0]!.id

      releaseFirst()
      await first
      await api.published()
      // From its cursor, the reader gets the first: committed later, numbered later.
      const next = await eventsAfter(cursor)
      assert.deepEqual(
        next.map((e) => e.data.name),
        ['first'],
      )
      assert.ok(next[0]!.id > cursor)
      // The provisional id the first event had while uncommitted was never visible as a public id.
      assert.ok((await eventsAfter(since)).every((e) => e.id > 0))
    },
  )

  test(
    'a reader following GET /events during concurrent writes through the API sees every event once, in increasing ' +
      'id order',
    async () => {
      const since = await head()
      const products = await Promise.all(
        Array.from({ length: 6 }, async () => (await api.request('POST', '/products', { body: newProduct() })).body),
      )
      let writing = true
      const seen: number[] = []
      const follower = (async () => {
        let cursor = since
        while (writing || seen.length === 0 || cursor < (await head())) {
          const page = await eventsAfter(cursor)
          for (const e of page) seen.push(e.id)
          if (page.length) cursor = page[page.length - 1]!.id
          await sleep(5)
        }
      })()
      // Six writers, each patching its own product 25 times, without If-Match.
      await Promise.all(
        products.map(async (p) => {
          for (let i = 1; i <= 25; i++)
            assert.equal((await api.request('PATCH', `/products/${p.id}`, { body: { stock: i } })).status, 200)
        }),
      )
      await api.published()
      writing = false
      await follower
      const committed = (await sql<Array<{ id: number }>>`SELECT id FROM events WHERE id > ${since} ORDER BY id`).map(
        (r) => r.id,
      )
      assert.equal(committed.length, 6 + 6 * 25)
      assert.deepEqual(seen, committed)
      // Writes to one row are published in the order they committed: each product's stock counts up in id order.
      for (const p of products) {
        const stocks = (await eventsAfter(since, `&subject_type=product&subject_id=${p.id}&type=product.updated`)).map(
          (e) => e.data.stock,
        )
        assert.deepEqual(
          stocks,
          Array.from({ length: 25 }, (_, i) => i + 1),
        )
      }
    },
  )
})

describe('GET /events', () => {
  test('filters by type, subject, actor and time; counts; selects fields; pages with a cursor', async () => {
    const user = await api.createUser({ role: 'admin' })
    const start = new Date(Date.now() - 1000).toISOString()
    const p = (await api.request('POST', '/products', { body: newProduct() })).body
    await api.request('PATCH', `/products/${p.id}`, { body: { stock: 1 }, auth: user.token })
    await api.request('PATCH', `/products/${p.id}`, { body: { stock: 2 }, auth: user.token })
    await api.published()

    const bySubject = await api.request('GET', `/events?subject_type=product&subject_id=${p.id}&count=true`)
    assert.equal(bySubject.status, 200)
    assert.deepEqual(
      bySubject.body.map((e: Event) => e.type),
      ['product.created', 'product.updated', 'product.updated'],
    )
    assert.equal(bySubject.headers.get('x-total-count'), '3')

    const byActor = await api.request('GET', `/events?actor_id=${user.id}&type=product.updated`)
    assert.deepEqual(
      byActor.body.map((e: Event) => e.data.stock),
      [1, 2],
    )

    const newestFirst = await api.request(
      'GET',
      `/events?subject_id=${p.id}&subject_type=product&sort=-id&limit=1&fields=id,type`,
    )
    assert.deepEqual(Object.keys(newestFirst.body[0]), ['id', 'type'])
    assert.equal(newestFirst.body[0].type, 'product.updated')
    const next = /<([^>]+)>; rel="next"/.exec(newestFirst.headers.get('link')!)![1]!
    const second = await api.request('GET', next)
    assert.equal(second.body.length, 1)
    assert.ok(second.body[0].id < newestFirst.body[0].id)

    const recent = await api.request(
      'GET',
      `/events?occurred_at[gte]=${encodeURIComponent(start)}&subject_type=product&subject_id=${p.id}`,
    )
    assert.equal(recent.body.length, 3)
    const future = await api.request(
      'GET',
      `/events?occurred_at[gt]=${encodeURIComponent(new Date(Date.now() + 60_000).toISOString())}`,
    )
    assert.deepEqual(future.body, [])
  })

  test('hostile and wrong queries get 400 and name the parameter', async () => {
    for (const query of [
      'q=anything',
      'sort=type',
      'sort=occurred_at',
      'limit=0',
      'limit=201',
      'subject_id=abc',
      'subject_id=99999999999999999999',
      'actor_id=-1x',
      'occurred_at=yesterday',
      'type=' + 'x'.repeat(1001),
      'unknown=1',
      'id[gt]=1.5',
      'cursor=forged',
      'fields=password_hash',
      'fields=subject_type',
    ]) {
      const res = await api.request('GET', `/events?${query}`)
      assert.equal(res.status, 400, `${query}: ${res.text}`)
      assert.match(res.body.code, /^(invalid|unknown)_parameter$/, query)
    }
    const nul = await api.request('GET', '/events?type=user.created%00')
    assert.equal(nul.status, 400, 'a NUL byte in a query value is refused before any SQL')
  })

  test('only an admin with events:read may read the log', async () => {
    const user = await api.createUser()
    assert.equal((await api.request('GET', '/events', { auth: null })).status, 401)
    assert.equal((await api.request('GET', '/events', { auth: user.token })).status, 403)
    const narrowAdmin = api.jwtFor(api.admin.id, 'admin', ['products:read'])
    const res = await api.request('GET', '/events', { auth: narrowAdmin })
    assert.equal(res.status, 403)
    assert.equal(res.body.code, 'insufficient_scope')
  })

  test('no secret reaches an event: no password, hash, key or token anywhere in the log', async () => {
    await api.published()
    const all = await eventsAfter(0)
    assert.ok(all.length > 20)
    const text = JSON.stringify(all)
    assert.ok(secrets.size > 10)
    for (const marker of [
      'password_hash',
      'scrypt',
      'key_hash',
      'token_hash',
      'bootstrap-password',
      'correct horse',
      ...secrets,
    ]) {
      assert.ok(!text.includes(marker), `the event log contains ${marker}`)
    }
  })
})

describe('retention', () => {
  test(
    'events older than EVENTS_RETENTION_DAYS are deleted in batches, with their deliveries; newer ones ' + 'stay',
    async () => {
      const since = await head()
      for (let i = 0; i < 20; i++) await api.request('POST', '/products', { body: newProduct() })
      await api.published()
      const ours = (await eventsAfter(since)).map((e) => e.id)
      const old = ours.slice(0, 15)
      await sql`UPDATE events SET occurred_at = now() - interval '31 days' WHERE id IN ${sql(old)}`
      const [hook] = await sql<
        [{ id: number }]
      >`INSERT INTO webhooks (url, event_types, secret_sealed) VALUES ('https://example.com/h', '{product.created}',
      'x') RETURNING id`
      await sql`INSERT INTO webhook_deliveries (webhook_id, event_id) SELECT ${hook.id}, unnest(${old}::bigint[])`

      const deleted = await api.deps.retention.sweep()
      assert.ok(deleted >= 15, `deleted ${deleted}`)
      const left = (await eventsAfter(since)).map((e) => e.id)
      assert.deepEqual(left, ours.slice(15))
      const [{ deliveries }] = await sql<
        [{ deliveries: number }]
      >`SELECT count(*)::int AS deliveries FROM webhook_deliveries WHERE webhook_id = ${hook.id}`
      assert.equal(deliveries, 0)
      assert.ok(api.logs.some((l) => l.msg === 'old events deleted' || l.message === 'old events deleted'))
    },
  )
})
