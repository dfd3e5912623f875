import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { startServer, type RequestOptions, type TestResponse, type TestServer } from './helpers/server.js'
import { captureMail } from './helpers/captured-mail.js'
import { startReceiver } from './helpers/webhook-receiver.js'

// POST /batch (docs/api.md, "Batches"): operations on resources in order in
// one transaction, each answered as it would be alone; one failure answers
// its problem with its index, and leaves no row, no event and no delivery.

const api = await startServer(
  { WEBHOOK_ALLOW_PRIVATE: 'true', BODY_LIMIT: '65536' },
  {},
  { tuning: { webhooks: { pollMs: 50, retryDelaysMs: [50], retryJitter: 0, timeoutMs: 1000, leaseMs: 3000 } } },
)
const { sql } = api

let serial = 0
const sku = (prefix = 'BATCH') => `${prefix}-${process.pid}-${++serial}`
const product = (over: Record<string, unknown> = {}): Record<string, unknown> & { sku: string } => ({
  sku: sku(),
  name: 'Widget',
  price: 100,
  currency: 'EUR',
  ...over,
})
const create = <B extends Record<string, unknown>>(body: B) => ({ method: 'POST', path: '/products', body })

const batch = (server: TestServer, operations: unknown[], options: RequestOptions = {}) =>
  server.request('POST', '/batch', { ...options, body: { operations } })

function assertProblem(res: TestResponse, status: number, code: string, operation?: number) {
  assert.equal(res.status, status, res.text)
  assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/)
  assert.equal(res.body.code, code, res.text)
  assert.equal(res.body.operation, operation, res.text)
  assert.equal(res.body.instance, '/batch')
  assert.doesNotMatch(res.text, /at [\w.]+ \(|SELECT|INSERT/, 'no stack trace or SQL reaches the client')
}

const productsWithSku = async (skus: string[], db = sql) =>
  (await db<[{ n: number }]>`SELECT count(*)::int AS n FROM products WHERE sku = ANY(${skus})`)[0].n
const eventsOf = async (requestId: string) => {
  await api.published()
  return [
    ...(await sql<Array<{ type: string; subject_id: number }>>`
    SELECT type, subject_id FROM events WHERE request_id = ${requestId} ORDER BY id`),
  ]
}
const everything = async () => {
  await api.published()
  const [counts] = await sql<[{ products: number; users: number; events: number; outbox: number }]>`
    SELECT (SELECT count(*)::int FROM products) AS products, (SELECT count(*)::int FROM users) AS users,
           (SELECT count(*)::int FROM events) AS events, (SELECT count(*)::int FROM event_outbox) AS outbox`
  return counts
}

describe('a batch of 100 creations is one transaction', () => {
  test('all succeed: 200, a result per operation as alone, the rows, the events in operation order', async () => {
    const bodies = Array.from({ length: 100 }, () => product())
    const res = await batch(
      api,
      bodies.map((b) => create(b)),
      { headers: { 'x-request-id': `batch-ok-${process.pid}` } },
    )
    assert.equal(res.status, 200, res.text)
    assert.equal(res.body.results.length, 100)
    for (const [i, result] of (res.body.results as Array<Record<string, any>>).entries()) {
      assert.equal(result.status, 201)
      assert.equal(result.location, `/products/${result.body.id}`)
      assert.equal(result.etag, '"v1"')
      assert.equal(result.body.sku, bodies[i]!.sku)
      const alone = await api.request('GET', result.location)
      assert.deepEqual(alone.body, result.body, 'the result is what GET answers')
    }
    assert.equal(await productsWithSku(bodies.map((b) => b.sku)), 100)
    const events = await eventsOf(`batch-ok-${process.pid}`)
    assert.deepEqual(
      events.map((e) => [e.type, e.subject_id]),
      res.body.results.map((r: { body: { id: number } }) => ['product.created', r.body.id]),
    )
    const line = api.logs.find((l) => l.request_id === `batch-ok-${process.pid}` && l.msg === 'request')
    assert.equal(line?.route, '/batch')
    assert.equal(line?.operations, 100)
    assert.equal(api.logs.filter((l) => l.request_id === `batch-ok-${process.pid}` && l.msg === 'request').length, 1)
  })

  test('operation 100 fails: its problem with "operation": 99, and no row, no event, no webhook delivery', async () => {
    const receiver = await startReceiver()
    const hook = await api.request('POST', '/webhooks', {
      body: { url: receiver.url, event_types: ['product.created'] },
    })
    assert.equal(hook.status, 201, hook.text)
    const bodies = Array.from({ length: 99 }, () => product())
    const before = await everything()
    const res = await batch(api, [...bodies.map((b) => create(b)), create({ ...product(), sku: bodies[0]!.sku })], {
      headers: { 'x-request-id': `batch-fails-${process.pid}` },
    })
    assertProblem(res, 409, 'sku_taken', 99)
    assert.equal(await productsWithSku(bodies.map((b) => b.sku)), 0)
    assert.deepEqual(await eventsOf(`batch-fails-${process.pid}`), [])
    assert.deepEqual(await everything(), before)
    // A later write is delivered alone: the failed batch left nothing for the webhook.
    const marker = await api.request('POST', '/products', { body: product() })
    await api.published()
    await receiver.waitFor('the marker', (r) => r.length >= 1)
    assert.deepEqual(
      receiver.received.map((r) => JSON.parse(r.body).data.id),
      [marker.body.id],
    )
    const [deliveries] = await sql<[{ n: number }]>`
      SELECT count(*)::int AS n FROM webhook_deliveries WHERE webhook_id = ${hook.body.id}`
    assert.equal(deliveries.n, 1)
    await api.request('DELETE', `/webhooks/${hook.body.id}`)
    await receiver.close()
  })
})

test("a later operation names an earlier one's id as {i.id}: create, change, read, delete in one batch", async () => {
  const res = await batch(api, [
    create(product({ stock: 1 })),
    { method: 'PATCH', path: '/products/{0.id}', body: { stock: 2 }, if_match: '"v1"' },
    { method: 'GET', path: '/products/{0.id}' },
    { method: 'PUT', path: '/products/{0.id}', body: product({ name: 'Replaced' }), if_match: '"v2"' },
    { method: 'DELETE', path: '/products/{0.id}', if_match: '"v3"' },
  ])
  assert.equal(res.status, 200, res.text)
  const [created, patched, read, replaced, deleted] = res.body.results
  assert.deepEqual(
    [created.status, patched.status, read.status, replaced.status, deleted.status],
    [201, 200, 200, 200, 204],
  )
  assert.equal(patched.body.stock, 2)
  assert.equal(read.etag, '"v2"')
  assert.equal(replaced.body.name, 'Replaced')
  assert.equal(deleted.body, undefined)
  assert.equal((await api.request('GET', `/products/${created.body.id}`)).status, 404)
})

describe('hostile batches get their 4xx and change nothing', () => {
  const refused: Array<[string, unknown, number, string, number?]> = [
    ['no operation', { operations: [] }, 422, 'validation_failed'],
    ['101 operations', { operations: Array.from({ length: 101 }, () => create(product())) }, 422, 'validation_failed'],
    ['no operations member', {}, 422, 'validation_failed'],
    ['an unknown member of the batch', { operations: [create(product())], atomic: false }, 422, 'validation_failed'],
    [
      'an operation with its own credentials',
      { operations: [{ ...create(product()), headers: { authorization: 'Bearer x' } }] },
      422,
      'validation_failed',
    ],
    ['a method that is no method', { operations: [{ method: 'TRACE', path: '/products' }] }, 422, 'validation_failed'],
    ['a path that is a number', { operations: [{ method: 'GET', path: 5 }] }, 422, 'validation_failed'],
    ['a NUL byte in a path', { operations: [{ method: 'GET', path: '/products/1\u0000' }] }, 422, 'validation_failed'],
    ['a relative path', { operations: [{ method: 'GET', path: 'products/1' }] }, 422, 'validation_failed'],
    [
      'a nested batch',
      { operations: [{ method: 'POST', path: '/batch', body: { operations: [] } }] },
      422,
      'not_batchable',
      0,
    ],
    [
      'a login',
      {
        operations: [
          create(product()),
          { method: 'POST', path: '/auth/login', body: { email: 'a@b.cd', password: 'x' } },
        ],
      },
      422,
      'not_batchable',
      1,
    ],
    ['a logout', { operations: [{ method: 'POST', path: '/auth/logout', body: {} }] }, 422, 'not_batchable', 0],
    [
      'an API key',
      { operations: [{ method: 'POST', path: '/api-keys', body: { name: 'k' } }] },
      422,
      'not_batchable',
      0,
    ],
    ['a webhook', { operations: [{ method: 'DELETE', path: '/webhooks/1' }] }, 422, 'not_batchable', 0],
    ['a list', { operations: [{ method: 'GET', path: '/products?limit=1' }] }, 422, 'not_batchable', 0],
    ['the metrics', { operations: [{ method: 'GET', path: '/metrics' }] }, 422, 'not_batchable', 0],
    ['an unknown path', { operations: [create(product()), { method: 'GET', path: '/nowhere' }] }, 404, 'not_found', 1],
    ['a non-numeric id', { operations: [{ method: 'GET', path: '/products/abc' }] }, 404, 'not_found', 0],
    ['a missing product', { operations: [{ method: 'DELETE', path: '/products/999999999' }] }, 404, 'not_found', 0],
    ['a method the path lacks', { operations: [{ method: 'PUT', path: '/products' }] }, 405, 'method_not_allowed', 0],
    [
      'a body on a GET',
      { operations: [{ method: 'GET', path: '/products/1', body: {} }] },
      422,
      'validation_failed',
      0,
    ],
    ['a create without a body', { operations: [{ method: 'POST', path: '/products' }] }, 422, 'validation_failed', 0],
    [
      'an invalid product after a valid one',
      { operations: [create(product()), create(product({ price: -1, extra: 'x' }))] },
      422,
      'validation_failed',
      1,
    ],
    [
      'a reference to a later operation',
      { operations: [{ method: 'GET', path: '/products/{1.id}' }, create(product())] },
      422,
      'validation_failed',
      0,
    ],
    [
      'a reference to a member no answer has',
      { operations: [create(product()), { method: 'GET', path: '/products/{0.nope}' }] },
      422,
      'validation_failed',
      1,
    ],
    [
      'a reference to a deleted answer',
      {
        operations: [
          create(product()),
          { method: 'DELETE', path: '/products/{0.id}' },
          { method: 'GET', path: '/products/{1.id}' },
        ],
      },
      422,
      'validation_failed',
      2,
    ],
    [
      'a half-written reference',
      { operations: [{ method: 'GET', path: '/products/{0.id' }] },
      422,
      'validation_failed',
      0,
    ],
    [
      'an unknown query parameter',
      { operations: [{ method: 'GET', path: '/products/1?x=1' }] },
      400,
      'unknown_parameter',
      0,
    ],
    [
      'a stale If-Match',
      { operations: [create(product()), { method: 'PATCH', path: '/products/{0.id}', body: {}, if_match: '"v9"' }] },
      412,
      'precondition_failed',
      1,
    ],
  ]
  for (const [what, body, status, code, operation] of refused) {
    test(what, async () => {
      const before = await everything()
      const res = await api.request('POST', '/batch', { body })
      assertProblem(res, status, code, operation)
      assert.deepEqual(await everything(), before)
    })
  }

  test('a body over 10 × BODY_LIMIT is 413 unread; an operation body over BODY_LIMIT: 413 and its index', async () => {
    const before = await everything()
    const huge = await api.request('POST', '/batch', {
      body: { operations: [create(product({ description: 'x'.repeat(10 * 65536) }))] },
    })
    assertProblem(huge, 413, 'payload_too_large')
    const large = await batch(api, [create(product()), create(product({ description: 'x'.repeat(65536) }))])
    assertProblem(large, 413, 'payload_too_large', 1)
    assert.deepEqual(await everything(), before)
  })

  test('wrong content type, malformed JSON, duplicate members and no credentials', async () => {
    const before = await everything()
    const text = await api.request('POST', '/batch', {
      body: JSON.stringify({ operations: [create(product())] }),
      headers: { 'content-type': 'text/plain' },
    })
    assertProblem(text, 415, 'unsupported_media_type')
    const malformed = await api.request('POST', '/batch', {
      body: '{"operations": [',
      headers: { 'content-type': 'application/json' },
    })
    assertProblem(malformed, 400, 'malformed_json')
    const twice = await api.request('POST', '/batch', {
      body: '{"operations": [], "operations": [{"method": "GET", "path": "/products/1"}]}',
      headers: { 'content-type': 'application/json' },
    })
    assert.equal(twice.status, 400, twice.text)
    const twoCredentials = await batch(api, [create(product())], {
      headers: { authorization: `Bearer ${api.admin.token}`, 'x-api-key': 'upa_ak_whatever' },
    })
    assert.equal(twoCredentials.status, 400, twoCredentials.text)
    const anonymous = await batch(api, [create(product())], { auth: null })
    assertProblem(anonymous, 401, 'unauthorized')
    const forged = await batch(api, [create(product())], { auth: api.admin.token.slice(0, -2) + 'xx' })
    assertProblem(forged, 401, 'invalid_token')
    assert.deepEqual(await everything(), before)
  })
})

describe('each operation is authorized as it would be alone', () => {
  test("a user's batch that reaches into another user's data fails there; its own change is undone", async () => {
    const me = await api.createUser({ name: 'Me' })
    const other = await api.createUser({ name: 'Other' })
    const res = await batch(
      api,
      [
        { method: 'PATCH', path: `/users/${me.id}`, body: { name: 'Renamed' } },
        { method: 'PATCH', path: `/users/${other.id}`, body: { name: 'Taken over' } },
      ],
      { auth: me.token },
    )
    const alone = await api.request('PATCH', `/users/${other.id}`, { auth: me.token, body: { name: 'Taken over' } })
    assertProblem(res, alone.status, alone.body.code, 1)
    assert.equal(alone.status, 403)
    const names = await sql`SELECT id, name FROM users WHERE id IN (${me.id}, ${other.id}) ORDER BY id`
    assert.deepEqual(
      names.map((r) => r.name),
      ['Me', 'Other'],
    )
    const products = await batch(api, [create(product())], { auth: me.token })
    assertProblem(products, 403, 'insufficient_scope', 0)
  })

  test('a wrong current_password in a batch is counted as a failed login, though the batch is undone', async () => {
    const password = 'batch-password-1'
    const user = await api.createUser({ password, session: true })
    const before = await sql`SELECT email FROM users WHERE id = ${user.id}`
    const change = (currentPassword: string) => [
      { method: 'PATCH', path: `/users/${user.id}`, body: { name: 'Guessing' } },
      {
        method: 'PATCH',
        path: `/users/${user.id}`,
        body: { email: `taken-over-${process.pid}@example.test`, current_password: currentPassword },
      },
    ]
    const guess = await batch(api, change('not-the-password'), { auth: user.token })
    assertProblem(guess, 403, 'current_password_required', 1)
    assert.deepEqual(await sql`SELECT email FROM users WHERE id = ${user.id}`, before)
    const [failures] = await sql`SELECT failures FROM login_failures WHERE email = ${user.email.toLowerCase()}`
    assert.ok(failures && failures.failures >= 1, 'the guess was not counted')
    await api.published()
    const [failedLogin] = await sql`SELECT count(*)::int AS n FROM events WHERE type = 'login.failed'
      AND subject_id = ${user.id}`
    assert.equal(failedLogin!.n, 1)
    const right = await batch(api, change(password), { auth: user.token })
    assert.equal(right.status, 200, right.text)
  })

  test('an API key needs the scopes of every operation', async () => {
    const login = await api.loginJwtFor(api.admin.id, 'admin')
    const key = await api.request('POST', '/api-keys', {
      auth: login,
      body: { name: `batch-${process.pid}`, scopes: ['products:read', 'users:write'] },
    })
    assert.equal(key.status, 201, key.text)
    const headers = { 'x-api-key': key.body.key as string }
    const before = await everything()
    const res = await batch(
      api,
      [{ method: 'PATCH', path: `/users/${api.admin.id}`, body: { name: 'Admin' } }, create(product())],
      { headers },
    )
    assertProblem(res, 403, 'insufficient_scope', 1)
    assert.deepEqual(await everything(), before)
    const read = await batch(
      api,
      [{ method: 'GET', path: `/products/${(await api.request('POST', '/products', { body: product() })).body.id}` }],
      { headers },
    )
    assert.equal(read.status, 200, read.text)
  })

  test('a user deleted in a batch loses its sessions and tokens when the batch answers', async () => {
    const victim = await api.createUser({ session: true })
    assert.equal((await api.request('GET', '/auth/me', { auth: victim.token })).status, 200)
    const res = await batch(api, [
      { method: 'PATCH', path: `/users/${victim.id}`, body: { name: 'Leaving' } },
      { method: 'DELETE', path: `/users/${victim.id}` },
    ])
    assert.equal(res.status, 200, res.text)
    assert.deepEqual(
      res.body.results.map((r: { status: number }) => r.status),
      [200, 204],
    )
    assert.equal((await api.request('GET', '/auth/me', { auth: victim.token })).status, 401)
  })

  test('an admin moves users to another role in one batch with a fresh login; without, nothing moves', async () => {
    const users = await Promise.all([api.createUser(), api.createUser(), api.createUser()])
    const promote = users.map((u) => ({ method: 'PATCH', path: `/users/${u.id}`, body: { role: 'admin' } }))
    const stale = await batch(api, promote, { auth: api.jwtFor(api.admin.id, 'admin') })
    assertProblem(stale, 403, 'current_password_required', 0)
    const fresh = await batch(api, promote, { auth: await api.loginJwtFor(api.admin.id, 'admin') })
    assert.equal(fresh.status, 200, fresh.text)
    const roles = await sql`SELECT role FROM users WHERE id = ANY(${users.map((u) => u.id)})`
    assert.deepEqual(
      roles.map((r) => r.role),
      ['admin', 'admin', 'admin'],
    )
  })
})

describe('what a batch holds while its operations prove passwords', () => {
  test('more batches proving a password than the pool has connections all finish', async () => {
    const small = await startServer({ DATABASE_POOL_MAX: '2' }, {}, { databaseUrl: api.databaseUrl })
    const password = 'batch-pool-password'
    const users = await Promise.all([1, 2, 3, 4].map(() => small.createUser({ password, session: true })))
    const answers = await Promise.all(
      users.map((u, i) =>
        batch(
          small,
          [{ method: 'PATCH', path: `/users/${u.id}`, body: { name: `Pooled ${i}`, current_password: password } }],
          { auth: u.token },
        ),
      ),
    )
    assert.deepEqual(
      answers.map((a) => a.status),
      [200, 200, 200, 200],
      answers.map((a) => a.text).join('\n'),
    )
  })

  test('a proof after the batch moved its own user to the trash is refused at once; nothing is changed', async () => {
    const password = 'batch-self-delete-password'
    const user = await api.createUser({ password, session: true })
    const res = await batch(
      api,
      [
        { method: 'DELETE', path: `/users/${user.id}`, body: { current_password: password } },
        { method: 'PATCH', path: `/users/${user.id}`, body: { name: 'After', current_password: password } },
      ],
      { auth: user.token },
    )
    assertProblem(res, 403, 'current_password_required', 1)
    const [row] = await sql`SELECT deleted_at, name FROM users WHERE id = ${user.id}`
    assert.equal(row!.deleted_at, null)
  })
})

describe('Idempotency-Key covers the whole batch', () => {
  test("a stored batch answer is not replayed to the same user's key that may not run its operations", async () => {
    const key = `batch-replay-${process.pid}`
    const operations = [{ method: 'GET', path: `/users/${api.admin.id}` }]
    const first = await batch(api, operations, { headers: { 'idempotency-key': key } })
    assert.equal(first.status, 200, first.text)
    const login = await api.loginJwtFor(api.admin.id, 'admin')
    const narrow = await api.request('POST', '/api-keys', {
      auth: login,
      body: { name: `narrow-${process.pid}`, scopes: ['products:read'] },
    })
    assert.equal(narrow.status, 201, narrow.text)
    const replay = await batch(api, operations, {
      headers: { 'idempotency-key': key, 'x-api-key': narrow.body.key as string },
    })
    assertProblem(replay, 403, 'insufficient_scope', 0)
    assert.equal(replay.headers.get('idempotent-replayed'), null)
    assert.doesNotMatch(replay.text, /"email"/)
  })

  test('a retry replays the first answer; another body is 422; another user with the key runs its own', async () => {
    const key = `batch-key-${process.pid}`
    const operations = [create(product()), create(product())]
    const first = await batch(api, operations, { headers: { 'idempotency-key': key } })
    assert.equal(first.status, 200, first.text)
    const again = await batch(api, operations, { headers: { 'idempotency-key': key } })
    assert.equal(again.status, 200)
    assert.equal(again.headers.get('idempotent-replayed'), 'true')
    assert.deepEqual(again.body, first.body)
    assert.equal(await productsWithSku(operations.map((o) => o.body.sku)), 2)
    const other = await batch(api, [create(product())], { headers: { 'idempotency-key': key } })
    assertProblem(other, 422, 'idempotency_key_reused')

    const second = await api.createUser({ role: 'admin' })
    const theirs = await batch(api, [create(product())], { auth: second.token, headers: { 'idempotency-key': key } })
    assert.equal(theirs.status, 200, theirs.text)
    assert.equal(theirs.headers.get('idempotent-replayed'), null)
    const replayOfMine = await batch(api, operations, { auth: second.token, headers: { 'idempotency-key': key } })
    assertProblem(replayOfMine, 422, 'idempotency_key_reused')
  })
})

describe('rate limits, If-Match rules and queued mail, per operation', async () => {
  const mail = captureMail()
  const limited = await startServer(
    { RATE_LIMIT: '5', REQUIRE_IF_MATCH: 'true', VERIFY_EMAIL_URL: 'https://app.example.test/verify#{token}' },
    {},
    // A database of its own: its mail worker is the only one that sends what it queues.
    { tuning: mail.tuning },
  )

  test('a batch of N operations counts N requests; past the limit, the operation that passes it is 429', async () => {
    const admin = await limited.createUser({ role: 'admin' })
    const five = await batch(
      limited,
      [1, 2, 3, 4, 5].map(() => create(product())),
      { auth: admin.token },
    )
    assert.equal(five.status, 200, five.text)
    assert.equal(five.headers.get('ratelimit-remaining'), '0')
    const next = await batch(limited, [create(product())], { auth: admin.token })
    assertProblem(next, 429, 'rate_limited')
    assert.ok(Number(next.headers.get('retry-after')) >= 1)

    const other = await limited.createUser({ role: 'admin' })
    const bodies = Array.from({ length: 6 }, () => product())
    const six = await batch(
      limited,
      bodies.map((b) => create(b)),
      { auth: other.token },
    )
    assertProblem(six, 429, 'rate_limited', 5)
    assert.ok(Number(six.headers.get('retry-after')) >= 1)
    assert.equal(
      await productsWithSku(
        bodies.map((b) => b.sku),
        limited.sql,
      ),
      0,
    )
  })

  test('REQUIRE_IF_MATCH: a write without if_match is 428 with its index', async () => {
    const admin = await limited.createUser({ role: 'admin' })
    const { body } = await limited.request('POST', '/products', { auth: admin.token, body: product() })
    const res = await batch(
      limited,
      [
        { method: 'PATCH', path: `/products/${body.id}`, body: { stock: 9 }, if_match: '"v1"' },
        { method: 'DELETE', path: `/products/${body.id}` },
      ],
      { auth: admin.token },
    )
    assertProblem(res, 428, 'precondition_required', 1)
    assert.equal((await limited.sql`SELECT stock FROM products WHERE id = ${body.id}`)[0]!.stock, 0)
  })

  test('users created by a batch that fails get no verification mail; by one that succeeds, each its own', async () => {
    const admin = await limited.createUser({ role: 'admin' })
    const email = (n: number) => `batch-mail-${process.pid}-${n}@example.test`
    const signUp = (n: number) => ({ method: 'POST', path: '/users', body: { name: `Mail ${n}`, email: email(n) } })
    const failed = await batch(limited, [signUp(1), signUp(2), signUp(1)], { auth: admin.token })
    assertProblem(failed, 409, 'email_taken', 2)
    assert.equal((await limited.sql`SELECT id FROM users WHERE email IN (${email(1)}, ${email(2)})`).length, 0)
    const done = await batch(limited, [signUp(3), signUp(4)], { auth: admin.token })
    assert.equal(done.status, 200, done.text)
    // Mail is sent in the order it was queued: once the later batch's is out, the failed one's would have been.
    await mail.messagesTo(limited.sql, email(3), 'mail.verify_email')
    await mail.messagesTo(limited.sql, email(4), 'mail.verify_email')
    assert.deepEqual(
      mail.sent().filter((m) => m.to === email(1) || m.to === email(2)),
      [],
    )
  })
})

test("a user's purge erases the stored answers that show it: a POST /users and a batch (Idempotency-Key)", async () => {
  const email = `erased-${process.pid}@example.test`
  const created = await api.request('POST', '/users', {
    body: { name: 'Erased', email },
    headers: { 'idempotency-key': `erase-single-${process.pid}` },
  })
  assert.equal(created.status, 201, created.text)
  const read = await batch(api, [{ method: 'GET', path: `/users/${created.body.id}` }], {
    headers: { 'idempotency-key': `erase-batch-${process.pid}` },
  })
  assert.equal(read.status, 200, read.text)
  const stored = async () =>
    (await sql`SELECT count(*)::int AS n FROM idempotency_keys WHERE position(${email} IN body) > 0`)[0]!.n
  assert.equal(await stored(), 2)
  assert.equal((await api.request('DELETE', `/users/${created.body.id}?permanent=true`)).status, 204)
  assert.equal(await stored(), 0)
})
