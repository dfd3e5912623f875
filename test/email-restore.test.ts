import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { describe, test } from 'node:test'
import { passwordAccount, passwordLogin, type Account } from './helpers/accounts.js'
import { assertInvalidToken, refusedEverywhere } from './helpers/refused.js'
import { startServer, type TestResponse, type TestServer } from './helpers/server.js'
import { propagationBound } from './helpers/time-bounds.js'
import { enrolledUser, rfcTotp } from './helpers/totp.js'
import { captureMail, tokenIn } from './helpers/captured-mail.js'

// Putting back an address an e-mail change replaced (docs/auth.md, "Changing
// the address"): the notice to the old address carries a single-use link, and
// the link takes the account back from whoever moved it, on every instance.
// Two instances, A and B, on one database; mail goes through the real console
// transport of both, its output kept here, so that a test follows the link a
// person would.

const VERIFY_URL = 'https://app.example.com/verify/{token}'
const RESTORE_URL = 'https://app.example.com/restore-email?token={token}'
const RESET_URL = 'https://app.example.com/reset?token={token}'
const env = { VERIFY_EMAIL_URL: VERIFY_URL, EMAIL_RESTORE_URL: RESTORE_URL, PASSWORD_RESET_URL: RESET_URL }

const mail = captureMail()
const { tuning } = mail

const A = await startServer(env, {}, { tuning })
const B = await startServer(env, {}, { databaseUrl: A.databaseUrl, tuning })
const both = [A, B]
const { sql } = A

const unique = () => `${process.pid}-${randomBytes(4).toString('hex')}`
const sha256 = (token: string) => createHash('sha256').update(token).digest()

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.equal(res.body?.code, code, res.text)
}

/** The messages to `to` of `type`, once they have been sent (their outbox rows gone). */
const messagesTo = (to: string, type: string, count = 1) => mail.messagesTo(sql, to, type, count)

const restore = (token: string, on: TestServer = A) =>
  on.request('POST', '/auth/email-restore', { auth: null, body: { token } })
const me = (server: TestServer, auth: string) => server.request('GET', '/auth/me', { auth })
const withKey = (server: TestServer, key: string) =>
  server.request('GET', '/auth/me', { headers: { 'x-api-key': key } })

/** The account's address moved to `to` by a holder of its password and a session (`auth`): 200. */
async function move(who: Account, auth: string, to: string, server: TestServer = A): Promise<void> {
  const res = await server.request('PATCH', `/users/${who.id}`, {
    auth,
    body: { email: to, current_password: who.password },
  })
  assert.equal(res.status, 200, res.text)
}

/** The token of the `count`th notice sent to `from`, the address an e-mail change replaced. */
async function restoreToken(from: string, count = 1): Promise<string> {
  const notices = await messagesTo(from, 'mail.email_changed', count)
  return tokenIn(notices[count - 1]!, RESTORE_URL)
}

/** An account with a password whose address its owner verified. */
async function ownerAccount(server: TestServer = A): Promise<Account> {
  const who = await passwordAccount(server)
  await sql`UPDATE users SET email_verified_at = now() WHERE id = ${who.id}`
  return who
}

/** The verification link sent to `address` followed, as its holder would. */
async function verifyAddress(address: string): Promise<void> {
  const token = tokenIn((await messagesTo(address, 'mail.verify_email')).at(-1)!, VERIFY_URL)
  assert.equal((await A.request('POST', '/auth/verify-email', { auth: null, body: { token } })).status, 204)
}

/** An account whose address a thief moved to `to` with its password and a login: the owner's restore token. */
async function takenOver(to = `thief-${unique()}@example.com`): Promise<{ who: Account; jwt: string; token: string }> {
  const who = await ownerAccount()
  const jwt = (await passwordLogin(A, who)).access_token
  await move(who, jwt, to)
  return { who, jwt, token: await restoreToken(who.email) }
}

const userRow = async (id: number) =>
  (
    await sql<Array<{ email: string; verified: boolean; version: number }>>`
      SELECT email, email_verified_at IS NOT NULL AS verified, version FROM users WHERE id = ${id}`
  )[0]

describe('the notice to the old address', () => {
  test(
    'carries a link from EMAIL_RESTORE_URL, valid 7 days, its token stored only as its SHA-256; it no longer says ' +
      'to reset the password; the message went through the outbox, never into a log or an event',
    async () => {
      const next = `next-${unique()}@example.com`
      const { who, token } = await takenOver(next)
      const [notice] = await messagesTo(who.email, 'mail.email_changed')
      assert.ok(notice!.text.includes(RESTORE_URL.replace('{token}', token)))
      assert.ok(!/reset your password/i.test(notice!.text), notice!.text)
      assert.match(notice!.text, /within 7 days/)
      // What to do once the address is back: its reset link comes to it.
      assert.match(notice!.text, /Then ask for a password reset/)
      assert.ok(!notice!.text.includes(next), 'the old address is not told the new one')
      const rows = await sql<Array<{ token_hash: Buffer; email: string; week: boolean; used: boolean }>>`
        SELECT token_hash, email, expires_at - created_at = interval '7 days' AS week, used_at IS NOT NULL AS used
        FROM one_time_tokens WHERE user_id = ${who.id} AND purpose = 'email_restore'`
      assert.equal(rows.length, 1)
      assert.deepEqual(rows[0]!.token_hash, sha256(token))
      assert.equal(rows[0]!.email, who.email)
      assert.equal(rows[0]!.week, true)
      assert.equal(rows[0]!.used, false)
      // The new address is sent its verification link, as before.
      assert.equal((await messagesTo(next, 'mail.verify_email')).length, 1)
      assert.equal((await restore(token)).status, 204)
      await A.published()
      const secret = token.slice('upa_ot_'.length)
      const [inEvents] = await sql`SELECT count(*)::int AS n FROM events WHERE data::text LIKE ${`%${secret}%`}`
      assert.equal(inEvents!.n, 0)
      for (const server of both) assert.ok(!JSON.stringify(server.logs).includes(secret), 'the token is in a log')
    },
  )

  test(
    'without EMAIL_RESTORE_URL it has no link and says to tell the administrators; ' + 'the endpoint is 404',
    async () => {
      const off = await startServer({ VERIFY_EMAIL_URL: VERIFY_URL }, {}, { databaseUrl: A.databaseUrl, tuning })
      const who = await passwordAccount(off)
      const jwt = (await passwordLogin(off, who)).access_token
      await move(who, jwt, `elsewhere-${unique()}@example.com`, off)
      const [notice] = await messagesTo(who.email, 'mail.email_changed')
      assert.ok(!notice!.text.includes('upa_ot_'), notice!.text)
      assert.match(notice!.text, /administrators/)
      assert.ok(!/reset your password/i.test(notice!.text), notice!.text)
      const [tokens] = await sql`
        SELECT count(*)::int AS n FROM one_time_tokens WHERE user_id = ${who.id} AND purpose = 'email_restore'`
      assert.equal(tokens!.n, 0)
      const forged = `upa_ot_${randomBytes(32).toString('base64url')}`
      assertProblem(await restore(forged, off), 404, 'not_found')
    },
  )

  test(
    'an old address that was never verified is told of the change without a link: it never proved to be the ' +
      "owner's (a typo, a stranger's mailbox), and the link would hand it the account",
    async () => {
      const who = await passwordAccount(A)
      const jwt = (await passwordLogin(A, who)).access_token
      await move(who, jwt, `corrected-${unique()}@example.com`)
      const [notice] = await messagesTo(who.email, 'mail.email_changed')
      assert.ok(!notice!.text.includes('upa_ot_'), notice!.text)
      assert.match(notice!.text, /administrators/)
      const [tokens] = await sql`
        SELECT count(*)::int AS n FROM one_time_tokens WHERE user_id = ${who.id} AND purpose = 'email_restore'`
      assert.equal(tokens!.n, 0)
    },
  )

  test('with password reset off, the notice does not send the owner to it', async () => {
    const noReset = await startServer(
      { VERIFY_EMAIL_URL: VERIFY_URL, EMAIL_RESTORE_URL: RESTORE_URL },
      {},
      { databaseUrl: A.databaseUrl, tuning },
    )
    const who = await ownerAccount(noReset)
    const jwt = (await passwordLogin(noReset, who)).access_token
    await move(who, jwt, `elsewhere-${unique()}@example.com`, noReset)
    const [notice] = await messagesTo(who.email, 'mail.email_changed')
    assert.ok(notice!.text.includes(RESTORE_URL.replace('{token}', tokenIn(notice!, RESTORE_URL))))
    assert.ok(!/password reset/i.test(notice!.text), notice!.text)
    assert.match(notice!.text, /Then choose a new password/)
  })

  test('in production without a way to send mail, no restore token is made: nothing would send its link', async () => {
    // A database of its own: A's and B's workers would send what it queues.
    const production = await startServer({
      NODE_ENV: 'production',
      DATABASE_URL: 'postgres://replaced@localhost/x',
      ...env,
    })
    const user = await production.createUser({ email: `unsent-${unique()}@example.com` })
    const res = await production.request('PATCH', `/users/${user.id}`, {
      body: { email: `unsent-moved-${unique()}@example.com` },
    })
    assert.equal(res.status, 200, res.text)
    const rows = await production.sql<Array<{ link: string | null }>>`
      SELECT link FROM mail_outbox WHERE user_id = ${user.id} AND type = 'mail.email_changed'`
    assert.deepEqual(
      rows.map((r) => r.link),
      [null],
    )
    const [tokens] = await production.sql`SELECT count(*)::int AS n FROM one_time_tokens WHERE user_id = ${user.id}`
    assert.equal(tokens!.n, 0)
  })
})

describe('POST /auth/email-restore', () => {
  test(
    'puts the old address back, verified, with a new version; every session, JWT and API key of the account ends ' +
      'on both instances; the password stays; user.email_restored is recorded; the link works once',
    async (t) => {
      const who = await passwordAccount(A)
      const jwt = (await passwordLogin(A, who)).access_token
      const opaque = await passwordLogin(B, who, 'opaque')
      const key = await A.request('POST', '/api-keys', { auth: jwt, body: { name: 'k', scopes: ['users:read'] } })
      assert.equal(key.status, 201, key.text)
      const apiKey = key.body.key as string
      // A JWT of the account that names no session (as the identity provider's do not): only the account's credential
      // epoch ends it.
      const detached = A.jwtFor(who.id, 'user')
      for (const server of both) {
        assert.equal((await me(server, jwt)).status, 200)
        assert.equal((await me(server, detached)).status, 200)
        assert.equal((await me(server, opaque.access_token)).status, 200)
        assert.equal((await withKey(server, apiKey)).status, 200)
      }
      await A.sql`UPDATE users SET email_verified_at = now() WHERE id = ${who.id}`
      const thief = `thief-${unique()}@example.com`
      await move(who, jwt, thief)
      const token = await restoreToken(who.email)
      const before = await userRow(who.id)
      assert.deepEqual({ email: before!.email, verified: before!.verified }, { email: thief, verified: false })
      const within = await propagationBound(both)

      assert.equal((await restore(token)).status, 204)
      // On A from the answer on; on B within the bound of any revocation.
      assertInvalidToken(await me(A, jwt))
      assertInvalidToken(await me(A, detached))
      assertInvalidToken(await me(A, opaque.access_token))
      assertInvalidToken(await withKey(A, apiKey))
      const took = Math.max(
        await refusedEverywhere(both, (server) => me(server, jwt), within),
        await refusedEverywhere(both, (server) => me(server, detached), within),
        await refusedEverywhere(both, (server) => me(server, opaque.access_token), within),
        await refusedEverywhere(both, (server) => withKey(server, apiKey), within),
      )
      t.diagnostic(`refused on A and B within ${took.toFixed(1)} ms (bound ${within} ms)`)
      for (const server of both) {
        assertInvalidToken(
          await server.request('POST', '/auth/refresh', { auth: null, body: { refresh_token: opaque.refresh_token } }),
        )
      }
      const after = await userRow(who.id)
      assert.equal(after!.email, who.email)
      assert.equal(after!.verified, true, 'the link reached the address: it is verified')
      assert.ok(after!.version > before!.version)
      const [live] = await sql`
        SELECT (SELECT count(*)::int FROM sessions WHERE user_id = ${who.id} AND revoked_at IS NULL) AS sessions,
          (SELECT count(*)::int FROM api_keys WHERE user_id = ${who.id}) AS keys`
      assert.deepEqual({ ...live }, { sessions: 0, keys: 0 })
      // The password is the one it was: the owner logs in with the address back, and is then told to reset it.
      assert.ok((await passwordLogin(B, who)).access_token)

      await A.published()
      const [event] = await sql<Array<{ data: unknown; actor_id: string }>>`
        SELECT data, actor_id FROM events WHERE type = 'user.email_restored' AND subject_id = ${who.id}`
      assert.deepEqual(event!.data, { id: who.id, email: who.email })
      assert.equal(Number(event!.actor_id), who.id)
      const [revoked] = await sql`
        SELECT count(*)::int AS n FROM events WHERE type = 'api_key.revoked' AND subject_id = ${key.body.id}`
      assert.equal(revoked!.n, 1)

      for (const server of both) assertProblem(await restore(token, server), 400, 'invalid_one_time_token')
      assert.equal((await userRow(who.id))!.version, after!.version, 'the second use changed nothing')
    },
  )

  test(
    "the thief's links stop: the reset link sent to the thief's address and its verification link are 400 after " +
      'the restore',
    async () => {
      const thief = `thief-${unique()}@example.com`
      const { who, token } = await takenOver(thief)
      const verify = tokenIn((await messagesTo(thief, 'mail.verify_email'))[0]!, VERIFY_URL)
      const asked = await A.request('POST', '/auth/password-reset', { auth: null, body: { email: thief } })
      assert.equal(asked.status, 202)
      const reset = tokenIn((await messagesTo(thief, 'mail.password_reset'))[0]!, RESET_URL)
      assert.equal((await restore(token)).status, 204)
      assertProblem(
        await A.request('POST', '/auth/password-reset/confirm', {
          auth: null,
          body: { token: reset, password: `mine-now-${unique()}` },
        }),
        400,
        'invalid_one_time_token',
      )
      assertProblem(
        await A.request('POST', '/auth/verify-email', { auth: null, body: { token: verify } }),
        400,
        'invalid_one_time_token',
      )
      assert.equal((await userRow(who.id))!.email, who.email)
      // The owner's own reset now reaches the owner.
      assert.equal(
        (await A.request('POST', '/auth/password-reset', { auth: null, body: { email: who.email } })).status,
        202,
      )
      await messagesTo(who.email, 'mail.password_reset')
    },
  )

  test(
    'later changes: each sends the (verified) address it replaced a link; a later link used first leaves the ' +
      'first one working, and the first retires the links of the changes after it',
    async () => {
      const who = await ownerAccount()
      const jwt = (await passwordLogin(A, who)).access_token
      const [b, c, d] = ['b', 'c', 'd'].map((n) => `hop-${n}-${unique()}@example.com`)
      // The thief proves each address of his before moving on, so that each is sent a link too.
      await move(who, jwt, b)
      await verifyAddress(b)
      await move(who, jwt, c)
      await verifyAddress(c)
      await move(who, jwt, d)
      const [first, second, third] = [await restoreToken(who.email), await restoreToken(b), await restoreToken(c)]
      // The thief uses the link sent to an address of his (b): b is back, the link of the change after it goes.
      assert.equal((await restore(second)).status, 204)
      assert.equal((await userRow(who.id))!.email, b)
      assertProblem(await restore(third), 400, 'invalid_one_time_token')
      // The owner's link, sent before, still works, and takes the account back.
      assert.equal((await restore(first)).status, 204)
      assert.equal((await userRow(who.id))!.email, who.email)
      for (const token of [first, second, third]) assertProblem(await restore(token), 400, 'invalid_one_time_token')
      const [open] = await sql`
        SELECT count(*)::int AS n FROM one_time_tokens WHERE user_id = ${who.id} AND used_at IS NULL`
      assert.equal(open!.n, 0)
    },
  )

  test(
    'lives 7 days: a link 7 days less a minute old works; ' + 'one 7 days and a second old is 400 and changes nothing',
    async () => {
      const young = await takenOver()
      const old = await takenOver()
      const age = (token: string, interval: string) => sql`
      UPDATE one_time_tokens SET created_at = created_at - ${interval}::interval,
        expires_at = expires_at - ${interval}::interval
      WHERE token_hash = ${sha256(token)}`
      await age(young.token, '6 days 23 hours 59 minutes')
      await age(old.token, '7 days 1 second')
      assert.equal((await restore(young.token)).status, 204)
      assert.equal((await userRow(young.who.id))!.email, young.who.email)
      const before = await userRow(old.who.id)
      assertProblem(await restore(old.token), 400, 'invalid_one_time_token')
      assert.deepEqual(await userRow(old.who.id), before)
      assert.equal((await me(A, old.jwt)).status, 200, 'its credentials go on')
    },
  )

  test(
    'the old address taken meanwhile by another account: 409 restore_address_taken and nothing changes; ' +
      'the link works once the address is free again',
    async () => {
      const { who, jwt, token } = await takenOver()
      const squatter = await A.request('POST', '/users', { body: { name: 'Squatter', email: who.email } })
      assert.equal(squatter.status, 201, squatter.text)
      const before = await userRow(who.id)
      for (const server of both) assertProblem(await restore(token, server), 409, 'restore_address_taken')
      assert.deepEqual(await userRow(who.id), before)
      assert.equal((await me(A, jwt)).status, 200, 'no credential ended')
      const [row] = await sql`SELECT used_at FROM one_time_tokens WHERE token_hash = ${sha256(token)}`
      assert.equal(row!.used_at, null)
      await A.published()
      const [events] = await sql`
        SELECT count(*)::int AS n FROM events WHERE type = 'user.email_restored' AND subject_id = ${who.id}`
      assert.equal(events!.n, 0)
      assert.equal((await A.request('DELETE', `/users/${squatter.body.id}`)).status, 204)
      assert.equal((await restore(token)).status, 204)
      assert.equal((await userRow(who.id))!.email, who.email)
      assertInvalidToken(await me(A, jwt))
    },
  )

  test("a factor the thief set up after the move goes with the restore; the owner's earlier one stays", async () => {
    const { who, jwt, token } = await takenOver()
    // The thief turns a factor on with the stolen session: left on, it would lock the owner out after the restore.
    const started = await A.request('POST', '/auth/mfa/totp', { auth: jwt })
    assert.equal(started.status, 201, started.text)
    const confirmed = await A.request('POST', '/auth/mfa/totp/confirm', {
      auth: jwt,
      body: { code: rfcTotp(started.body.secret, A.clock.now()) },
    })
    assert.equal(confirmed.status, 200, confirmed.text)
    assert.equal((await restore(token)).status, 204)
    const login = await A.request('POST', '/auth/login', {
      auth: null,
      body: { email: who.email, password: who.password },
    })
    assert.equal(login.status, 200, `the owner logs in with the password alone: ${login.text}`)
    const [{ rows }] = await sql<[{ rows: number }]>`
      SELECT (SELECT count(*) FROM totp_factors WHERE user_id = ${who.id})::int
        + (SELECT count(*) FROM recovery_codes WHERE user_id = ${who.id})::int AS rows`
    assert.equal(rows, 0)
    await A.published()
    const [event] = await sql`SELECT 1 FROM events WHERE type = 'user.mfa_disabled' AND subject_id = ${who.id}`
    assert.ok(event, 'user.mfa_disabled recorded')

    // The owner's own factor, from before a change, is the owner's: a restore leaves it.
    const owner = await enrolledUser(A, both)
    await sql`UPDATE users SET email_verified_at = now() WHERE id = ${owner.id}`
    const session = await A.request('POST', '/auth/login', {
      auth: null,
      body: { email: owner.email, password: owner.password, code: rfcTotp(owner.secret, A.clock.now()) },
    })
    await move(owner, session.body.access_token, `thief-${unique()}@example.com`)
    assert.equal((await restore(await restoreToken(owner.email))).status, 204)
    const [{ kept }] = await sql<[{ kept: number }]>`
      SELECT count(*)::int AS kept FROM totp_factors WHERE user_id = ${owner.id} AND confirmed_at IS NOT NULL`
    assert.equal(kept, 1)
  })

  test('the user deleted: its link is 400 invalid_one_time_token, as an unknown one', async () => {
    const { who, token } = await takenOver()
    assert.equal((await A.request('DELETE', `/users/${who.id}`)).status, 204)
    assertProblem(await restore(token), 400, 'invalid_one_time_token')
    assert.equal((await sql`SELECT 1 FROM users WHERE lower(email) = ${who.email.toLowerCase()}`).length, 0)
  })

  test('forged, malformed and other kinds of token are 400; hostile bodies are 422', async () => {
    const { who, token } = await takenOver()
    const forged = `upa_ot_${randomBytes(32).toString('base64url')}`
    const verify = tokenIn((await messagesTo((await userRow(who.id))!.email, 'mail.verify_email'))[0]!, VERIFY_URL)
    // A verification token is a token of the right shape, of another purpose: not a restore link.
    for (const wrong of [forged, 'upa_ot_short', 'x'.repeat(200), token.replace('upa_ot_', 'upa_ak_'), verify])
      assertProblem(await restore(wrong), 400, 'invalid_one_time_token')
    for (const body of [{}, { token, extra: 1 }, { token: 1 }, { token: 'x'.repeat(201) }, [token], { token: null }])
      assertProblem(await A.request('POST', '/auth/email-restore', { auth: null, body }), 422, 'validation_failed')
    const [row] = await sql`SELECT used_at FROM one_time_tokens WHERE token_hash = ${sha256(token)}`
    assert.equal(row!.used_at, null)
    assert.equal((await restore(token)).status, 204)
  })

  test(
    'a restore and a password reset of one account at the same moment: one waits for the other, never a ' +
      'deadlock (503)',
    async () => {
      const round = async () => {
        const { who, token } = await takenOver()
        const reset = `upa_ot_${randomBytes(32).toString('base64url')}`
        await sql`
          INSERT INTO one_time_tokens (purpose, user_id, token_hash, expires_at)
          VALUES ('password_reset', ${who.id}, ${sha256(reset)}, now() + interval '1 hour')`
        const [restored, confirmed] = await Promise.all([
          restore(token),
          A.request('POST', '/auth/password-reset/confirm', {
            auth: null,
            body: { token: reset, password: `race-${unique()}` },
          }),
        ])
        assert.equal(restored.status, 204, restored.text)
        assert.ok([204, 400].includes(confirmed.status), confirmed.text)
      }
      for (let batch = 0; batch < 5; batch++) await Promise.all(Array.from({ length: 4 }, round))
    },
  )
})

test('/openapi.json documents POST /auth/email-restore: anonymous, its 204 and its problems', async () => {
  const doc = (await A.request('GET', '/openapi.json', { auth: null })).body
  const op = doc.paths['/auth/email-restore'].post
  assert.equal(op.operationId, 'restoreEmail')
  assert.deepEqual(op.security, [])
  assert.ok(op.summary)
  for (const status of ['204', '400', '404', '409', '422', '429']) assert.ok(status in op.responses, status)
  assert.deepEqual(op.requestBody.content['application/json'].schema.required, ['token'])
})
