import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, describe, test } from 'node:test'
import { newOneTimeToken } from '../src/auth/recovery/one-time-tokens.js'
import { passwordAccount, passwordLogin, type Account } from './helpers/accounts.js'
import { assertInvalidToken } from './helpers/refused.js'
import { startServer, type TestResponse, type TestServer } from './helpers/server.js'
import { SseClient } from './helpers/sse.js'
import { waitUntil } from './helpers/wait.js'

// A deleted user goes to the trash: two instances, A and B, of the real
// server on one database. Every credential of it is refused from the delete
// on, on the instance that made it and, once that one has heard the change,
// on the other (B waits for what was committed, never for a time): its
// password, refresh and opaque tokens, JWTs minted before, API keys, reset
// and verification links, an open event stream, the webhooks it owned. A
// restore brings none of them back; a new login works. The last-admin rule
// counts live admins. The purge erases what names the person.

const RESET_URL = 'https://app.example.com/reset?token={token}'
const VERIFY_URL = 'https://app.example.com/verify/{token}'
const env = { PASSWORD_RESET_URL: RESET_URL, VERIFY_EMAIL_URL: VERIFY_URL, WEBHOOK_ALLOW_PRIVATE: 'true' }
const A = await startServer(env)
const B = await startServer(env, {}, { databaseUrl: A.databaseUrl })
const both = [A, B]
const { sql } = A
// Both instances accept the file's admin JWT (one JWT secret); B's own admin is a user like any other here.
const admin = () => ({ auth: A.admin.token })

const unique = () => randomBytes(5).toString('hex')
const me = (server: TestServer, auth: string, headers: Record<string, string> = {}) =>
  server.request('GET', '/auth/me', { auth, headers })
const meByKey = (server: TestServer, key: string) =>
  server.request('GET', '/auth/me', { auth: null, headers: { 'x-api-key': key } })
const refresh = (server: TestServer, token: string) =>
  server.request('POST', '/auth/refresh', { auth: null, body: { refresh_token: token } })
const loginWith = (server: TestServer, who: Account) =>
  server.request('POST', '/auth/login', { auth: null, body: { email: who.email, password: who.password } })

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.equal(res.body.code, code, res.text)
}

/** B has applied every credential change committed before this call (its listener caught up). */
const bHeard = () => B.deps.credentialChanges.caughtUp()

/** A user with a password, logged in on A (a JWT) and on B (an opaque token), with an API key and two links. */
async function holder() {
  const account = await passwordAccount(A)
  const jwt = await passwordLogin(A, account, 'jwt')
  const opaque = await passwordLogin(B, account, 'opaque')
  const created = await A.request('POST', '/api-keys', {
    auth: jwt.access_token,
    body: { name: `key-${unique()}`, scopes: ['products:read'], current_password: account.password },
  })
  assert.equal(created.status, 201, created.text)
  const minted = A.jwtFor(account.id, 'user')
  const reset = newOneTimeToken()
  const verify = newOneTimeToken()
  await sql`
    INSERT INTO one_time_tokens (purpose, user_id, token_hash, email, expires_at) VALUES
    ('password_reset', ${account.id}, ${reset.hash}, NULL, now() + interval '1 hour'),
    ('verify_email', ${account.id}, ${verify.hash}, ${account.email}, now() + interval '1 hour')`
  // Every credential works, on both instances (and each has it in memory).
  for (const server of both) {
    for (const auth of [jwt.access_token, opaque.access_token, minted])
      assert.equal((await me(server, auth)).status, 200, server.url)
    assert.equal((await meByKey(server, created.body.key)).status, 200)
  }
  return { account, jwt, opaque, key: created.body.key as string, minted, reset: reset.token, verify: verify.token }
}

type Holder = Awaited<ReturnType<typeof holder>>

/** Every credential of `h` is refused by `server`. */
async function refusedOn(server: TestServer, h: Holder): Promise<void> {
  for (const auth of [h.jwt.access_token, h.opaque.access_token, h.minted]) assertInvalidToken(await me(server, auth))
  assertInvalidToken(await meByKey(server, h.key))
  for (const token of [h.jwt.refresh_token, h.opaque.refresh_token])
    assert.equal((await refresh(server, token)).status, 401)
}

describe('a user moved to the trash', () => {
  let h: Holder

  test('every credential of it is refused at once on the instance that deleted it, and on the other', async () => {
    h = await holder()
    const res = await A.request('DELETE', `/users/${h.account.id}`, admin())
    assert.equal(res.status, 204, res.text)
    await refusedOn(A, h)
    assert.equal((await loginWith(A, h.account)).status, 401)
    await bHeard()
    await refusedOn(B, h)
    assert.equal((await loginWith(B, h.account)).status, 401)
    assert.equal((await A.request('GET', `/users/${h.account.id}`, admin())).status, 404)
  })

  test('its reset and verification links are spent, and a reset request for its address sends nothing', async () => {
    const confirm = await B.request('POST', '/auth/password-reset/confirm', {
      auth: null,
      body: { token: h.reset, password: 'a new long password' },
    })
    assertProblem(confirm, 400, 'invalid_one_time_token')
    const verify = await A.request('POST', '/auth/verify-email', { auth: null, body: { token: h.verify } })
    assertProblem(verify, 400, 'invalid_one_time_token')
    const asked = await A.request('POST', '/auth/password-reset', { auth: null, body: { email: h.account.email } })
    assert.equal(asked.status, 202)
    const [open] = await sql`
      SELECT count(*)::int AS n FROM one_time_tokens WHERE user_id = ${h.account.id} AND used_at IS NULL`
    assert.equal(open!.n, 0)
  })

  test('in the database: its sessions ended, its API keys gone, its epoch raised; the row waits', async () => {
    const [row] = await sql`SELECT deleted_at, credential_epoch FROM users WHERE id = ${h.account.id}`
    assert.ok(row!.deleted_at)
    assert.ok(row!.credential_epoch > 0)
    const [live] = await sql`
      SELECT count(*)::int AS n FROM sessions WHERE user_id = ${h.account.id} AND revoked_at IS NULL`
    assert.equal(live!.n, 0)
    const [keys] = await sql`SELECT count(*)::int AS n FROM api_keys WHERE user_id = ${h.account.id}`
    assert.equal(keys!.n, 0)
  })

  test('a restore brings none of its credentials back; a new login works, on either instance', async () => {
    const restored = await B.request('POST', `/users/${h.account.id}/restore`, admin())
    assert.equal(restored.status, 200, restored.text)
    assert.equal(restored.body.email, h.account.email)
    assert.equal(restored.body.deleted_at, undefined)
    await A.deps.credentialChanges.caughtUp()
    for (const server of both) await refusedOn(server, h)
    for (const server of both) {
      const login = await loginWith(server, h.account)
      assert.equal(login.status, 200, login.text)
      assert.equal((await me(server, login.body.access_token)).status, 200)
    }
  })

  test('its address is free while it is in the trash; a restore then is 409 email_taken', async () => {
    const account = await passwordAccount(A)
    assert.equal((await A.request('DELETE', `/users/${account.id}`, admin())).status, 204)
    const taken = await B.request('POST', '/users', { ...admin(), body: { name: 'New Owner', email: account.email } })
    assert.equal(taken.status, 201, taken.text)
    assertProblem(await A.request('POST', `/users/${account.id}/restore`, admin()), 409, 'email_taken')
    // A login with the address is the live owner's: the trashed one's password opens nothing.
    assert.equal((await loginWith(A, account)).status, 401)
  })
})

describe('who may delete, list the trash, restore and purge', () => {
  test('deleting oneself (with current_password) goes to the trash; permanent=true is an admin’s only', async () => {
    const account = await passwordAccount(A)
    const { access_token: jwt } = await passwordLogin(A, account)
    const other = await passwordAccount(A)
    const { access_token: otherJwt } = await passwordLogin(A, other)
    const purgeSelf = await A.request('DELETE', `/users/${other.id}?permanent=true`, {
      auth: otherJwt,
      body: { current_password: other.password },
    })
    assertProblem(purgeSelf, 403, 'forbidden')
    const res = await A.request('DELETE', `/users/${account.id}`, {
      auth: jwt,
      body: { current_password: account.password },
    })
    assert.equal(res.status, 204, res.text)
    const [row] = await sql`SELECT deleted_at FROM users WHERE id = ${account.id}`
    assert.ok(row!.deleted_at, 'in the trash')
    assertProblem(await A.request('GET', '/users?trashed=true', { auth: otherJwt }), 403, 'forbidden')
    assertProblem(await A.request('POST', `/users/${account.id}/restore`, { auth: otherJwt }), 403, 'forbidden')
    const listed = await B.request('GET', `/users?trashed=true&id=${account.id}`, admin())
    assert.equal(listed.status, 200, listed.text)
    assert.equal(listed.body.length, 1)
    assert.equal(listed.body[0].email, account.email)
    assert.ok(listed.body[0].deleted_at)
    assert.equal(listed.body[0].password_hash, undefined)
  })

  test('the webhooks a deleted admin owned are disabled, and stay so after its restore', async () => {
    const owner = await A.createUser({ role: 'admin', session: true })
    const hook = await A.request('POST', '/webhooks', {
      auth: owner.token,
      body: { url: 'http://127.0.0.1:9/in', event_types: ['product.created'] },
    })
    assert.equal(hook.status, 201, hook.text)
    assert.equal(hook.body.status, 'active')
    assert.equal((await A.request('DELETE', `/users/${owner.id}`, admin())).status, 204)
    const disabled = await A.request('GET', `/webhooks/${hook.body.id}`, admin())
    assert.equal(disabled.body.status, 'disabled')
    assert.equal(disabled.body.owner_id, null)
    assert.equal(disabled.body.last_error, `its owner (user ${owner.id}) was deleted`)
    assert.equal((await B.request('POST', `/users/${owner.id}/restore`, admin())).status, 200)
    assert.equal((await A.request('GET', `/webhooks/${hook.body.id}`, admin())).body.status, 'disabled')
  })

  test('an event stream of a deleted admin ends, on the other instance too', async () => {
    const watcher = await A.createUser({ role: 'admin' })
    const stream = await SseClient.open(B.url, '/events/stream', {
      headers: { authorization: `Bearer ${watcher.token}` },
    })
    after(() => stream.res.destroy())
    assert.equal(stream.status, 200, stream.text)
    await stream.waitFor(() => stream.retry !== undefined, 5000, 'retry:')
    assert.equal((await A.request('DELETE', `/users/${watcher.id}`, admin())).status, 204)
    let ended = false
    void stream.ended.then(() => (ended = true))
    await waitUntil('the stream of the deleted admin to end', () => ended, 10_000)
  })
})

describe('the last admin', () => {
  test(
    'only live admins count: with the others in the trash the last one may not leave; a restore needs no check; ' +
      'permanent=true on an admin follows the rule',
    async () => {
      const others = await sql<Array<{ id: number }>>`
        SELECT id FROM users WHERE role = 'admin' AND deleted_at IS NULL AND id <> ${A.admin.id}`
      for (const { id } of others) assert.equal((await A.request('DELETE', `/users/${id}`, admin())).status, 204)
      const demote = await A.request('PATCH', `/users/${A.admin.id}`, { ...admin(), body: { role: 'user' } })
      assertProblem(demote, 409, 'last_admin')
      // The last admin purging itself (a self-deletion: with its password) is refused likewise.
      const password = `pw-${unique()}`
      await sql`UPDATE users SET password_hash = ${await A.deps.passwords.hash(password)} WHERE id = ${A.admin.id}`
      await A.renewAdminToken()
      const purgeSelf = await A.request('DELETE', `/users/${A.admin.id}?permanent=true`, {
        ...admin(),
        body: { current_password: password },
      })
      assertProblem(purgeSelf, 409, 'last_admin')
      // A trashed admin comes back without a check; then it may be purged, the other admin staying.
      const back = others[0]!.id
      assert.equal((await B.request('POST', `/users/${back}/restore`, admin())).status, 200)
      assert.equal((await B.request('DELETE', `/users/${back}?permanent=true`, admin())).status, 204)
      const [gone] = await sql`SELECT count(*)::int AS n FROM users WHERE id = ${back}`
      assert.equal(gone!.n, 0)
    },
  )
})

describe('the purge erases a user', () => {
  test(
    'its row, the data of its events, its sessions’ and keys’ events, its mail, the login counts of its address, ' +
      'the address of its provider link; the purged event is its id alone',
    async () => {
      const h = await holder()
      const { id, email } = h.account
      const wrong = await A.request('POST', '/auth/login', { auth: null, body: { email, password: 'wrong password!' } })
      assert.equal(wrong.status, 401)
      await sql`
        INSERT INTO mail_outbox (type, user_id, recipient, subject, body, failed_at)
        VALUES ('mail.verify_email', ${id}, ${email}, 'Verify', 'a message kept after failing', now())`
      await sql`
        INSERT INTO identities (issuer, subject, user_id) VALUES ('https://idp.example.com', ${unique()}, ${id})`
      assert.equal((await A.request('DELETE', `/users/${id}`, admin())).status, 204)
      await A.published()
      const [session] = await sql<Array<{ id: number }>>`SELECT id FROM sessions WHERE user_id = ${id} LIMIT 1`
      const [failures] = await sql`SELECT count(*)::int AS n FROM login_failures WHERE email = ${email}`
      assert.ok(failures!.n > 0, 'its failed login was counted')

      const purge = await B.request('DELETE', `/users/${id}?permanent=true`, admin())
      assert.equal(purge.status, 204, purge.text)
      await A.published()
      assert.equal((await sql`SELECT 1 FROM users WHERE id = ${id}`).length, 0)
      const about = await sql<Array<{ type: string; data: Record<string, unknown> }>>`
        SELECT type, data FROM events WHERE subject_type = 'user' AND subject_id = ${id} ORDER BY id`
      assert.ok(about.some((e) => e.type === 'login.failed'))
      for (const e of about) assert.deepEqual(e.data, { id }, e.type)
      assert.equal(about.at(-1)!.type, 'user.purged')
      const sessionEvents = await sql<Array<{ data: Record<string, unknown> }>>`
        SELECT data FROM events WHERE subject_type = 'session' AND subject_id = ${session!.id}`
      assert.ok(sessionEvents.length > 0)
      for (const e of sessionEvents) assert.deepEqual(e.data, { id: session!.id, user_id: id })
      const keyEvents = await sql<Array<{ data: Record<string, unknown> }>>`
        SELECT data FROM events WHERE subject_type = 'api_key' AND (data->>'user_id')::bigint = ${id}`
      for (const e of keyEvents) assert.deepEqual(Object.keys(e.data).sort(), ['id', 'user_id'])
      assert.equal((await sql`SELECT 1 FROM mail_outbox WHERE user_id = ${id} OR recipient = ${email}`).length, 0)
      assert.equal((await sql`SELECT 1 FROM login_failures WHERE email = ${email}`).length, 0)
      const [link] = await sql`SELECT user_id, deleted_email, user_deleted_at FROM identities WHERE user_id IS NULL
        AND issuer = 'https://idp.example.com' ORDER BY user_deleted_at DESC LIMIT 1`
      assert.equal(link!.deleted_email, null)
      assert.ok(link!.user_deleted_at)
      const feed = await A.request('GET', `/events?subject_type=user&subject_id=${id}&type=user.purged`, admin())
      assert.deepEqual(feed.body[0].data, { id })
    },
  )

  test('the login counts of an address another user holds now stay', async () => {
    const account = await passwordAccount(A)
    assert.equal((await A.request('DELETE', `/users/${account.id}`, admin())).status, 204)
    const heir = await passwordAccount(A)
    await sql`UPDATE users SET email = ${account.email} WHERE id = ${heir.id}`
    const wrong = await A.request('POST', '/auth/login', {
      auth: null,
      body: { email: account.email, password: 'wrong password!' },
    })
    assert.equal(wrong.status, 401)
    assert.equal((await A.request('DELETE', `/users/${account.id}?permanent=true`, admin())).status, 204)
    assert.ok((await sql`SELECT 1 FROM login_failures WHERE email = ${account.email}`).length > 0)
  })

  test('the service purges a user after TRASH_RETENTION (job trash.purge on B’s clock), erasing it alike', async () => {
    const account = await passwordAccount(A)
    assert.equal((await A.request('DELETE', `/users/${account.id}`, admin())).status, 204)
    await sql`UPDATE users SET deleted_at = ${new Date(B.clock.now()).toISOString()} WHERE id = ${account.id}`
    await B.deps.trash.sweep()
    assert.equal((await sql`SELECT 1 FROM users WHERE id = ${account.id}`).length, 1, 'not due yet')
    B.clock.advance(B.deps.config.trashRetention * 1000 + 1000)
    assert.ok((await B.deps.trash.sweep()) >= 1)
    assert.equal((await sql`SELECT 1 FROM users WHERE id = ${account.id}`).length, 0)
    await A.published()
    const about = await sql<Array<{ type: string; data: Record<string, unknown>; actor_credential: string }>>`
      SELECT type, data, actor_credential FROM events WHERE subject_type = 'user' AND subject_id = ${account.id}
      ORDER BY id`
    for (const e of about) assert.deepEqual(e.data, { id: account.id }, e.type)
    assert.deepEqual(about.at(-1), { type: 'user.purged', data: { id: account.id }, actor_credential: 'system' })
  })
})
