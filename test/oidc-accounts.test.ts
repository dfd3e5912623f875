import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { cp, mkdtemp, readdir, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { after, describe, test } from 'node:test'
import { ConfigError } from '../src/core/config-error.js'
import { connect } from '../src/core/db/connect.js'
import { migrate } from '../src/core/db/migrate.js'
import { ReadinessCheck } from '../src/health/readiness.js'
import { createConsoleTransport } from '../src/mail/console.js'
import { createOrResetAdmin } from '../src/users/admin-bootstrap.js'
import { passwordAccount, passwordLogin, workOf } from './helpers/accounts.js'
import { API_SCOPES, startTestProvider } from './helpers/oidc-provider.js'
import { assertInvalidToken } from './helpers/refused.js'
import { createTestDatabase, startServer, type TestResponse, type TestServer } from './helpers/server.js'
import { waitUntil } from './helpers/wait.js'

// The accounts that tokens of the identity provider make and link
// (docs/auth.md, "Tokens from your identity provider"), as an attacker
// would use them: a user made from provider tokens that gives itself a local
// password (OIDC_LOCAL_PASSWORDS), a token that asserts the address of a local
// admin (POST /auth/identities is the explicit way), and a deleted user's
// address coming back under another subject (OIDC_REPROVISION). Against the
// real test provider (test/helpers/oidc-provider.ts), as test/oidc.test.ts is.

const provider = await startTestProvider()
after(() => provider.close())

const RESET_URL = 'https://app.example.com/reset?token={token}'
const outputs: string[] = []
const transport = createConsoleTransport((text) => void outputs.push(text))
const tuning = { mail: { transport, pollMs: 50 } }

const oidcEnv = (more: Record<string, string> = {}) => ({
  OIDC_ISSUER: provider.issuer,
  OIDC_AUDIENCE: provider.audience,
  OIDC_ADMIN_CLAIM: 'realm_access.roles',
  OIDC_ADMIN_VALUE: 'admin',
  PASSWORD_RESET_URL: RESET_URL,
  TRUST_PROXY: '1',
  ...more,
})
const A = await startServer(oidcEnv(), {}, { tuning })
/** OIDC_LOCAL_PASSWORDS=true, on A's database. */
const L = await startServer(oidcEnv({ OIDC_LOCAL_PASSWORDS: 'true' }), {}, { databaseUrl: A.databaseUrl, tuning })
const { sql } = A

const unique = () => randomBytes(5).toString('hex')
const now = () => Math.floor(Date.now() / 1000)
let octet = 0
/** A client address of its own (TRUST_PROXY=1), so that the login throttle of one test does not reach another. */
const from = () => ({ 'x-forwarded-for': `203.0.113.${++octet % 250}` })

/** A person at the provider: an account whose tokens carry a verified address. */
function person(claims: Record<string, unknown> = {}) {
  const sub = `person-${unique()}`
  const email = `${sub}@example.com`
  return { sub, email, claims: { sub, email, email_verified: true, name: `Person ${sub}`, ...claims } }
}
const tokenClaims = (claims: Record<string, unknown>, at = now()) => ({
  iss: provider.issuer,
  aud: provider.audience,
  iat: at,
  exp: at + 300,
  scope: API_SCOPES,
  ...claims,
})
const signed = (claims: Record<string, unknown>, at?: number) => provider.sign(tokenClaims(claims, at))
const me = (server: TestServer, token: string) => server.request('GET', '/auth/me', { auth: token })

/** The user a token of `who` makes (its first sight): its id. */
async function madeFrom(server: TestServer, who: ReturnType<typeof person>): Promise<number> {
  const res = await me(server, signed(who.claims, now() - 5))
  assert.equal(res.status, 200, res.text)
  return Number(res.body.user.id)
}

// Live users: a deleted one waits in the trash with its address (test/trash-users.test.ts).
const usersWithEmail = async (email: string) =>
  (await sql<Array<{ id: number }>>`SELECT id FROM users WHERE lower(email) = lower(${email}) AND deleted_at IS NULL`)
    .length
const identityOf = async (sub: string) =>
  (
    await sql<Array<{ user_id: number | null }>>`
  SELECT user_id FROM identities WHERE issuer = ${provider.issuer} AND subject = ${sub}`
  )[0]
const passwordHashOf = async (id: number) =>
  (await sql<Array<{ password_hash: string | null }>>`SELECT password_hash FROM users WHERE id = ${id}`)[0]
    ?.password_hash

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.equal(res.body?.code, code, res.text)
}

const login = (server: TestServer, email: string, password: string) =>
  server.request('POST', '/auth/login', { auth: null, body: { email, password }, headers: from() })

describe('a user made from provider tokens has no local password (OIDC_LOCAL_PASSWORDS unset)', () => {
  test(
    'password reset for it (an admin by the role claim): the same 202 for the same work as an unknown address, and ' +
      'no link is made or sent',
    async () => {
      // A server of the test's own: its counters count these requests and nothing else.
      const own = await startServer(oidcEnv(), {}, { tuning })
      own.deps.readiness = new ReadinessCheck(
        () => own.deps.sql`SELECT 1`,
        () => own.clock.now(),
        Number.POSITIVE_INFINITY,
      )
      await own.deps.readiness.database()
      const who = person({ realm_access: { roles: ['admin'] } })
      const id = await madeFrom(own, who)
      const unknown = `nobody-${unique()}@example.com`
      const ask = (email: string) =>
        own.request('POST', '/auth/password-reset', { auth: null, body: { email }, headers: from() })
      for (let i = 0; i < 2; i++) {
        const made = await workOf(own, () => ask(who.email))
        const missing = await workOf(own, () => ask(unknown))
        for (const { result } of [made, missing]) assert.equal(result.status, 202, result.text)
        assert.equal(made.result.text, missing.result.text)
        assert.deepEqual(made.work, missing.work)
      }
      const [left] = await own.sql<[{ tokens: number; mail: number }]>`
        SELECT (SELECT count(*)::int FROM one_time_tokens WHERE user_id = ${id}) AS tokens,
        (SELECT count(*)::int FROM mail_outbox WHERE user_id = ${id}) AS mail`
      assert.deepEqual(left, { tokens: 0, mail: 0 })
      assert.equal(
        outputs.some((text) => text.includes(who.email)),
        false,
        'no message to its address',
      )
    },
  )

  test(
    'a password login of it, with a password set anyway (a reset made before this rule, or SQL), is the 401 ' +
      'invalid_credentials of a wrong password, for the same work; the password is no current_password either',
    async () => {
      const own = await startServer(oidcEnv(), {}, { tuning })
      const who = person({ realm_access: { roles: ['admin'] } })
      const id = await madeFrom(own, who)
      const password = `pw-${unique()}`
      await own.sql`UPDATE users SET password_hash = ${await own.deps.passwords.hash(password)} WHERE id = ${id}`
      const right = await workOf(own, () => login(own, who.email, password))
      const wrong = await workOf(own, () => login(own, who.email, `wrong-${unique()}`))
      for (const { result } of [right, wrong]) {
        assertProblem(result, 401, 'invalid_credentials')
        assert.equal(result.headers.get('www-authenticate'), 'Bearer realm="api"')
      }
      assert.equal(right.result.body.detail, wrong.result.body.detail)
      assert.deepEqual(right.work, wrong.work)
      // Nor does the password prove the person where a step-up asks for it (a token without auth_time).
      const key = await own.request('POST', '/api-keys', {
        auth: signed(who.claims, now() + 1),
        body: { name: 'k', scopes: ['products:read'], current_password: password },
      })
      assertProblem(key, 403, 'current_password_required')
    },
  )

  test(
    'it cannot be given a password through PATCH /users/{id}: 409 no_local_password, for an admin and for itself, ' +
      'nothing changed; with OIDC_LOCAL_PASSWORDS=true an admin may',
    async () => {
      const who = person()
      const id = await madeFrom(A, who)
      const byAdmin = await A.request('PATCH', `/users/${id}`, { body: { password: `pw-${unique()}` } })
      assertProblem(byAdmin, 409, 'no_local_password')
      const bySelf = await A.request('PATCH', `/users/${id}`, {
        auth: signed(who.claims),
        body: { password: `pw-${unique()}` },
      })
      assertProblem(bySelf, 409, 'no_local_password')
      const replaced = await A.request('PUT', `/users/${id}`, {
        body: { name: 'Replaced', email: who.email, password: `pw-${unique()}` },
      })
      assertProblem(replaced, 409, 'no_local_password')
      assert.equal(await passwordHashOf(id), null)
      // Other changes go through as before.
      assert.equal((await A.request('PATCH', `/users/${id}`, { body: { name: 'Renamed' } })).status, 200)
      const allowed = await L.request('PATCH', `/users/${id}`, { body: { password: `pw-${unique()}` } })
      assert.equal(allowed.status, 200, allowed.text)
    },
  )

  test(
    'a reset link sent while OIDC_LOCAL_PASSWORDS=true sets no password once it is off: 400 ' +
      'invalid_one_time_token',
    async () => {
      const who = person()
      const id = await madeFrom(A, who)
      const link = await resetLink(L, who.email)
      const res = await A.request('POST', '/auth/password-reset/confirm', {
        auth: null,
        body: { token: link, password: `pw-${unique()}` },
        headers: from(),
      })
      assertProblem(res, 400, 'invalid_one_time_token')
      assert.equal(await passwordHashOf(id), null)
    },
  )

  test(
    'a session a password opened while OIDC_LOCAL_PASSWORDS=true is not refreshed once it is off (401), nor does ' +
      'the password log in',
    async () => {
      const who = person({ realm_access: { roles: ['admin'] } })
      const id = await madeFrom(A, who)
      const password = `pw-${unique()}`
      await sql`UPDATE users SET password_hash = ${await A.deps.passwords.hash(password)} WHERE id = ${id}`
      const tokens = await passwordLogin(L, { email: who.email, password }, 'jwt', from())
      const refreshed = await A.request('POST', '/auth/refresh', {
        auth: null,
        body: { refresh_token: tokens.refresh_token },
      })
      assertProblem(refreshed, 401, 'invalid_token')
      assertProblem(await login(A, who.email, password), 401, 'invalid_credentials')
    },
  )

  test(
    'with OIDC_LOCAL_PASSWORDS=true it sets a password through password reset and logs in with it; a user linked ' +
      'by address keeps its password either way',
    async () => {
      const who = person()
      const id = await madeFrom(L, who)
      const password = `pw-${unique()}`
      const link = await resetLink(L, who.email)
      const set = await L.request('POST', '/auth/password-reset/confirm', {
        auth: null,
        body: { token: link, password },
        headers: from(),
      })
      assert.equal(set.status, 204, set.text)
      const tokens = await passwordLogin(L, { email: who.email, password }, 'jwt', from())
      assert.equal((await L.request('GET', '/auth/me', { auth: tokens.access_token })).body.user.id, id)

      // A local account with a password of its own, linked by its verified address: not made from tokens.
      const local = await passwordAccount(A)
      await sql`UPDATE users SET email_verified_at = now() WHERE id = ${local.id}`
      const linked = person({ email: local.email })
      assert.equal((await me(A, signed(linked.claims))).body.user.id, local.id)
      await passwordLogin(A, local, 'jwt', from())
    },
  )
})

/** The token of the reset link `server` sends to `email`. */
async function resetLink(server: TestServer, email: string): Promise<string> {
  const before = outputs.length
  const res = await server.request('POST', '/auth/password-reset', { auth: null, body: { email }, headers: from() })
  assert.equal(res.status, 202, res.text)
  let token: string | undefined
  await waitUntil(
    `a reset link to ${email}`,
    () => {
      const text = outputs.slice(before).find((t) => t.includes(`To: ${email}`))
      token = text && /reset\?token=(upa_ot_[A-Za-z0-9_-]{43})$/m.exec(text)?.[1]
      return token !== undefined
    },
    5000,
  )
  return token!
}

describe('linking a local admin', () => {
  test(
    "a token asserting a local admin's verified address (the first admin's) is not linked to it: 403 " +
      'identity_link_required, no link made, whatever role the token claims',
    async () => {
      // A database of its own: were the admin linked, a token of the provider would demote it.
      const own = await startServer(oidcEnv())
      await own.sql`UPDATE users SET email_verified_at = now() WHERE id = ${own.admin.id}`
      const [{ email }] = await own.sql<[{ email: string }]>`SELECT email FROM users WHERE id = ${own.admin.id}`
      for (const claims of [{}, { realm_access: { roles: ['admin'] } }]) {
        const who = person({ email: email.toUpperCase(), ...claims })
        const res = await me(own, signed(who.claims))
        assertProblem(res, 403, 'identity_link_required')
        assert.match(res.body.detail, /POST \/auth\/identities/)
        assert.equal((await own.request('GET', `/users?limit=1`, { auth: signed(who.claims) })).status, 403)
        const [link] = await own.sql`SELECT 1 FROM identities WHERE subject = ${who.sub}`
        assert.equal(link, undefined, 'no link made')
      }
      const [admin] = await own.sql<[{ role: string; n: number }]>`
        SELECT role, (SELECT count(*)::int FROM users WHERE lower(email) = lower(${email})) AS n FROM users
        WHERE id = ${own.admin.id}`
      assert.deepEqual(admin, { role: 'admin', n: 1 })
    },
  )
})

describe('POST /auth/identities', () => {
  const linkWith = (server: TestServer, auth: string, body: Record<string, unknown>) =>
    server.request('POST', '/auth/identities', { auth, body, headers: from() })

  /** A local admin with a password, logged in by it (a fresh session), and its address verified. */
  async function localAdmin(server: TestServer = A) {
    const account = await passwordAccount(server, 'admin')
    await server.sql`UPDATE users SET email_verified_at = now() WHERE id = ${account.id}`
    const tokens = await passwordLogin(server, account, 'jwt', from())
    return { ...account, token: tokens.access_token }
  }

  test(
    "from a local session with a fresh proof: 201 with the link; the provider account's tokens are that user " +
      'from then on, the event user.identity_linked is recorded, and linking again answers 200',
    async () => {
      const admin = await localAdmin()
      // The address at the provider may differ from the local one: the caller chose to link it. With
      // OIDC_ADMIN_CLAIM the provider decides the role from the next token on: this person is an admin there too.
      const who = person({ realm_access: { roles: ['admin'] } })
      const token = signed(who.claims)
      const res = await linkWith(A, admin.token, { token })
      assert.equal(res.status, 201, res.text)
      assert.deepEqual(Object.keys(res.body).sort(), ['issuer', 'linked_at', 'subject', 'user_id'])
      assert.equal(res.body.issuer, provider.issuer)
      assert.equal(res.body.subject, who.sub)
      assert.equal(res.body.user_id, admin.id)
      assert.ok(Date.parse(res.body.linked_at) > 0)
      const seen = await me(A, signed(who.claims))
      assert.equal(seen.status, 200, seen.text)
      assert.equal(seen.body.user.id, admin.id)
      assert.equal(seen.body.user.role, 'admin')
      assert.equal(await usersWithEmail(who.email), 0, 'no user made of its address')
      await A.published()
      const [event] = await sql<Array<{ actor_id: number; actor_credential: string; data: Record<string, unknown> }>>`
        SELECT actor_id, actor_credential, data FROM events WHERE type = 'user.identity_linked'
          AND subject_id = ${admin.id}`
      assert.deepEqual(event, {
        actor_id: admin.id,
        actor_credential: 'jwt',
        data: { id: admin.id, issuer: provider.issuer, subject: who.sub },
      })
      const again = await linkWith(A, admin.token, { token })
      assert.equal(again.status, 200, again.text)
      assert.equal(again.body.linked_at, res.body.linked_at)
    },
  )

  test(
    'a provider account linked to another user: 409 identity_already_linked; a caller linked already to another ' +
      'account of the provider: 409 too',
    async () => {
      const first = await localAdmin()
      const second = await localAdmin()
      const who = person()
      assert.equal((await linkWith(A, first.token, { token: signed(who.claims) })).status, 201)
      assertProblem(await linkWith(A, second.token, { token: signed(who.claims) }), 409, 'identity_already_linked')
      // Made from its own token: a user of its own.
      const made = person()
      await madeFrom(A, made)
      assertProblem(await linkWith(A, second.token, { token: signed(made.claims) }), 409, 'identity_already_linked')
      assertProblem(await linkWith(A, first.token, { token: signed(person().claims) }), 409, 'identity_already_linked')
      assert.equal((await identityOf(who.sub))?.user_id, first.id)
    },
  )

  test(
    'a fresh proof is needed: current_password, or a password login within REAUTH_WINDOW (403 ' +
      'current_password_required otherwise, a wrong one too); nothing linked',
    async () => {
      const account = await passwordAccount(A)
      // A JWT of a session that did not just log in with its password.
      const stale = A.jwtFor(account.id, 'user')
      const who = person()
      assertProblem(await linkWith(A, stale, { token: signed(who.claims) }), 403, 'current_password_required')
      assertProblem(
        await linkWith(A, stale, { token: signed(who.claims), current_password: 'not-the-password' }),
        403,
        'current_password_required',
      )
      assert.equal(await identityOf(who.sub), undefined)
      const res = await linkWith(A, stale, { token: signed(who.claims), current_password: account.password })
      assert.equal(res.status, 201, res.text)
    },
  )

  test('an API key or a provider token cannot link (403 forbidden), nothing linked', async () => {
    const admin = await localAdmin()
    const created = await A.request('POST', '/api-keys', {
      auth: admin.token,
      body: { name: 'k', scopes: ['users:read'] },
    })
    assert.equal(created.status, 201, created.text)
    const who = person()
    const byKey = await A.request('POST', '/auth/identities', {
      auth: null,
      headers: { 'x-api-key': created.body.key },
      body: { token: signed(who.claims), current_password: admin.password },
    })
    assertProblem(byKey, 403, 'forbidden')
    const fresh = signed({ ...person().claims, auth_time: now() - 5 })
    assertProblem(await linkWith(A, fresh, { token: signed(who.claims) }), 403, 'forbidden')
    assert.equal(await identityOf(who.sub), undefined)
  })

  test(
    'the token is verified as a bearer token of the provider is; one that fails, or carries no verified address, ' +
      'is 422 invalid_identity_token and links nothing',
    async () => {
      const admin = await localAdmin()
      const who = person()
      const bad: Array<[string, string]> = [
        ['alg none', provider.sign(tokenClaims(who.claims), { alg: 'none' })],
        ['HS256 keyed with the public key', provider.sign(tokenClaims(who.claims), { alg: 'HS256' })],
        ['another audience', signed({ ...who.claims, aud: 'https://another-api.example.test' })],
        ['expired', signed({ ...who.claims, iat: now() - 400, exp: now() - 60 })],
        ['another issuer', provider.sign({ ...tokenClaims(who.claims), iss: 'https://evil.example.test' })],
        ['not a JWT', 'upa_at_' + 'x'.repeat(43)],
        ['no verified address', signed({ ...who.claims, email_verified: false })],
      ]
      for (const [name, token] of bad) {
        const res = await linkWith(A, admin.token, { token })
        assert.equal(res.status, 422, `${name}: ${res.text}`)
        assert.equal(res.body.code, 'invalid_identity_token', name)
      }
      assert.equal(await identityOf(who.sub), undefined)
    },
  )

  test('a provider account whose user was deleted is not linked again this way: 409', async () => {
    const who = person()
    const id = await madeFrom(A, who)
    assert.equal((await A.request('DELETE', `/users/${id}`)).status, 204)
    const admin = await localAdmin()
    assertProblem(
      await linkWith(A, admin.token, { token: signed(who.claims, now() + 2) }),
      409,
      'identity_already_linked',
    )
  })

  test('without an identity provider configured: 404', async () => {
    const plain = await startServer({}, {}, { databaseUrl: A.databaseUrl })
    const res = await plain.request('POST', '/auth/identities', { body: { token: signed(person().claims) } })
    assertProblem(res, 404, 'not_found')
  })
})

describe('a deleted user stays deleted (OIDC_REPROVISION unset)', () => {
  test(
    'deleting a user made from provider tokens refuses its address to every subject: another account of the ' +
      'provider with the same verified address gets 401, and no user or link is made',
    async () => {
      const who = person()
      const id = await madeFrom(A, who)
      assert.equal((await A.request('DELETE', `/users/${id}`)).status, 204)
      const other = person({ email: who.email.toUpperCase() })
      assertInvalidToken(await me(A, signed(other.claims, now() + 2)))
      assert.equal(await usersWithEmail(who.email), 0)
      assert.equal(await identityOf(other.sub), undefined)
    },
  )

  test('so does deleting a local user its provider account was linked to by its address', async () => {
    const local = await A.createUser()
    await sql`UPDATE users SET email_verified_at = now() WHERE id = ${local.id}`
    const who = person({ email: local.email })
    assert.equal((await me(A, signed(who.claims))).body.user.id, local.id)
    assert.equal((await A.request('DELETE', `/users/${local.id}`)).status, 204)
    const other = person({ email: local.email })
    assertInvalidToken(await me(A, signed(other.claims, now() + 2)))
    assert.equal(await usersWithEmail(local.email), 0)
    // A local user with the address made since is not linked by it either: it links an account itself.
    const again = await A.createUser({ email: local.email })
    await sql`UPDATE users SET email_verified_at = now() WHERE id = ${again.id}`
    assertInvalidToken(await me(A, signed(other.claims, now() + 2)))
    assert.equal(await identityOf(other.sub), undefined)
  })

  test('with OIDC_REPROVISION=true another account with that address makes a new user, as its own would', async () => {
    const R = await startServer(oidcEnv({ OIDC_REPROVISION: 'true' }), {}, { databaseUrl: A.databaseUrl })
    const who = person()
    const id = await madeFrom(R, who)
    assert.equal((await R.request('DELETE', `/users/${id}`)).status, 204)
    const other = person({ email: who.email })
    const again = await me(R, signed(other.claims, now() + 2))
    assert.equal(again.status, 200, again.text)
    assert.notEqual(again.body.user.id, id)
  })
})

describe('sql/018 on a database of the rules before it', () => {
  test(
    'the users a token made are told from the users a token was linked to; their password sessions end; a ' +
      "deleted user's link keeps its address",
    async () => {
      const url = await createTestDatabase({ empty: true })
      const db = connect(url, { max: 1, statementTimeoutMs: 60_000 })
      after(() => db.end({ timeout: 5 }))
      const dir = await mkdtemp(join(tmpdir(), 'upa-sql-before-018-'))
      after(() => rm(dir, { recursive: true, force: true }))
      const sqlDir = new URL('../sql/', import.meta.url)
      for (const name of await readdir(sqlDir))
        if (Number(name.slice(0, 3)) < 18) await cp(new URL(name, sqlDir), join(dir, name))
      await migrate(db, pathToFileURL(`${dir}/`))

      const issuer = 'https://idp.example.test'
      const user = async (name: string, createdAt: string) =>
        (
          await db<[{ id: number }]>`
          INSERT INTO users (name, email, created_at, email_verified_at) VALUES
          (${name}, ${`${name}@example.com`}, ${createdAt}, ${createdAt}) RETURNING id`
        )[0].id
      const link = (id: number, linkedAt: string) =>
        db`INSERT INTO identities (issuer, subject, user_id, created_at) VALUES (${issuer}, ${`sub-${id}`}, ${id},
        ${linkedAt})`
      // Made by a token: the user and its link in one transaction, one now().
      const made = await user('made', '2025-01-01T10:00:00Z')
      await link(made, '2025-01-01T10:00:00Z')
      // A local user linked by its address later.
      const linked = await user('linked', '2025-01-01T10:00:00Z')
      await link(linked, '2025-01-02T10:00:00Z')
      // Made again by a later token (OIDC_REPROVISION) on the link its deleted user left.
      const again = await user('again', '2025-01-03T10:00:00Z')
      await link(again, '2025-01-01T09:00:00Z')
      const session = async (id: number) =>
        (
          await db<[{ id: number }]>`
          INSERT INTO sessions (user_id, scopes, token_format, expires_at, last_used_at)
          VALUES (${id}, ${['users:read']}, 'jwt', now() + interval '1 day', now()) RETURNING id`
        )[0].id
      const sessions = { made: await session(made), linked: await session(linked) }

      assert.deepEqual((await migrate(db))[0], '018_provider_users.sql')
      const flags = await db<Array<{ id: number; made_by_provider: boolean }>>`
        SELECT id, made_by_provider FROM users ORDER BY id`
      assert.deepEqual(
        flags.map((r) => [r.id, r.made_by_provider]),
        [
          [made, true],
          [linked, false],
          [again, true],
        ],
      )
      const ended = await db<Array<{ id: number }>>`SELECT id FROM sessions WHERE revoked_at IS NOT NULL`
      assert.deepEqual(
        ended.map((r) => r.id),
        [sessions.made],
      )

      // Removing the row is a purge since sql/019, which erases the address (a move to the trash keeps it).
      await db`DELETE FROM users WHERE id = ${made}`
      const [left] = await db<Array<{ user_id: number | null; deleted_email: string | null; deleted: boolean }>>`
        SELECT user_id, deleted_email, user_deleted_at IS NOT NULL AS deleted FROM identities
          WHERE subject = ${`sub-${made}`}`
      assert.deepEqual({ ...left }, { user_id: null, deleted_email: null, deleted: true })
    },
  )
})

describe('make admin', () => {
  test('does not give an admin made from provider tokens a password, unless OIDC_LOCAL_PASSWORDS', async () => {
    const who = person({ realm_access: { roles: ['admin'] } })
    const id = await madeFrom(A, who)
    await assert.rejects(
      createOrResetAdmin(sql, A.deps.passwords, who.email, `pw-${unique()}`),
      (err: unknown) => err instanceof ConfigError && /identity provider/.test(err.message),
    )
    assert.equal(await passwordHashOf(id), null)
    const reset = await createOrResetAdmin(sql, A.deps.passwords, who.email, `pw-${unique()}`, true)
    assert.equal(reset.id, id)
  })
})
