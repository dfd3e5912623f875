import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { request as httpRequest } from 'node:http'
import { connect as netConnect } from 'node:net'
import { after, describe, test } from 'node:test'
import { connect } from '../src/core/db/connect.js'
import { ReadinessCheck } from '../src/health/readiness.js'
import { call, launchService } from './fault-kit.js'
import { passwordAccount, passwordLogin, resetRequestsWorked, workOf } from './helpers/accounts.js'
import { createTestDatabase, startServer, type TestResponse, type TestServer } from './helpers/server.js'
import { waitUntil } from './helpers/wait.js'
import { captureMail, tokenIn } from './helpers/captured-mail.js'

// Account recovery through the real server (docs/auth.md, "Account recovery:
// rules"): password reset, address verification, address changes, and what
// they leave in the database. Mail goes through the real console transport,
// its output kept here instead of on standard error, so that a test follows
// the link a person would.

const RESET_URL = 'https://app.example.com/reset?token={token}'
const VERIFY_URL = 'https://app.example.com/verify/{token}'

const mail = captureMail()
const { sent, tuning } = mail

const api = await startServer(
  { PASSWORD_RESET_URL: RESET_URL, VERIFY_EMAIL_URL: VERIFY_URL, TRUST_PROXY: '1' },
  {},
  { tuning },
)
// The real process for the tests of the entry point, on a database of its own: started now, it boots
// while the tests before them run.
const entryDatabase = await createTestDatabase()
const entryDb = connect(entryDatabase, { max: 2, statementTimeoutMs: 10_000 })
const entryPoint = launchService({ DATABASE_URL: entryDatabase, PASSWORD_RESET_URL: RESET_URL })
after(async () => {
  if (entryPoint.alive()) entryPoint.kill('SIGKILL')
  await entryDb.end({ timeout: 5 })
})

const unique = () => `${process.pid}-${randomBytes(4).toString('hex')}`

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.equal(res.body?.code, code, res.text)
}

/** The messages to `to` of `type`, once the worker of `server` has sent them (the outbox row gone). */
const messagesTo = (to: string, type: string, count = 1, server = api) => mail.messagesTo(server.sql, to, type, count)

const anonymous = (method: string, path: string, body: unknown, headers: Record<string, string> = {}) =>
  api.request(method, path, { auth: null, body, headers })
let octet = 0
/** A client address of its own (TRUST_PROXY=1), so that per-address limits of one test do not reach another. */
const from = () => ({ 'x-forwarded-for': `198.51.100.${++octet}` })
const askReset = (email: string, headers = from()) => anonymous('POST', '/auth/password-reset', { email }, headers)
const confirm = (token: string, password: string) =>
  anonymous('POST', '/auth/password-reset/confirm', { token, password }, from())

/**
 * Holds up the work of every reset request (its statement writes
 * the table locked here) until the returned function is called.
 */
async function holdResetWork(server: TestServer): Promise<() => Promise<void>> {
  const held = await server.sql.reserve()
  await held`BEGIN`
  await held`LOCK TABLE password_reset_requests IN ACCESS EXCLUSIVE MODE`
  return async () => {
    await held`COMMIT`
    held.release()
  }
}

async function resetToken(email: string, count = 1): Promise<string> {
  assert.equal((await askReset(email)).status, 202)
  const messages = await messagesTo(email, 'mail.password_reset', count)
  return tokenIn(messages[count - 1]!, RESET_URL)
}

describe('password reset', () => {
  test(
    'a known and an unknown address get the same 202 and headers, for the same work; only the known one is sent a ' +
      'message',
    async () => {
      // A server of the test's own: its counters count these requests and nothing else. Its database check
      // (shared for a second, src/health/readiness.ts) is made once, here, so that no request pays for a new one.
      const own = await startServer({ PASSWORD_RESET_URL: RESET_URL, TRUST_PROXY: '1' }, {}, { tuning })
      own.deps.readiness = new ReadinessCheck(
        () => own.deps.sql`SELECT 1`,
        () => own.clock.now(),
        Number.POSITIVE_INFINITY,
      )
      await own.deps.readiness.database()
      const account = await passwordAccount(own)
      const unknown = `nobody-${unique()}@example.com`
      const ask = (email: string) =>
        own.request('POST', '/auth/password-reset', { auth: null, body: { email }, headers: from() })
      const headerNames = (res: TestResponse) =>
        [...res.headers.keys()].filter((h) => h !== 'date' && h !== 'x-request-id').sort()
      for (let i = 0; i < 3; i++) {
        const known = await workOf(own, () => ask(account.email))
        const missing = await workOf(own, () => ask(unknown))
        for (const { result } of [known, missing]) assert.equal(result.status, 202, result.text)
        assert.equal(missing.result.text, known.result.text)
        assert.deepEqual(headerNames(missing.result), headerNames(known.result))
        // The same statements (the work after the answer included), and no hash for either.
        assert.deepEqual(missing.work, known.work)
        assert.equal(known.work.hashes, 0)
      }
      await messagesTo(account.email, 'mail.password_reset', 3, own)
      assert.equal(sent().filter((m) => m.to === unknown).length, 0)
      const [tokens] = await own.sql`
      SELECT count(*)::int AS n FROM one_time_tokens t JOIN users u ON u.id = t.user_id
        WHERE lower(u.email) = ${unknown}`
      assert.equal(tokens!.n, 0)
    },
  )

  test(
    'the token is stored only as its SHA-256; the link comes from PASSWORD_RESET_URL whatever Host and ' +
      'X-Forwarded-Host say',
    async () => {
      const account = await passwordAccount(api)
      const body = JSON.stringify({ email: account.email })
      const status = await new Promise<number>((resolve, reject) => {
        const req = httpRequest(
          `${api.url}/auth/password-reset`,
          {
            method: 'POST',
            headers: {
              host: 'evil.example',
              'x-forwarded-host': 'evil.example',
              'x-forwarded-proto': 'http',
              'content-type': 'application/json',
              'content-length': Buffer.byteLength(body),
              ...from(),
            },
          },
          (res) => {
            res.resume()
            resolve(res.statusCode!)
          },
        )
        req.on('error', reject)
        req.end(body)
      })
      assert.equal(status, 202)
      const [message] = await messagesTo(account.email, 'mail.password_reset')
      assert.ok(!message!.text.includes('evil.example'))
      const token = tokenIn(message!, RESET_URL)
      const rows = await api.sql<
        Array<{ token_hash: Buffer; used_at: string | null }>
      >`SELECT token_hash, used_at FROM one_time_tokens WHERE user_id = ${account.id}`
      assert.equal(rows.length, 1)
      assert.deepEqual(rows[0]!.token_hash, createHash('sha256').update(token).digest())
      assert.equal(rows[0]!.used_at, null)
      // Nowhere else in the database: not in the events, not in a log line.
      await api.published()
      const [events] =
        await api.sql`SELECT count(*)::int AS n FROM events WHERE data::text LIKE ${'%' + token.slice(7, 30) + '%'}`
      assert.equal(events!.n, 0)
      assert.ok(!JSON.stringify(api.logs).includes(token.slice(7)))
      const [event] = await api.sql`SELECT data FROM events WHERE type = 'user.password_reset_requested'
        AND subject_id = ${account.id}`
      assert.deepEqual(event!.data, { id: account.id })
    },
  )

  test(
    'confirming: a weak password is 422 and leaves the token usable; then 204, every credential of the user ends, ' +
      'the lock is lifted, the token is spent',
    async () => {
      const account = await passwordAccount(api)
      const jwt = (await passwordLogin(api, account)).access_token
      const opaque = await passwordLogin(api, account, 'opaque')
      const key = await api.request('POST', '/api-keys', { auth: jwt, body: { name: 'k', scopes: ['users:read'] } })
      assert.equal(key.status, 201, key.text)
      // The account is locked, for known and unknown client addresses alike (src/auth/login/login-throttle.ts).
      await api.sql`
      INSERT INTO login_failures (email, address, failures, last_failure, locked_until)
      SELECT ${account.email.toLowerCase()}, a, 200, now(), now() + interval '10 minutes' FROM unnest(ARRAY['*',
        '*known']) a
      ON CONFLICT (email, address) DO UPDATE SET failures = 200, locked_until = excluded.locked_until`
      assertProblem(
        await anonymous('POST', '/auth/login', { email: account.email, password: account.password }),
        429,
        'too_many_login_attempts',
      )
      const token = await resetToken(account.email)
      assertProblem(await confirm(token, 'short'), 422, 'validation_failed')
      const fresh = `new-${unique()}`
      assert.equal((await confirm(token, fresh)).status, 204)
      for (const auth of [jwt, opaque.access_token, key.body.key as string])
        assertProblem(await api.request('GET', '/auth/me', { auth }), 401, 'invalid_token')
      assertProblem(
        await anonymous('POST', '/auth/refresh', { refresh_token: opaque.refresh_token }),
        401,
        'invalid_token',
      )
      assertProblem(
        await anonymous('POST', '/auth/login', { email: account.email, password: account.password }),
        401,
        'invalid_credentials',
      )
      assert.equal((await anonymous('POST', '/auth/login', { email: account.email, password: fresh })).status, 200)
      const [locks] = await api.sql`SELECT count(*)::int AS n FROM login_failures
        WHERE email = ${account.email.toLowerCase()} AND locked_until > now()`
      assert.equal(locks!.n, 0)
      const [row] = await api.sql`SELECT used_at IS NOT NULL AS used FROM one_time_tokens
        WHERE token_hash = ${createHash('sha256').update(token).digest()}`
      assert.equal(row!.used, true)
      assertProblem(await confirm(token, `again-${unique()}`), 400, 'invalid_one_time_token')
      await api.published()
      const [event] = await api.sql`SELECT count(*)::int AS n FROM events WHERE type = 'user.password_reset'
          AND subject_id = ${account.id}`
      assert.equal(event!.n, 1)
    },
  )

  test(
    'a new request retires the older token; an expired, forged or malformed token is 400 ' + 'invalid_one_time_token',
    async () => {
      const account = await passwordAccount(api)
      const first = await resetToken(account.email)
      const second = await resetToken(account.email, 2)
      assertProblem(await confirm(first, `pw-${unique()}`), 400, 'invalid_one_time_token')
      await api.sql`UPDATE one_time_tokens SET expires_at = now() - interval '1 second'
        WHERE token_hash = ${createHash('sha256').update(second).digest()}`
      assertProblem(await confirm(second, `pw-${unique()}`), 400, 'invalid_one_time_token')
      const forged = `upa_ot_${randomBytes(32).toString('base64url')}`
      for (const token of [forged, 'upa_ot_short', 'x'.repeat(200), second.replace('upa_ot_', 'upa_ak_')]) {
        assertProblem(await confirm(token, `pw-${unique()}`), 400, 'invalid_one_time_token')
      }
    },
  )

  test('hostile bodies are 422 and change nothing', async () => {
    const account = await passwordAccount(api)
    for (const body of [
      {},
      { email: account.email, extra: 1 },
      { email: 42 },
      { email: 'a\u0000b@example.com' },
      { email: 'a'.repeat(300) },
      [account.email],
      { email: null },
    ]) {
      assertProblem(await anonymous('POST', '/auth/password-reset', body, from()), 422, 'validation_failed')
    }
    for (const body of [
      { token: 'x' },
      { password: 'long-enough-1' },
      { token: 'x'.repeat(201), password: 'long-enough-1' },
      { token: 'a\u0000', password: 'long-enough-1' },
      { token: 'x', password: 'p'.repeat(257) },
      { token: 1, password: 'long-enough-1' },
    ]) {
      assertProblem(await anonymous('POST', '/auth/password-reset/confirm', body, from()), 422, 'validation_failed')
    }
    const [tokens] = await api.sql`SELECT count(*)::int AS n FROM one_time_tokens WHERE user_id = ${account.id}`
    assert.equal(tokens!.n, 0)
  })

  test('one account is sent 5 messages an hour at most; the 6th request is 202 all the same', async () => {
    const account = await passwordAccount(api)
    for (let i = 0; i < 6; i++) assert.equal((await askReset(account.email)).status, 202)
    await resetRequestsWorked(api, account.email, 6)
    const [tokens] = await api.sql`SELECT count(*)::int AS n FROM one_time_tokens WHERE user_id = ${account.id}`
    assert.equal(tokens!.n, 5, 'a message is queued with its token, in one statement')
    // Once the five are sent, the outbox holds nothing more for the account: no sixth will follow.
    await messagesTo(account.email, 'mail.password_reset', 5)
    assert.equal(sent().filter((m) => m.to === account.email).length, 5)
  })

  test('twelve requests at once for one account still send it 5 messages at most', async () => {
    const account = await passwordAccount(api)
    const answers = await Promise.all(Array.from({ length: 12 }, () => askReset(account.email)))
    assert.deepEqual([...new Set(answers.map((a) => a.status))], [202])
    await resetRequestsWorked(api, account.email, 12)
    const [tokens] = await api.sql`SELECT count(*)::int AS n FROM one_time_tokens WHERE user_id = ${account.id}
      AND purpose = 'password_reset'`
    assert.equal(tokens!.n, 5)
    await messagesTo(account.email, 'mail.password_reset', 5)
  })

  test(
    'the answer does not wait for the work: held up by a lock, a known and an unknown address are both answered ' +
      "202, and the known one's message follows once the lock goes",
    async () => {
      const account = await passwordAccount(api)
      const unknown = `nobody-${unique()}@example.com`
      const release = await holdResetWork(api)
      try {
        const answers = await Promise.all([askReset(account.email), askReset(unknown)])
        assert.deepEqual(
          answers.map((a) => a.status),
          [202, 202],
        )
        assert.equal(answers[0]!.text, answers[1]!.text)
        const [tokens] = await api.sql`SELECT count(*)::int AS n FROM one_time_tokens WHERE user_id = ${account.id}`
        assert.equal(tokens!.n, 0, 'answered while its work was still held up')
      } finally {
        await release()
      }
      await messagesTo(account.email, 'mail.password_reset')
      await resetRequestsWorked(api, unknown, 1)
      assert.equal(sent().filter((m) => m.to === unknown).length, 0)
    },
  )

  test(
    'with the database down, every address is answered 503 database_unavailable, not a 202 for work that would be ' +
      'lost; 202 again once it is back',
    async () => {
      const server = await startServer({ PASSWORD_RESET_URL: RESET_URL, TRUST_PROXY: '1' }, {}, { tuning })
      const account = await passwordAccount(server)
      const unknown = `nobody-${unique()}@example.com`
      const ask = (email: string) =>
        server.request('POST', '/auth/password-reset', { auth: null, body: { email }, headers: from() })
      const name = new URL(server.databaseUrl).pathname.slice(1)
      const admin = connect(process.env.TEST_SERVER_URL!, { max: 1, statementTimeoutMs: 10_000 })
      try {
        await admin`ALTER DATABASE ${admin(name)} ALLOW_CONNECTIONS false`
        await admin`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ${name}`
        // The database check's answer serves for a second (src/health/readiness.ts): /readyz shares it.
        const readyz = async () => (await server.request('GET', '/readyz', { auth: null })).status
        await waitUntil('the database check failed', async () => (await readyz()) === 503, 5000)
        const answers = [await ask(account.email), await ask(unknown)]
        for (const res of answers) {
          assertProblem(res, 503, 'database_unavailable')
          assert.ok(Number(res.headers.get('retry-after')) >= 1)
        }
        assert.equal(answers[0]!.body.detail, answers[1]!.body.detail)
      } finally {
        await admin`ALTER DATABASE ${admin(name)} ALLOW_CONNECTIONS true`
        await admin.end({ timeout: 5 })
      }
      await waitUntil(
        'served again once the database is back',
        async () => (await ask(account.email)).status === 202,
        5000,
      )
      await resetRequestsWorked(server, account.email, 1)
      const [tokens] = await server.sql<
        [{ n: number }]
      >`SELECT count(*)::int AS n FROM one_time_tokens WHERE user_id = ${account.id}`
      assert.equal(tokens.n, 1, 'only the request answered 202 made a token')
    },
  )

  test(
    'work held past its bound: further requests are 429 alike for known and unknown addresses, nothing of theirs ' +
      'is done, and the held work is',
    async () => {
      const bounded = await startServer(
        { PASSWORD_RESET_URL: RESET_URL, TRUST_PROXY: '1' },
        {},
        { tuning: { ...tuning, recoveryRequests: { concurrency: 1, capacity: 2 } } },
      )
      const [held, known] = [await passwordAccount(bounded), await passwordAccount(bounded)]
      const unknown = `nobody-${unique()}@example.com`
      const ask = (email: string) =>
        bounded.request('POST', '/auth/password-reset', { auth: null, body: { email }, headers: from() })
      const release = await holdResetWork(bounded)
      let refused: TestResponse[]
      try {
        assert.equal((await ask(held.email)).status, 202)
        assert.equal((await ask(unknown)).status, 202)
        refused = [await ask(known.email), await ask(`other-${unique()}@example.com`)]
      } finally {
        await release()
      }
      for (const res of refused) {
        assertProblem(res, 429, 'rate_limited')
        assert.equal(res.headers.get('retry-after'), '1')
      }
      assert.equal(refused[0]!.body.detail, refused[1]!.body.detail)
      await resetRequestsWorked(bounded, held.email, 1)
      await resetRequestsWorked(bounded, unknown, 1)
      const [tokens] = await bounded.sql<
        [{ n: number }]
      >`SELECT count(*)::int AS n FROM one_time_tokens WHERE user_id = ${known.id}`
      assert.equal(tokens.n, 0, 'a refused request made no token')
      assert.equal((await ask(known.email)).status, 202, 'served again once the held work is done')
      await resetRequestsWorked(bounded, known.email, 1)
    },
  )
})

test(
  'each client address may make LOGIN_RATE_LIMIT recovery requests a minute, counted apart from its ' + 'logins',
  async () => {
    const limited = await startServer(
      { PASSWORD_RESET_URL: RESET_URL, RATE_LIMIT: '1000', LOGIN_RATE_LIMIT: '2', TRUST_PROXY: '1' },
      {},
      { tuning },
    )
    const ask = (address: string) =>
      limited.request('POST', '/auth/password-reset', {
        auth: null,
        body: { email: `x-${unique()}@example.com` },
        headers: { 'x-forwarded-for': address },
      })
    assert.equal((await ask('203.0.113.1')).status, 202)
    assert.equal((await ask('203.0.113.1')).status, 202)
    const refused = await ask('203.0.113.1')
    assertProblem(refused, 429, 'rate_limited')
    assert.ok(Number(refused.headers.get('retry-after')) >= 1)
    assert.equal((await ask('203.0.113.2')).status, 202)
    // Its logins are a count of their own: still two this minute.
    const login = () =>
      limited.request('POST', '/auth/login', {
        auth: null,
        body: { email: 'a@example.com', password: 'whatever-1' },
        headers: { 'x-forwarded-for': '203.0.113.1' },
      })
    assertProblem(await login(), 401, 'invalid_credentials')
  },
)

describe('address verification', () => {
  test(
    'an admin-created user is sent a link; verifying sets email_verified_at once, and the token is ' + 'spent',
    async () => {
      const email = `new-${unique()}@example.com`
      const created = await api.request('POST', '/users', { body: { name: 'New', email, password: `pw-${unique()}` } })
      assert.equal(created.status, 201, created.text)
      assert.equal(created.body.email_verified_at, null)
      const token = tokenIn((await messagesTo(email, 'mail.verify_email'))[0]!, VERIFY_URL)
      assert.equal((await anonymous('POST', '/auth/verify-email', { token }, from())).status, 204)
      const user = await api.request('GET', `/users/${created.body.id}`)
      assert.match(user.body.email_verified_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/)
      assertProblem(await anonymous('POST', '/auth/verify-email', { token }, from()), 400, 'invalid_one_time_token')
      await api.published()
      const [event] =
        await api.sql`SELECT data FROM events WHERE type = 'user.email_verified' AND subject_id = ${created.body.id}`
      assert.deepEqual(event!.data, { id: created.body.id })
      const self = await api.createUser({ email: `v-${unique()}@example.com` })
      await api.sql`UPDATE users SET email_verified_at = now() WHERE id = ${self.id}`
      assertProblem(
        await api.request('POST', '/auth/verify-email/resend', { auth: self.token }),
        409,
        'email_already_verified',
      )
    },
  )

  test('the resend: 204 up to 5 links an hour, then 429; each new link retires the older ones', async () => {
    const self = await api.createUser({ email: `r-${unique()}@example.com` })
    for (let i = 0; i < 5; i++)
      assert.equal((await api.request('POST', '/auth/verify-email/resend', { auth: self.token })).status, 204)
    assertProblem(await api.request('POST', '/auth/verify-email/resend', { auth: self.token }), 429, 'rate_limited')
    const tokens = (await messagesTo(self.email, 'mail.verify_email', 5)).map((m) => tokenIn(m, VERIFY_URL))
    const open = await api.sql<
      Array<{ token_hash: Buffer }>
    >`SELECT token_hash FROM one_time_tokens WHERE user_id = ${self.id} AND used_at IS NULL`
    assert.equal(open.length, 1)
    const live = tokens.filter((t) => createHash('sha256').update(t).digest().equals(open[0]!.token_hash))
    assert.equal(live.length, 1)
    for (const token of tokens.filter((t) => t !== live[0]))
      assertProblem(await anonymous('POST', '/auth/verify-email', { token }, from()), 400, 'invalid_one_time_token')
    assert.equal((await anonymous('POST', '/auth/verify-email', { token: live[0]! }, from())).status, 204)
  })

  test(
    'an address change: the new address gets a link, the old one word of the change; a link for the old address ' +
      'no longer verifies',
    async () => {
      const account = await passwordAccount(api)
      const jwt = (await passwordLogin(api, account)).access_token
      assert.equal((await api.request('POST', '/auth/verify-email/resend', { auth: jwt })).status, 204)
      const oldToken = tokenIn((await messagesTo(account.email, 'mail.verify_email'))[0]!, VERIFY_URL)
      const next = `moved-${unique()}@example.com`
      const changed = await api.request('PATCH', `/users/${account.id}`, {
        auth: jwt,
        body: { email: next, current_password: account.password },
      })
      assert.equal(changed.status, 200, changed.text)
      const [notice] = await messagesTo(account.email, 'mail.email_changed')
      assert.ok(!notice!.text.includes(next), 'the old address is not told the new one')
      const newToken = tokenIn((await messagesTo(next, 'mail.verify_email'))[0]!, VERIFY_URL)
      assertProblem(
        await anonymous('POST', '/auth/verify-email', { token: oldToken }, from()),
        400,
        'invalid_one_time_token',
      )
      assert.equal((await anonymous('POST', '/auth/verify-email', { token: newToken }, from())).status, 204)
      // Verified, then changed again: no longer verified (the trigger of sql/012).
      await api.sql`UPDATE users SET email = ${`again-${unique()}@example.com`} WHERE id = ${account.id}`
      const [row] = await api.sql`SELECT email_verified_at FROM users WHERE id = ${account.id}`
      assert.equal(row!.email_verified_at, null)
    },
  )

  test(
    'changing the address again and again sends 5 links an hour at most, and word of the change to unverified old ' +
      'addresses no more; a verified old address always hears of it',
    async () => {
      const user = await api.createUser({ email: `hops-${unique()}@example.com` })
      const addresses = Array.from({ length: 7 }, (_, i) => `hop-${i}-${unique()}@example.com`)
      for (const email of addresses)
        assert.equal((await api.request('PATCH', `/users/${user.id}`, { body: { email } })).status, 200)
      const [tokens] = await api.sql`SELECT count(*)::int AS n FROM one_time_tokens WHERE user_id = ${user.id}
        AND purpose = 'verify_email'`
      assert.equal(tokens!.n, 5)
      for (const email of addresses.slice(0, 5)) await messagesTo(email, 'mail.verify_email')
      await messagesTo(user.email, 'mail.email_changed')
      for (const email of addresses.slice(0, 4)) await messagesTo(email, 'mail.email_changed')
      // The owner proves the last address; changing it once more, over the limit, still tells that address.
      await api.sql`UPDATE users SET email_verified_at = now() WHERE id = ${user.id}`
      assert.equal(
        (await api.request('PATCH', `/users/${user.id}`, { body: { email: `hop-last-${unique()}@example.com` } }))
          .status,
        200,
      )
      await messagesTo(addresses[6]!, 'mail.email_changed')
      // Everything the changes queued has been sent (each change's messages are queued in its transaction).
      const outbox = () => api.sql`SELECT 1 FROM mail_outbox WHERE user_id = ${user.id}`
      await waitUntil('the outbox empty', async () => (await outbox()).length === 0, 5000)
      assert.equal(
        sent().filter((m) => addresses.slice(4, 6).includes(m.to) && m.type === 'mail.email_changed').length,
        0,
        'past the limit, unverified old addresses are not told',
      )
      assert.equal(sent().filter((m) => addresses.slice(5).includes(m.to) && m.type === 'mail.verify_email').length, 0)
    },
  )

  test(
    'a verification and an address change of one user at the same moment: one waits for the other, never a ' +
      'deadlock (503)',
    async () => {
      const round = async () => {
        const user = await api.createUser({ email: `race-${unique()}@example.com` })
        const token = `upa_ot_${randomBytes(32).toString('base64url')}`
        await api.sql`
        INSERT INTO one_time_tokens (purpose, user_id, token_hash, email, expires_at)
        VALUES ('verify_email', ${user.id}, ${createHash('sha256').update(token).digest()}, ${user.email},
        now() + interval '1 hour')`
        const [verified, changed] = await Promise.all([
          anonymous('POST', '/auth/verify-email', { token }, from()),
          api.request('PATCH', `/users/${user.id}`, { body: { email: `race-moved-${unique()}@example.com` } }),
        ])
        assert.ok([204, 400].includes(verified.status), verified.text)
        assert.equal(changed.status, 200, changed.text)
      }
      // Forty rounds, each of its own user; four at a time.
      for (let batch = 0; batch < 10; batch++) await Promise.all(Array.from({ length: 4 }, round))
    },
  )

  test(
    'REQUIRE_VERIFIED_EMAIL=true: a right password before verification is 403 email_not_verified and sends a ' +
      'link; a wrong one stays 401',
    async () => {
      const strict = await startServer(
        { PASSWORD_RESET_URL: RESET_URL, VERIFY_EMAIL_URL: VERIFY_URL, REQUIRE_VERIFIED_EMAIL: 'true' },
        {},
        { tuning },
      )
      const account = await passwordAccount(strict)
      assertProblem(
        await strict.request('POST', '/auth/login', {
          auth: null,
          body: { email: account.email, password: 'wrong-password' },
        }),
        401,
        'invalid_credentials',
      )
      assertProblem(
        await strict.request('POST', '/auth/login', {
          auth: null,
          body: { email: account.email, password: account.password },
        }),
        403,
        'email_not_verified',
      )
      const token = tokenIn((await messagesTo(account.email, 'mail.verify_email'))[0]!, VERIFY_URL)
      assert.equal((await strict.request('POST', '/auth/verify-email', { auth: null, body: { token } })).status, 204)
      assert.equal(
        (
          await strict.request('POST', '/auth/login', {
            auth: null,
            body: { email: account.email, password: account.password },
          })
        ).status,
        200,
      )
    },
  )
})

test(
  '/openapi.json documents the recovery endpoints: anonymous but the resend, their answers and ' + 'problems',
  async () => {
    const doc = (await api.request('GET', '/openapi.json', { auth: null })).body
    const op = (path: string) => doc.paths[path].post
    for (const status of ['202', '404', '422', '429', '503'])
      assert.ok(status in op('/auth/password-reset').responses, status)
    for (const path of ['/auth/password-reset', '/auth/password-reset/confirm', '/auth/verify-email'])
      assert.deepEqual(op(path).security, [], path)
    assert.notDeepEqual(op('/auth/verify-email/resend').security, [])
    assert.ok(
      '400' in op('/auth/password-reset/confirm').responses && '422' in op('/auth/password-reset/confirm').responses,
    )
    assert.ok('409' in op('/auth/verify-email/resend').responses)
    assert.equal(
      op('/auth/password-reset/confirm').requestBody.content['application/json'].schema.properties.password.minLength,
      8,
    )
  },
)

describe('recovery off, mail not configured', () => {
  test(
    'without the link templates the endpoints are 404; in production without a transport, 503 mail_not_configured ' +
      'and a warning at start',
    async () => {
      const off = await startServer()
      assertProblem(
        await off.request('POST', '/auth/password-reset', { auth: null, body: { email: 'a@example.com' } }),
        404,
        'not_found',
      )
      assertProblem(
        await off.request('POST', '/auth/verify-email', { auth: null, body: { token: 'x' } }),
        404,
        'not_found',
      )
      const production = await startServer({
        NODE_ENV: 'production',
        DATABASE_URL: 'postgres://replaced@localhost/x',
        PASSWORD_RESET_URL: RESET_URL,
        VERIFY_EMAIL_URL: VERIFY_URL,
      })
      assertProblem(
        await production.request('POST', '/auth/password-reset', { auth: null, body: { email: 'a@example.com' } }),
        503,
        'mail_not_configured',
      )
      assert.ok(
        production.logs.some((l) => l.level === 'warn' && String(l.msg).includes('mail_not_configured')),
        'start-up says mail is not configured',
      )
      // A user made meanwhile gets no link that nothing would send: no live token waits in the outbox.
      const made = await production.request('POST', '/users', {
        body: { name: 'Unsent', email: `unsent-${process.pid}@example.com` },
      })
      assert.equal(made.status, 201, made.text)
      assert.equal(
        (await production.sql`SELECT count(*)::int AS n FROM mail_outbox WHERE user_id = ${made.body.id}`)[0]!.n,
        0,
      )
      assert.equal(
        (await production.sql`SELECT count(*)::int AS n FROM one_time_tokens WHERE user_id = ${made.body.id}`)[0]!.n,
        0,
      )
    },
  )
})

/**
 * A transport that fails `failures` times (transiently or for good), then takes every message: the worker's retry logic
 * at the unit boundary.
 */
function flakyTransport(failures: number, permanent: boolean) {
  const taken: string[] = []
  let left = failures
  return {
    taken,
    transport: {
      name: 'hook' as const,
      async send(message: { id: string }) {
        if (left-- > 0) {
          const { MailSendError } = await import('../src/mail/message.js')
          throw new MailSendError(permanent ? 'refused: 550 no such user' : 'receiver answered 503', permanent)
        }
        taken.push(message.id)
      },
    },
  }
}

/** The value `check` gives once it gives one. */
async function until<T>(what: string, check: () => Promise<T | undefined>): Promise<T> {
  let value: T | undefined
  await waitUntil(what, async () => (value = await check()) !== undefined, 5000)
  return value!
}

const metric = async (server: TestServer, name: string) =>
  Number(new RegExp(`^${name} (\\d+)$`, 'm').exec((await server.request('GET', '/metrics')).text)?.[1])

describe('the mail worker', () => {
  test('a transient failure is retried with back-off until it is sent; the row goes once sent', async () => {
    const flaky = flakyTransport(2, false)
    const server = await startServer(
      { PASSWORD_RESET_URL: RESET_URL },
      {},
      { tuning: { mail: { transport: flaky.transport, pollMs: 50, retryDelaysMs: [100, 100, 100], retryJitter: 0 } } },
    )
    const account = await passwordAccount(server)
    assert.equal(
      (await server.request('POST', '/auth/password-reset', { auth: null, body: { email: account.email } })).status,
      202,
    )
    const [row] = await until('a failed attempt recorded', async () => {
      const rows = await server.sql<
        Array<{ id: string; attempts: number; last_error: string | null }>
      >`SELECT id::text, attempts, last_error FROM mail_outbox`
      return rows[0]?.last_error ? rows : undefined
    })
    assert.equal(row!.last_error, 'receiver answered 503')
    await until('sent', async () => (flaky.taken.length ? true : undefined))
    assert.deepEqual(flaky.taken, [row!.id])
    await until('the row gone', async () =>
      (await server.sql`SELECT 1 FROM mail_outbox`).length === 0 ? true : undefined,
    )
    assert.equal(await metric(server, 'mail_retried_total'), 2)
    assert.equal(await metric(server, 'mail_sent_total'), 1)
  })

  test(
    'a permanent failure gives up at once: the row stays without its text and link, and mail_failed_total counts ' +
      'it',
    async () => {
      const flaky = flakyTransport(1, true)
      const server = await startServer(
        { PASSWORD_RESET_URL: RESET_URL },
        {},
        { tuning: { mail: { transport: flaky.transport, pollMs: 50, retryDelaysMs: [100], retryJitter: 0 } } },
      )
      const account = await passwordAccount(server)
      assert.equal(
        (await server.request('POST', '/auth/password-reset', { auth: null, body: { email: account.email } })).status,
        202,
      )
      const row = await until('given up', async () => {
        const [r] = await server.sql<
          Array<{ body: string; link: string | null; last_error: string; attempts: number }>
        >`SELECT body, link, last_error, attempts FROM mail_outbox WHERE failed_at IS NOT NULL`
        return r
      })
      assert.deepEqual({ ...row }, { body: '', link: null, last_error: 'refused: 550 no such user', attempts: 1 })
      assert.equal(flaky.taken.length, 0)
      assert.equal(await metric(server, 'mail_failed_total'), 1)
    },
  )
})

/** Whether a connection to `port` is refused: nothing listens there. */
const refused = (port: number) =>
  new Promise<boolean>((resolve) => {
    const socket = netConnect(port, '127.0.0.1')
    socket.once('connect', () => {
      socket.destroy()
      resolve(false)
    })
    socket.once('error', () => resolve(true))
  })

describe('the real entry point (dist/main.js), one process for both tests: the second stops it', () => {
  test(
    'the console transport of development prints the message on standard error, never in its log; the printed ' +
      'link resets the password',
    async () => {
      const service = await entryPoint.listening
      const account = { email: `dev-${unique()}@example.com`, password: `pw-${unique()}` }
      const { testPasswords } = await import('./helpers/passwords.js')
      const hash = await testPasswords.hash(account.password)
      await entryDb`
      INSERT INTO users (name, email, role, password_hash) VALUES ('Dev', ${account.email}, 'user', ${hash})`
      const asked = await call(service.url, 'POST', '/auth/password-reset', { body: { email: account.email } })
      assert.equal(asked.status, 202)
      await waitUntil('the message on standard error', () => service.stderr().includes(`To: ${account.email}`), 5000)
      const token = /upa_ot_[A-Za-z0-9_-]{43}/.exec(service.stderr())![0]
      assert.ok(service.stderr().includes(RESET_URL.replace('{token}', token)))
      assert.ok(!JSON.stringify(service.logs).includes(token.slice(7)), 'the token is not in the log')
      const body = { token, password: `dev-${unique()}` }
      const confirmed = await call(service.url, 'POST', '/auth/password-reset/confirm', { body })
      assert.equal(confirmed.status, 204)
    },
  )

  test(
    'SIGTERM waits for the reset requests already answered: their work is done before the process exits ' + '0',
    async () => {
      const service = await entryPoint.listening
      // Three: two at work (held up by the lock) and one still waiting its turn when the signal comes.
      const emails = [1, 2, 3].map((i) => `held-${i}-${unique()}@example.com`)
      for (const email of emails) await entryDb`INSERT INTO users (name, email, role) VALUES ('Held', ${email}, 'user')`
      const held = await entryDb.reserve()
      try {
        await held`BEGIN`
        await held`LOCK TABLE password_reset_requests IN ACCESS EXCLUSIVE MODE`
        for (const email of emails) {
          assert.equal((await call(service.url, 'POST', '/auth/password-reset', { body: { email } })).status, 202)
        }
        service.kill('SIGTERM')
        // Its port is closed as the stop begins, before the stop waits for the held work (the order of src/service.ts).
        await waitUntil('the port closed', () => refused(service.port), 10_000)
        assert.ok(service.alive(), 'still at work on the requests it answered')
      } finally {
        await held`COMMIT`
        held.release()
      }
      assert.equal((await service.exited).code, 0)
      const [tokens] = await entryDb<[{ n: number }]>`
      SELECT count(*)::int AS n FROM one_time_tokens t JOIN users u ON u.id = t.user_id WHERE u.email = ANY(${emails})`
      assert.equal(tokens.n, 3)
      const trouble = ['background work dropped at shutdown', 'background work failed']
      assert.ok(!service.logs.some((l) => trouble.includes(String(l.msg))))
    },
  )
})
