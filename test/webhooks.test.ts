import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { describe, test } from 'node:test'
import { Webhook } from 'standardwebhooks'
import { signJwt, type JwtClaims } from '../src/auth/jwt.js'
import { signatureOf } from '../src/core/http/standard-webhooks.js'
import { waitUntil } from './helpers/wait.js'
import { startServer, type TestServer } from './helpers/server.js'
import { resetRequestsWorked } from './helpers/accounts.js'
import { startTestProvider } from './helpers/oidc-provider.js'
import { answerEndlessly, answerWith, startReceiver, type Reception } from './helpers/webhook-receiver.js'
import { rfcTotp } from './helpers/totp.js'

// Webhooks through the real server: registration and its refusals, the
// deliveries a receiver gets (checked with the standardwebhooks package, an
// independent implementation of the signature), retries, and the record of
// every attempt.

const fast = { pollMs: 50, retryDelaysMs: [50, 50, 50, 50], retryJitter: 0, timeoutMs: 1000, leaseMs: 3000 }

function webhookServer(tuning: Record<string, unknown> = {}, env: Record<string, string> = {}): Promise<TestServer> {
  return startServer({ WEBHOOK_ALLOW_PRIVATE: 'true', ...env }, {}, { tuning: { webhooks: { ...fast, ...tuning } } })
}

/**
 * A one-time token of `purpose` for the user, made in the database as the recovery endpoints make one (its message is
 * not the point here).
 */
async function oneTimeToken(
  server: TestServer,
  userId: number,
  purpose: 'password_reset' | 'verify_email' | 'email_restore',
  email: string | null = null,
): Promise<string> {
  const token = `upa_ot_${randomBytes(32).toString('base64url')}`
  await server.sql`
    INSERT INTO one_time_tokens (purpose, user_id, token_hash, email, expires_at)
    VALUES (${purpose}, ${userId}, ${createHash('sha256').update(token).digest()}, ${email}, now() + interval '1 hour')`
  return token
}

interface Created {
  id: number
  secret: string
  [member: string]: unknown
}

async function register(server: TestServer, body: Record<string, unknown>): Promise<Created> {
  const res = await server.request('POST', '/webhooks', { body })
  assert.equal(res.status, 201, res.text)
  return res.body as Created
}

async function createProduct(server: TestServer, sku: string): Promise<number> {
  const res = await server.request('POST', '/products', {
    body: { sku, name: `Product ${sku}`, price: 100, currency: 'EUR' },
  })
  assert.equal(res.status, 201, res.text)
  return res.body.id
}

const deliveriesOf = async (server: TestServer, webhookId: number, query = '') => {
  const res = await server.request('GET', `/webhooks/${webhookId}/deliveries${query}`)
  assert.equal(res.status, 200, res.text)
  return res
}

const verify = (secret: string, r: Reception) => new Webhook(secret).verify(r.body, r.headers as Record<string, string>)

describe('webhook registration', () => {
  test('creates a webhook and shows its secret once, never again', async () => {
    const server = await webhookServer()
    const res = await server.request('POST', '/webhooks', {
      body: { url: 'http://127.0.0.1:9/hook', event_types: ['product.created'], description: 'catalogue sync' },
    })
    assert.equal(res.status, 201)
    assert.equal(res.headers.get('cache-control'), 'no-store')
    assert.equal(res.headers.get('location'), `/webhooks/${res.body.id}`)
    assert.equal(res.headers.get('etag'), '"v1"')
    assert.match(res.body.secret, /^whsec_[A-Za-z0-9+/]{43}=$/)
    assert.equal(Buffer.from(res.body.secret.slice(6), 'base64').length, 32)
    const { id, secret, created_at, updated_at, ...rest } = res.body
    assert.deepEqual(rest, {
      url: 'http://127.0.0.1:9/hook',
      event_types: ['product.created'],
      description: 'catalogue sync',
      status: 'active',
      last_error: null,
      created_by: server.admin.id,
      owner_id: server.admin.id,
    })
    const read = await server.request('GET', `/webhooks/${id}`)
    assert.equal(read.status, 200)
    assert.deepEqual(read.body, { id, ...rest, created_at, updated_at })
    const [row] = await server.sql`SELECT secret_sealed FROM webhooks WHERE id = ${id}`
    assert.match(row!.secret_sealed, /^v1\.test\./)
    assert.ok(!row!.secret_sealed.includes(secret.slice(6)), 'stored sealed, not as sent')
    // Not idempotently replayable: the answer would have to be stored with its secret.
    const again = await server.request('POST', '/webhooks', {
      body: { url: 'http://127.0.0.1:9/hook', event_types: ['product.created'] },
      headers: { 'idempotency-key': 'k-1' },
    })
    const twice = await server.request('POST', '/webhooks', {
      body: { url: 'http://127.0.0.1:9/hook', event_types: ['product.created'] },
      headers: { 'idempotency-key': 'k-1' },
    })
    assert.equal(again.status, 201)
    assert.equal(twice.status, 201)
    assert.notEqual(again.body.id, twice.body.id)
    assert.notEqual(again.body.secret, twice.body.secret)
    const [{ stored }] = await server.sql`SELECT count(*)::int AS stored FROM idempotency_keys`
    assert.equal(stored, 0)
  })

  test('refuses hostile and malformed bodies with 400 or 422, and stores nothing', async () => {
    const server = await webhookServer()
    const url = 'http://127.0.0.1:9/hook'
    const event_types = ['product.created']
    const cases: Array<[string, unknown, number, string?]> = [
      ['url of the wrong type', { url: 5, event_types }, 422, '/url'],
      ['event_types not a list', { url, event_types: 'product.created' }, 422, '/event_types'],
      ['an unknown member', { url, event_types, secret: 'whsec_mine' }, 422, '/secret'],
      ['the sealed secret as a member', { url, event_types, secret_sealed: 'x' }, 422, '/secret_sealed'],
      ['an id', { url, event_types, id: 7 }, 422, '/id'],
      ['a NUL byte in the URL', { url: 'http://127.0.0.1:9/a\u0000b', event_types }, 422, '/url'],
      ['a NUL byte in the description', { url, event_types, description: 'a\u0000b' }, 422, '/description'],
      ['a 100 kB URL', { url: `http://127.0.0.1:9/${'a'.repeat(100_000)}`, event_types }, 422, '/url'],
      ['an ftp URL', { url: 'ftp://127.0.0.1/hook', event_types }, 422, '/url'],
      ['a javascript: URL', { url: 'javascript:alert(1)', event_types }, 422, '/url'],
      ['a URL with userinfo', { url: 'http://user:pass@127.0.0.1:9/hook', event_types }, 422, '/url'],
      ['a URL with a user name only', { url: 'http://user@127.0.0.1:9/hook', event_types }, 422, '/url'],
      ['a URL with spaces', { url: 'http://127.0.0.1:9/a b', event_types }, 422, '/url'],
      ['not a URL', { url: 'http://', event_types }, 422, '/url'],
      ['an unknown event type', { url, event_types: ['product.exploded'] }, 422, '/event_types/0'],
      ['an event type of the webhooks themselves', { url, event_types: ['webhook.created'] }, 422, '/event_types/0'],
      ['an empty list of event types', { url, event_types: [] }, 422, '/event_types'],
      ['duplicate event types', { url, event_types: ['product.created', 'product.created'] }, 422, '/event_types'],
      ['status disabled', { url, event_types, status: 'disabled' }, 422, '/status'],
      ['an unknown status', { url, event_types, status: 'on' }, 422, '/status'],
      ['a description of 501 characters', { url, event_types, description: 'd'.repeat(501) }, 422, '/description'],
      ['no URL', { event_types }, 422, '/url'],
      ['an array body', [url], 422],
      ['malformed JSON', '{"url":', 400],
      [
        'a duplicate member',
        '{"url":"http://127.0.0.1:9/a","url":"http://127.0.0.1:9/b","event_types":["product.created"]}',
        400,
      ],
    ]
    for (const [what, body, status, path] of cases) {
      const res = await server.request('POST', '/webhooks', { body })
      assert.equal(res.status, status, `${what}: ${res.text.slice(0, 300)}`)
      assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/, what)
      if (path)
        assert.ok(
          res.body.errors.some((e: { path: string }) => e.path === path),
          `${what}: ${JSON.stringify(res.body.errors)}`,
        )
    }
    await server.published()
    const [{ webhooks, events }] = await server.sql`
      SELECT (SELECT count(*)::int FROM webhooks) AS webhooks,
        (SELECT count(*)::int FROM events WHERE type LIKE 'webhook.%') + (SELECT count(*)::int FROM event_outbox) AS
        events`
    assert.deepEqual({ webhooks, events }, { webhooks: 0, events: 0 })
  })

  test('answers 401 without or with a forged credential, and 403 to a plain user or without the scope', async () => {
    const server = await webhookServer()
    const hook = await register(server, { url: 'http://127.0.0.1:9/hook', event_types: ['product.created'] })
    const before = await server.sql`SELECT * FROM webhooks ORDER BY id`
    const now = Math.floor(Date.now() / 1000)
    const forged = signJwt(
      {
        sub: String(server.admin.id),
        iss: 'users-products-api',
        aud: 'users-products-api',
        iat: now,
        exp: now + 900,
        role: 'admin',
        scope: 'webhooks:read webhooks:write',
        sid: String(2 ** 53),
        gen: 0,
      } as JwtClaims,
      { kid: 'test', secret: Buffer.from('another-secret-that-is-at-least-32-bytes-long') },
    )
    const user = await server.createUser()
    const readOnlyAdmin = server.jwtFor(server.admin.id, 'admin', ['webhooks:read'])
    const calls: Array<[string, string, unknown?]> = [
      ['GET', '/webhooks'],
      ['POST', '/webhooks', { url: 'http://127.0.0.1:9/x', event_types: ['product.created'] }],
      ['GET', `/webhooks/${hook.id}`],
      ['PATCH', `/webhooks/${hook.id}`, { status: 'paused' }],
      ['DELETE', `/webhooks/${hook.id}`],
      ['POST', `/webhooks/${hook.id}/rotate-secret`],
      ['GET', `/webhooks/${hook.id}/deliveries`],
      ['POST', '/webhook-deliveries/1/retry'],
    ]
    for (const [method, path, body] of calls) {
      assert.equal(
        (await server.request(method, path, { body, auth: null })).status,
        401,
        `${method} ${path} anonymous`,
      )
      assert.equal((await server.request(method, path, { body, auth: forged })).status, 401, `${method} ${path} forged`)
      const asUser = await server.request(method, path, { body, auth: user.token })
      assert.equal(asUser.status, 403, `${method} ${path} as a user`)
      if (method !== 'GET')
        assert.equal(
          (await server.request(method, path, { body, auth: readOnlyAdmin })).body.code,
          'insufficient_scope',
          `${method} ${path} read-only`,
        )
    }
    assert.deepEqual(await server.sql`SELECT * FROM webhooks ORDER BY id`, before)
  })

  test('lists, changes (merge patch with If-Match), pauses and deletes webhooks', async () => {
    const server = await webhookServer()
    const a = await register(server, { url: 'http://127.0.0.1:9/a', event_types: ['product.created'] })
    const b = await register(server, {
      url: 'http://127.0.0.1:9/b',
      event_types: ['user.created', 'user.deleted'],
      status: 'paused',
    })
    const list = await server.request('GET', '/webhooks?sort=-id')
    assert.equal(list.status, 200)
    assert.deepEqual(
      list.body.map((w: { id: number }) => w.id),
      [b.id, a.id],
    )
    assert.ok(list.body.every((w: Record<string, unknown>) => !('secret' in w) && !('secret_sealed' in w)))
    const paused = await server.request('GET', '/webhooks?status=paused')
    assert.deepEqual(
      paused.body.map((w: { id: number }) => w.id),
      [b.id],
    )

    const stale = await server.request('PATCH', `/webhooks/${a.id}`, {
      body: { status: 'paused' },
      headers: { 'if-match': '"v9"' },
    })
    assert.equal(stale.status, 412)
    const changed = await server.request('PATCH', `/webhooks/${a.id}`, {
      body: {
        url: 'http://127.0.0.1:9/new',
        event_types: ['product.updated', 'product.deleted'],
        description: 'moved',
        status: 'paused',
      },
      headers: { 'if-match': '"v1"' },
    })
    assert.equal(changed.status, 200, changed.text)
    assert.equal(changed.headers.get('etag'), '"v2"')
    assert.deepEqual(
      [changed.body.url, changed.body.event_types, changed.body.description, changed.body.status],
      ['http://127.0.0.1:9/new', ['product.updated', 'product.deleted'], 'moved', 'paused'],
    )
    const cleared = await server.request('PATCH', `/webhooks/${a.id}`, {
      body: { description: null, status: 'active' },
    })
    assert.deepEqual([cleared.body.description, cleared.body.status], ['', 'active'])

    for (const [body, path] of [
      [{ status: 'disabled' }, '/status'],
      [{ url: 'ftp://x/' }, '/url'],
      [{ event_types: [] }, '/event_types'],
      [{ secret: 'whsec_x' }, '/secret'],
      [{ url: 'http://u:p@127.0.0.1/' }, '/url'],
    ] as const) {
      const res = await server.request('PATCH', `/webhooks/${a.id}`, { body })
      assert.equal(res.status, 422, JSON.stringify(body))
      assert.equal(res.body.errors[0].path, path)
    }
    const [row] = await server.sql`SELECT url, status, version FROM webhooks WHERE id = ${a.id}`
    assert.deepEqual({ ...row }, { url: 'http://127.0.0.1:9/new', status: 'active', version: 3 })

    assert.equal((await server.request('DELETE', `/webhooks/${a.id}`)).status, 204)
    assert.equal((await server.request('GET', `/webhooks/${a.id}`)).status, 404)
    assert.equal((await server.request('GET', `/webhooks/${a.id}/deliveries`)).status, 404)
    await server.published()
    const types =
      await server.sql`SELECT type FROM events WHERE subject_type = 'webhook' AND subject_id = ${a.id} ORDER BY id`
    assert.deepEqual(
      types.map((e) => e.type),
      ['webhook.created', 'webhook.updated', 'webhook.updated', 'webhook.deleted'],
    )
  })

  test('never shows the secret in a read, a list, an event or a log line', async () => {
    const server = await webhookServer()
    const hook = await register(server, { url: 'http://127.0.0.1:9/hook', event_types: ['product.created'] })
    const rotated = await server.request('POST', `/webhooks/${hook.id}/rotate-secret`, {
      body: { keep_previous_for: 60 },
    })
    assert.equal(rotated.status, 200)
    assert.equal(rotated.headers.get('cache-control'), 'no-store')
    const secrets = [hook.secret, rotated.body.secret as string]
    await server.published()
    const seen = [
      (await server.request('GET', `/webhooks/${hook.id}`)).text,
      (await server.request('GET', '/webhooks')).text,
      (await server.request('GET', '/events?type[in]=webhook.created,webhook.updated')).text,
      JSON.stringify(await server.sql`SELECT data FROM events`),
      JSON.stringify(server.logs),
    ]
    for (const secret of secrets) {
      for (const text of seen) {
        assert.ok(!text.includes(secret.slice(6)), 'the secret is shown')
        assert.ok(!text.includes(Buffer.from(secret.slice(6), 'base64').toString('hex')), 'the secret is shown in hex')
      }
    }
    await server.published()
    const events = (await server.request('GET', '/events?type[in]=webhook.created,webhook.updated')).body
    assert.equal(events.length, 2)
    for (const e of events)
      assert.deepEqual(Object.keys(e.data).sort(), [
        'created_at',
        'created_by',
        'description',
        'event_types',
        'id',
        'last_error',
        'owner_id',
        'status',
        'updated_at',
        'url',
      ])
  })
})

describe('webhook deliveries', () => {
  test(
    'delivers every event type asked for once per event, with the event as GET /events shows it, ' + 'signed',
    async (t) => {
      // An identity provider, for the link of one of its accounts (test/helpers/oidc-provider.ts).
      const provider = await startTestProvider()
      t.after(() => provider.close())
      // Account recovery on, for its events; its messages go to the console transport (this process's standard error).
      const server = await webhookServer(
        {},
        {
          PASSWORD_RESET_URL: 'https://app.example.com/reset/{token}',
          VERIFY_EMAIL_URL: 'https://app.example.com/verify/{token}',
          OIDC_ISSUER: provider.issuer,
          OIDC_AUDIENCE: provider.audience,
          EMAIL_RESTORE_URL: 'https://app.example.com/restore/{token}',
        },
      )
      const trashed: number[] = []
      for (const name of ['Restored', 'Purged']) {
        const made = await server.request('POST', '/users', { body: { name, email: `${name}@example.com` } })
        assert.equal((await server.request('DELETE', `/users/${made.body.id}`)).status, 204)
        trashed.push(made.body.id)
      }
      // Published before the webhook exists, so that none of theirs is delivered to it.
      await server.published()
      const receiver = await startReceiver()
      const hook = await register(server, { url: receiver.url, event_types: [...server.deps.registry.eventTypes] })
      await server.published()
      const [{ since }] = await server.sql`SELECT max(id)::int AS since FROM events`
      // One of each: users, products, API keys, sessions and a failed login.
      const user = await server.request('POST', '/users', {
        body: { name: 'Hook User', email: 'hook-user@example.com', password: 'a long password' },
      })
      assert.equal(user.status, 201)
      assert.equal(
        (await server.request('PATCH', `/users/${user.body.id}`, { body: { name: 'Hook User 2' } })).status,
        200,
      )
      const product = await createProduct(server, 'HOOK-1')
      assert.equal((await server.request('PATCH', `/products/${product}`, { body: { stock: 3 } })).status, 200)
      assert.equal((await server.request('DELETE', `/products/${product}`)).status, 204)
      // From the trash and back, then purged for good.
      assert.equal((await server.request('POST', `/products/${product}/restore`)).status, 200)
      assert.equal((await server.request('DELETE', `/products/${product}?permanent=true`)).status, 204)
      const key = await server.request('POST', '/api-keys', { body: { name: 'hook key', scopes: ['products:read'] } })
      assert.equal(key.status, 201)
      assert.equal((await server.request('DELETE', `/api-keys/${key.body.id}`)).status, 204)
      const login = await server.request('POST', '/auth/login', {
        body: { email: 'hook-user@example.com', password: 'a long password' },
        auth: null,
      })
      assert.equal(login.status, 200)
      assert.equal((await server.request('POST', '/auth/logout', { auth: login.body.access_token })).status, 204)
      assert.equal(
        (
          await server.request('POST', '/auth/login', {
            body: { email: 'hook-user@example.com', password: 'wrong password' },
            auth: null,
          })
        ).status,
        401,
      )
      assert.equal(
        (await server.request('POST', '/auth/password-reset', { body: { email: 'hook-user@example.com' }, auth: null }))
          .status,
        202,
      )
      // Its work runs after the 202 and retires the user's open reset tokens: the token below comes after it.
      await resetRequestsWorked(server, 'hook-user@example.com', 1)
      const resetToken = await oneTimeToken(server, user.body.id, 'password_reset')
      assert.equal(
        (
          await server.request('POST', '/auth/password-reset/confirm', {
            body: { token: resetToken, password: 'another long password' },
            auth: null,
          })
        ).status,
        204,
      )
      const verifyToken = await oneTimeToken(server, user.body.id, 'verify_email', 'hook-user@example.com')
      assert.equal(
        (await server.request('POST', '/auth/verify-email', { body: { token: verifyToken }, auth: null })).status,
        204,
      )
      const restoreToken = await oneTimeToken(server, user.body.id, 'email_restore', 'hook-user-before@example.com')
      assert.equal(
        (await server.request('POST', '/auth/email-restore', { body: { token: restoreToken }, auth: null })).status,
        204,
      )
      // The user turns a second factor on; the admin takes it off again.
      const session = await server.request('POST', '/auth/login', {
        body: { email: 'hook-user-before@example.com', password: 'another long password' },
        auth: null,
      })
      assert.equal(session.status, 200, session.text)
      const started = await server.request('POST', '/auth/mfa/totp', { auth: session.body.access_token })
      assert.equal(started.status, 201, started.text)
      const confirmed = await server.request('POST', '/auth/mfa/totp/confirm', {
        auth: session.body.access_token,
        body: { code: rfcTotp(started.body.secret, server.clock.now()) },
      })
      assert.equal(confirmed.status, 200, confirmed.text)
      assert.equal((await server.request('DELETE', `/users/${user.body.id}/mfa`)).status, 204)
      // The admin links an account of the provider to itself (its test session is a fresh login).
      const at = Math.floor(Date.now() / 1000)
      const claims = { sub: 'hook-person', email: 'hook-person@example.com', email_verified: true }
      const providerToken = provider.sign({
        iss: provider.issuer,
        aud: provider.audience,
        iat: at,
        exp: at + 300,
        ...claims,
      })
      const linked = await server.request('POST', '/auth/identities', { body: { token: providerToken } })
      assert.equal(linked.status, 201, linked.text)
      assert.equal((await server.request('DELETE', `/users/${user.body.id}`)).status, 204)
      // From the trash: one user back, another purged (a purge erases what the events of its user said, so that one's
      // other events came before the webhook).
      assert.equal((await server.request('POST', `/users/${trashed[0]}/restore`)).status, 200)
      assert.equal((await server.request('DELETE', `/users/${trashed[1]}?permanent=true`)).status, 204)

      await server.published()
      const feed = await server.request('GET', `/events?id[gt]=${since}&limit=200`)
      const wanted = feed.body.filter((e: { type: string }) => server.deps.registry.eventTypes.includes(e.type))
      assert.deepEqual(new Set(wanted.map((e: { type: string }) => e.type)), new Set(server.deps.registry.eventTypes))
      await receiver.waitFor('every event', (r) => r.length >= wanted.length)
      await server.deps.webhooks.drain() // a duplicate due would have been sent by now
      assert.equal(receiver.received.length, wanted.length)
      const counts = receiver.countsById()
      for (const event of wanted) {
        assert.equal(counts.get(String(event.id)), 1, `event ${event.id} (${event.type}) received once`)
        const reception = receiver.received.find((r) => r.headers['webhook-id'] === String(event.id))!
        assert.equal(
          reception.body,
          JSON.stringify(event),
          `${event.type}: the body is the event as GET /events shows it`,
        )
        assert.equal(reception.headers['content-type'], 'application/json')
        assert.match(String(reception.headers['user-agent']), /users-products-api/)
        assert.ok(Math.abs(Number(reception.headers['webhook-timestamp']) - Date.now() / 1000) < 30)
        assert.match(String(reception.headers['webhook-signature']), /^v1,[A-Za-z0-9+/]{43}=$/)
        assert.deepEqual(verify(hook.secret, reception), event)
      }
      const r = receiver.received[0]!
      assert.throws(() => verify(hook.secret, { ...r, body: r.body.replace('"type":"', '"type":"x') }), /signature/i)
      assert.throws(() => verify(`whsec_${Buffer.alloc(32, 1).toString('base64')}`, r), /signature/i)
      // An old timestamp fails even with a correct signature over it.
      const old = Math.floor(Date.now() / 1000) - 600
      const oldHeaders = {
        ...r.headers,
        'webhook-timestamp': String(old),
        'webhook-signature': signatureOf(hook.secret, String(r.headers['webhook-id']), old, r.body),
      }
      assert.throws(() => verify(hook.secret, { ...r, headers: oldHeaders }), /timestamp/i)
      const [{ succeeded, others }] = await server.sql`
      SELECT count(*) FILTER (WHERE status = 'succeeded')::int AS succeeded, count(*) FILTER (WHERE status <>
      'succeeded')::int AS others
      FROM webhook_deliveries WHERE webhook_id = ${hook.id}`
      assert.deepEqual({ succeeded, others }, { succeeded: wanted.length, others: 0 })
    },
  )

  test('delivers only the types asked for, and nothing to a deleted webhook', async () => {
    const server = await webhookServer()
    const receiver = await startReceiver()
    const other = await startReceiver()
    await register(server, { url: receiver.url, event_types: ['product.updated'] })
    const gone = await register(server, { url: other.url, event_types: ['product.created', 'product.updated'] })
    assert.equal((await server.request('DELETE', `/webhooks/${gone.id}`)).status, 204)
    const product = await createProduct(server, 'ONLY-1')
    assert.equal((await server.request('PATCH', `/products/${product}`, { body: { stock: 1 } })).status, 200)
    await receiver.waitFor('the update', (r) => r.length === 1)
    await server.published()
    await server.deps.webhooks.drain()
    assert.equal(receiver.received.length, 1)
    assert.equal(JSON.parse(receiver.received[0]!.body).type, 'product.updated')
    assert.equal(other.received.length, 0)
    const [{ n }] = await server.sql`SELECT count(*)::int AS n FROM webhook_deliveries WHERE webhook_id = ${gone.id}`
    assert.equal(n, 0)
  })

  test(
    'retries a receiver that answers 500 three times, then 200: four attempts recorded, the same webhook-id each ' +
      'time',
    async () => {
      const server = await webhookServer()
      const receiver = await startReceiver()
      let calls = 0
      receiver.answer = (req, res, r) => answerWith(++calls <= 3 ? 500 : 200, 'ok')(req, res, r)
      const hook = await register(server, { url: receiver.url, event_types: ['product.created'] })
      await createProduct(server, 'RETRY-1')
      await receiver.waitFor('four attempts', (r) => r.length === 4)
      const ids = new Set(receiver.received.map((r) => r.headers['webhook-id']))
      assert.equal(ids.size, 1)
      for (const r of receiver.received) verify(hook.secret, r)
      await waitUntil(
        'the success recorded',
        async () => (await deliveriesOf(server, hook.id)).body[0]?.status === 'succeeded',
      )
      const [delivery] = (await deliveriesOf(server, hook.id)).body
      assert.equal(delivery.attempt_count, 4)
      assert.equal(String(delivery.event_id), [...ids][0])
      assert.equal(delivery.event_type, 'product.created')
      assert.equal(delivery.next_attempt_at, null)
      assert.deepEqual(
        delivery.attempts.map((a: { status: number }) => a.status),
        [200, 500, 500, 500],
      )
      assert.deepEqual(
        delivery.attempts.map((a: { error: string | null }) => a.error),
        [null, 'the receiver answered 500', 'the receiver answered 500', 'the receiver answered 500'],
      )
      for (const a of delivery.attempts)
        assert.ok(Number.isInteger(a.duration_ms) && a.duration_ms >= 0 && a.duration_ms < 1000)
      const attemptTimes = delivery.attempts.map((a: { attempted_at: string }) => Date.parse(a.attempted_at))
      assert.deepEqual(
        [...attemptTimes].sort((x, y) => y - x),
        attemptTimes,
        'newest first',
      )
      const [{ n }] =
        await server.sql`SELECT count(*)::int AS n FROM webhook_attempts a JOIN webhook_deliveries d ON d.id =
        a.delivery_id WHERE d.webhook_id = ${hook.id}`
      assert.equal(n, 4)
      assert.equal(receiver.received.length, 4)
    },
  )

  test('gives up after the last retry: the delivery fails with every attempt recorded', async () => {
    const server = await webhookServer({ retryDelaysMs: [30, 30] })
    const receiver = await startReceiver()
    receiver.answer = answerWith(503)
    const hook = await register(server, { url: receiver.url, event_types: ['product.created'] })
    await createProduct(server, 'GIVEUP-1')
    await waitUntil(
      'the delivery to fail',
      async () => (await deliveriesOf(server, hook.id)).body[0]?.status === 'failed',
    )
    await server.deps.webhooks.drain()
    const [delivery] = (await deliveriesOf(server, hook.id)).body
    assert.equal(delivery.attempt_count, 3)
    assert.equal(delivery.last_status, 503)
    assert.equal(receiver.received.length, 3)
  })

  test('records a time-out and an over-long answer as errors, and does not follow a redirect', async () => {
    const server = await webhookServer({ retryDelaysMs: [], timeoutMs: 700, leaseMs: 5000 })
    const silent = await startReceiver()
    silent.answer = () => {} // holds the request open
    const huge = await startReceiver()
    let sentWhenClosed: number | undefined
    huge.answer = answerEndlessly(200, (sent) => (sentWhenClosed = sent))
    const target = await startReceiver()
    const redirecting = await startReceiver()
    redirecting.answer = (_req, res) => {
      res.writeHead(307, { location: target.url })
      res.end()
    }
    const hooks = {
      silent: await register(server, { url: silent.url, event_types: ['product.created'] }),
      huge: await register(server, { url: huge.url, event_types: ['product.created'] }),
      redirecting: await register(server, { url: redirecting.url, event_types: ['product.created'] }),
    }
    await createProduct(server, 'ERRORS-1')
    const settled = async (id: number) => {
      await waitUntil(
        `webhook ${id} settled`,
        async () => ![undefined, 'pending'].includes((await deliveriesOf(server, id)).body[0]?.status),
      )
      return (await deliveriesOf(server, id)).body[0]
    }
    const timedOut = await settled(hooks.silent.id)
    assert.equal(timedOut.status, 'failed')
    assert.equal(timedOut.attempts[0].status, null)
    assert.equal(timedOut.attempts[0].error, 'no complete answer within 700 ms')
    assert.ok(
      timedOut.attempts[0].duration_ms >= 650 && timedOut.attempts[0].duration_ms < 3000,
      String(timedOut.attempts[0].duration_ms),
    )

    const bounded = await settled(hooks.huge.id)
    assert.equal(bounded.attempts[0].status, 200)
    assert.equal(bounded.attempts[0].error, 'the answer exceeded 65536 bytes; the rest was not read')
    assert.equal(bounded.status, 'succeeded', 'a 2xx is a success; the bound only limits what is read')
    await waitUntil('the receiver to see the connection closed', async () => sentWhenClosed !== undefined)
    assert.ok(sentWhenClosed! < 5 * 1024 * 1024, `the connection was closed after ${sentWhenClosed} bytes`)

    const redirected = await settled(hooks.redirecting.id)
    assert.equal(redirected.status, 'failed')
    assert.equal(redirected.attempts[0].status, 307)
    assert.equal(redirected.attempts[0].error, `redirect to http://127.0.0.1:${target.port} not followed`)
    // Recorded once its request had ended: a redirect followed would have reached the target before.
    assert.equal(target.received.length, 0)
  })

  test(
    "records and logs only the origin of a redirect's target, never its path or query (a receiver's " +
      '?token=SECRET)',
    async () => {
      const server = await webhookServer({ retryDelaysMs: [] })
      const absolute = await startReceiver()
      absolute.answer = (_req, res) => {
        res.writeHead(302, {
          location: 'https://login.example.com:8443/callback/SECRET-PATH?token=SECRET-QUERY#SECRET-FRAGMENT',
        })
        res.end()
      }
      const relative = await startReceiver()
      relative.answer = (_req, res) => {
        res.writeHead(301, { location: '/moved/SECRET-PATH?token=SECRET-QUERY' })
        res.end()
      }
      const odd = await startReceiver()
      odd.answer = (_req, res) => {
        res.writeHead(303, { location: 'javascript:alert("SECRET-SCRIPT")' })
        res.end()
      }
      const hooks = [absolute, relative, odd].map(async (r) =>
        register(server, { url: r.url, event_types: ['product.created'] }),
      )
      const [a, b, c] = await Promise.all(hooks)
      await createProduct(server, 'REDIRECT-1')
      const settled = async (id: number) => {
        await waitUntil(
          `webhook ${id} settled`,
          async () => (await deliveriesOf(server, id)).body[0]?.status === 'failed',
        )
        return (await deliveriesOf(server, id)).body[0]
      }
      const expected: Array<[Created, string]> = [
        [a!, 'redirect to https://login.example.com:8443 not followed'],
        [b!, `redirect to http://127.0.0.1:${relative.port} not followed`],
        [c!, 'redirect to an unreadable location not followed'],
      ]
      for (const [hook, error] of expected) {
        const delivery = await settled(hook.id)
        assert.equal(delivery.last_error, error)
        assert.equal(delivery.attempts[0].error, error)
      }
      const stored =
        await server.sql`SELECT last_error FROM webhook_deliveries UNION ALL SELECT error FROM webhook_attempts UNION
        ALL SELECT last_error FROM webhooks`
      assert.ok(!JSON.stringify([...stored]).includes('SECRET'), JSON.stringify([...stored]))
      assert.ok(server.logs.some((l) => l.msg === 'webhook attempt failed'))
      assert.ok(!JSON.stringify(server.logs).includes('SECRET'), 'no log line has the path or query')
    },
  )

  test(
    'a webhook deleted while a delivery is in flight: the answer is dropped quietly, nothing of it is ' + 'left',
    async () => {
      const server = await webhookServer()
      const receiver = await startReceiver()
      let answer: () => void = () => {}
      receiver.answer = (req, res, r) => void (answer = () => answerWith(200)(req, res, r))
      const hook = await register(server, { url: receiver.url, event_types: ['product.created'] })
      await createProduct(server, 'GONE-1')
      await receiver.waitFor('the attempt', (r) => r.length === 1)
      assert.equal((await server.request('DELETE', `/webhooks/${hook.id}`)).status, 204)
      answer()
      await server.deps.webhooks.drain()
      assert.deepEqual(
        server.logs.filter((l) => l.level === 'error' || l.level === 'warn'),
        [],
      )
      const [{ deliveries, attempts }] = await server.sql`
      SELECT (SELECT count(*)::int FROM webhook_deliveries) AS deliveries, (SELECT count(*)::int FROM
      webhook_attempts) AS attempts`
      assert.deepEqual({ deliveries, attempts }, { deliveries: 0, attempts: 0 })
    },
  )

  test('holds the deliveries of a paused webhook and sends them on resume', async () => {
    const server = await webhookServer()
    const receiver = await startReceiver()
    const hook = await register(server, { url: receiver.url, event_types: ['product.created'] })
    assert.equal((await server.request('PATCH', `/webhooks/${hook.id}`, { body: { status: 'paused' } })).status, 200)
    await createProduct(server, 'PAUSE-1')
    await createProduct(server, 'PAUSE-2')
    await server.published()
    await server.deps.webhooks.drain()
    assert.equal(receiver.received.length, 0)
    const [{ pending, attempts }] = await server.sql`
      SELECT count(*)::int AS pending, sum(attempts)::int AS attempts FROM webhook_deliveries
        WHERE webhook_id = ${hook.id} AND status = 'pending'`
    assert.deepEqual({ pending, attempts }, { pending: 2, attempts: 0 })
    assert.equal((await server.request('PATCH', `/webhooks/${hook.id}`, { body: { status: 'active' } })).status, 200)
    await receiver.waitFor('both deliveries', (r) => r.length === 2)
  })

  test('pages deliveries newest first with a Link to the next page, and filters them by status', async () => {
    const server = await webhookServer()
    const receiver = await startReceiver()
    const hook = await register(server, { url: receiver.url, event_types: ['product.created'] })
    for (const sku of ['PAGE-1', 'PAGE-2', 'PAGE-3']) await createProduct(server, sku)
    await receiver.waitFor('three deliveries', (r) => r.length === 3)
    await waitUntil(
      'all recorded',
      async () =>
        (await deliveriesOf(server, hook.id, '?status=succeeded&count=true')).headers.get('x-total-count') === '3',
    )
    const first = await deliveriesOf(server, hook.id, '?limit=2')
    assert.equal(first.body.length, 2)
    assert.ok(first.body[0].id > first.body[1].id)
    const link = /^<([^>]+)>; rel="next"$/.exec(first.headers.get('link') ?? '')
    assert.ok(link, first.headers.get('link') ?? 'no link')
    assert.match(link[1]!, new RegExp(`^/webhooks/${hook.id}/deliveries\\?`))
    const second = await server.request('GET', link[1]!)
    assert.equal(second.status, 200)
    assert.equal(second.body.length, 1)
    assert.ok(second.body[0].id < first.body[1].id)
    assert.equal(second.headers.get('link'), null)
    assert.equal((await deliveriesOf(server, hook.id, '?status=failed')).body.length, 0)
    const unknown = await server.request('GET', `/webhooks/${hook.id}/deliveries?status=lost`)
    assert.equal(unknown.status, 400)
    assert.equal((await server.request('GET', '/webhooks/999999/deliveries')).status, 404)
  })

  test(
    'signs with the previous secret too after a rotation that keeps it, for the time asked, and with the new one ' +
      'only after one that does not',
    async () => {
      const server = await webhookServer()
      const receiver = await startReceiver()
      const hook = await register(server, { url: receiver.url, event_types: ['product.created'] })
      const kept = await server.request('POST', `/webhooks/${hook.id}/rotate-secret`, {
        body: { keep_previous_for: 3600 },
      })
      assert.equal(kept.status, 200)
      assert.equal(kept.headers.get('etag'), '"v2"')
      assert.notEqual(kept.body.secret, hook.secret)
      // The overlap ends an hour after the rotation by the database's clock, which the worker compares it with.
      const [{ overlap }] = await server.sql<[{ overlap: number }]>`
      SELECT extract(epoch FROM previous_secret_expires_at - updated_at)::float AS overlap FROM webhooks
        WHERE id = ${hook.id}`
      assert.ok(overlap > 3599 && overlap <= 3600, `previous secret kept ${overlap} s after the rotation`)
      await createProduct(server, 'ROTATE-1')
      await receiver.waitFor('a delivery', (r) => r.length === 1)
      const both = receiver.received[0]!
      assert.equal(String(both.headers['webhook-signature']).split(' ').length, 2)
      verify(kept.body.secret, both)
      verify(hook.secret, both)

      const replaced = await server.request('POST', `/webhooks/${hook.id}/rotate-secret`)
      assert.equal(replaced.status, 200)
      await createProduct(server, 'ROTATE-2')
      await receiver.waitFor('a second delivery', (r) => r.length === 2)
      const one = receiver.received[1]!
      verify(replaced.body.secret, one)
      assert.throws(() => verify(kept.body.secret, one), /signature/i)
      // The previous secret signs only for the time asked.
      const brief = await server.request('POST', `/webhooks/${hook.id}/rotate-secret`, {
        body: { keep_previous_for: 1 },
      })
      await waitUntil('the previous secret to expire', async () => {
        const [{ expired }] = await server.sql<[{ expired: boolean }]>`
        SELECT previous_secret_expires_at <= now() AS expired FROM webhooks WHERE id = ${hook.id}`
        return expired
      })
      await createProduct(server, 'ROTATE-3')
      await receiver.waitFor('a third delivery', (r) => r.length === 3)
      const expired = receiver.received[2]!
      assert.equal(String(expired.headers['webhook-signature']).split(' ').length, 1)
      verify(brief.body.secret, expired)
      assert.throws(() => verify(replaced.body.secret, expired), /signature/i)
      assert.equal(
        (await server.request('POST', `/webhooks/${hook.id}/rotate-secret`, { body: { keep_previous_for: -1 } }))
          .status,
        422,
      )
      assert.equal(
        (
          await server.request('POST', `/webhooks/${hook.id}/rotate-secret`, {
            body: { keep_previous_for: 1, extra: 1 },
          })
        ).status,
        422,
      )
      assert.equal((await server.request('POST', '/webhooks/999999/rotate-secret')).status, 404)
    },
  )

  test('records a clear error when the key that sealed the secret is no longer configured', async () => {
    const server = await webhookServer({ retryDelaysMs: [] })
    const receiver = await startReceiver()
    const hook = await register(server, { url: receiver.url, event_types: ['product.created'] })
    await server.sql`UPDATE webhooks SET secret_sealed = regexp_replace(secret_sealed, '^v1\\.test\\.',
      'v1.retired.') WHERE id = ${hook.id}`
    await createProduct(server, 'SEALED-1')
    await waitUntil('the attempt', async () => (await deliveriesOf(server, hook.id)).body[0]?.status === 'failed')
    const [delivery] = (await deliveriesOf(server, hook.id)).body
    assert.match(delivery.attempts[0].error, /sealed under JWT secret kid "retired", which is no longer configured/)
    assert.equal(receiver.received.length, 0)
  })
})

describe('a webhook that keeps failing', () => {
  test(
    'is disabled with its last error shown, its deliveries fail, and a manual retry after re-enabling ' + 'delivers',
    async () => {
      const server = await webhookServer({ retryDelaysMs: Array(50).fill(40), disableAfterMs: 400 })
      const receiver = await startReceiver()
      receiver.answer = answerWith(500)
      const hook = await register(server, { url: receiver.url, event_types: ['product.created', 'product.updated'] })
      const product = await createProduct(server, 'DISABLE-1')
      await waitUntil(
        'the webhook to be disabled',
        async () => (await server.request('GET', `/webhooks/${hook.id}`)).body.status === 'disabled',
      )
      const disabled = await server.request('GET', `/webhooks/${hook.id}`)
      assert.equal(disabled.body.last_error, 'the receiver answered 500')
      const [delivery] = (await deliveriesOf(server, hook.id)).body
      assert.equal(delivery.status, 'failed')
      assert.ok(delivery.attempt_count >= 2)
      await server.published()
      const [event] = await server.sql`SELECT actor_credential, data FROM events WHERE type = 'webhook.updated'
          AND subject_id = ${hook.id}`
      assert.equal(event!.actor_credential, 'system')
      assert.equal(event!.data.status, 'disabled')

      // No delivery is made for a disabled webhook.
      assert.equal((await server.request('PATCH', `/products/${product}`, { body: { stock: 9 } })).status, 200)
      await server.published()
      assert.equal((await deliveriesOf(server, hook.id)).body.length, 1)

      // A retry while disabled waits for the webhook to be enabled again.
      receiver.answer = answerWith(200)
      const seen = receiver.received.length
      const retried = await server.request('POST', `/webhook-deliveries/${delivery.id}/retry`)
      assert.equal(retried.status, 200)
      assert.equal(retried.body.status, 'pending')
      await server.deps.webhooks.drain()
      assert.equal(receiver.received.length, seen)
      const enabled = await server.request('PATCH', `/webhooks/${hook.id}`, { body: { status: 'active' } })
      assert.equal(enabled.status, 200)
      assert.deepEqual([enabled.body.status, enabled.body.last_error], ['active', null])
      await receiver.waitFor('the retried delivery', (r) => r.length === seen + 1)
      await waitUntil('its success', async () => (await deliveriesOf(server, hook.id)).body[0]?.status === 'succeeded')
      const [{ failing_since }] = await server.sql`SELECT failing_since FROM webhooks WHERE id = ${hook.id}`
      assert.equal(failing_since, null)
      assert.equal((await server.request('POST', '/webhook-deliveries/999999/retry')).status, 404)
    },
  )

  test('a manual retry makes a failed delivery due now', async () => {
    const server = await webhookServer({ retryDelaysMs: [] })
    const receiver = await startReceiver()
    receiver.answer = answerWith(500)
    const hook = await register(server, { url: receiver.url, event_types: ['product.created'] })
    await createProduct(server, 'MANUAL-1')
    await waitUntil('the failure', async () => (await deliveriesOf(server, hook.id)).body[0]?.status === 'failed')
    receiver.answer = answerWith(200)
    const [failed] = (await deliveriesOf(server, hook.id)).body
    const retried = await server.request('POST', `/webhook-deliveries/${failed.id}/retry`)
    assert.equal(retried.status, 200)
    assert.equal(retried.body.id, failed.id)
    await receiver.waitFor('the retry', (r) => r.length === 2)
    assert.equal(receiver.received[0]!.headers['webhook-id'], receiver.received[1]!.headers['webhook-id'])
    await waitUntil('its success', async () => (await deliveriesOf(server, hook.id)).body[0]?.status === 'succeeded')
    const [after] = (await deliveriesOf(server, hook.id)).body
    assert.deepEqual(
      after.attempts.map((a: { status: number }) => a.status),
      [200, 500],
    )
  })
})
