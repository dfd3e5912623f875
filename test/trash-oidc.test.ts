import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, test } from 'node:test'
import { API_SCOPES, startTestProvider } from './helpers/oidc-provider.js'
import { assertInvalidToken } from './helpers/refused.js'
import { startServer, type TestServer } from './helpers/server.js'

// A user of the identity provider moved to the trash, on two instances, A
// and B, on one database: its provider tokens are refused, those issued
// before the delete and those issued after (as a deleted user's are), and
// another account of the provider with its verified address gets no user;
// a restore lets the tokens issued after it in again. B is checked once it
// has heard what was committed, never after a sleep.

const provider = await startTestProvider()
after(() => provider.close())
const env = { OIDC_ISSUER: provider.issuer, OIDC_AUDIENCE: provider.audience }
const A = await startServer(env)
const B = await startServer(env, {}, { databaseUrl: A.databaseUrl })
const both = [A, B]
const admin = { auth: A.admin.token }

const unique = () => randomBytes(5).toString('hex')
const seconds = () => Math.floor(Date.now() / 1000)
/** A provider access token for `claims`, issued `after` seconds from now (iat is in whole seconds). */
const token = (claims: Record<string, unknown>, after = 0) => {
  const at = seconds() + after
  return provider.sign({
    iss: provider.issuer,
    aud: provider.audience,
    iat: at,
    exp: at + 300,
    scope: API_SCOPES,
    ...claims,
  })
}
const me = (server: TestServer, auth: string) => server.request('GET', '/auth/me', { auth })

test('a trashed provider user: its tokens of before and after the delete are refused, its address held', async () => {
  const sub = `trash-${unique()}`
  const email = `${sub}@example.com`
  const claims = { sub, email, email_verified: true, name: 'Trash Person' }
  const before = token(claims)
  let id = 0
  for (const server of both) {
    const res = await me(server, before)
    assert.equal(res.status, 200, res.text)
    id = Number(res.body.user.id)
  }
  assert.equal((await A.request('DELETE', `/users/${id}`, admin)).status, 204)
  await B.deps.credentialChanges.caughtUp()
  const later = token(claims, 2)
  for (const server of both) {
    assertInvalidToken(await me(server, before), 'issued before the delete')
    assertInvalidToken(await me(server, later), 'issued after the delete')
  }
  // Another account of the provider with the same verified address makes no user of it.
  const other = token({ sub: `other-${unique()}`, email, email_verified: true, name: 'Other' }, 2)
  assertInvalidToken(await me(B, other), 'another account with the address')
  const [made] = await A.sql`SELECT count(*)::int AS n FROM users WHERE lower(email) = ${email}`
  assert.equal(made!.n, 1, 'only the trashed user has the address')

  // Back from the trash: a token issued after the restore works on both; the old ones stay refused.
  assert.equal((await B.request('POST', `/users/${id}/restore`, admin)).status, 200)
  await A.deps.credentialChanges.caughtUp()
  const fresh = token(claims, 3)
  for (const server of both) {
    const res = await me(server, fresh)
    assert.equal(res.status, 200, res.text)
    assert.equal(Number(res.body.user.id), id)
    assertInvalidToken(await me(server, before), 'issued before the delete, after the restore')
  }
})
