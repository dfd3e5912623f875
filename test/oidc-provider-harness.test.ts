import assert from 'node:assert/strict'
import { constants, createHmac, createPublicKey, verify, type JsonWebKey } from 'node:crypto'
import { after, before, test } from 'node:test'
import { SIGNING_ALGS, startTestProvider, type TestProvider } from './helpers/oidc-provider.js'

// The harness of the real OpenID provider (test/helpers/oidc-provider.ts):
// what the OIDC tests rely on, checked with nothing but node:crypto and fetch.

let provider: TestProvider
before(async () => {
  provider = await startTestProvider()
})
after(() => provider.close())

type Jwk = Record<string, unknown>

function decode(jwt: string): { header: Jwk; payload: Jwk } {
  const [header = '', payload = ''] = jwt.split('.')
  return {
    header: JSON.parse(Buffer.from(header, 'base64url').toString()),
    payload: JSON.parse(Buffer.from(payload, 'base64url').toString()),
  }
}

/** Whether `jwt` verifies with the key of its header's kid in `jwks`, by its header's alg. */
function verifies(jwt: string, jwks: { keys: Jwk[] }): boolean {
  const [header = '', payload = '', signature = ''] = jwt.split('.')
  const { alg, kid } = decode(jwt).header
  const jwk = jwks.keys.find((k) => k.kid === kid)
  assert.ok(jwk, `kid ${String(kid)} is in the JWKS`)
  assert.equal(jwk.alg, alg)
  const key = createPublicKey({ key: jwk as JsonWebKey, format: 'jwk' })
  const data = Buffer.from(`${header}.${payload}`)
  const bytes = Buffer.from(signature, 'base64url')
  switch (alg) {
    case 'RS256':
      return verify('sha256', data, key, bytes)
    case 'PS256':
      return verify('sha256', data, { key, padding: constants.RSA_PKCS1_PSS_PADDING, saltLength: 32 }, bytes)
    case 'ES256':
      return verify('sha256', data, { key, dsaEncoding: 'ieee-p1363' }, bytes)
    case 'EdDSA':
      return verify(null, data, key, bytes)
    default:
      throw new Error(`unexpected alg ${String(alg)}`)
  }
}

async function servedJwks(): Promise<{ keys: Jwk[] }> {
  const discovery = (await (await fetch(`${provider.issuer}/.well-known/openid-configuration`)).json()) as {
    jwks_uri: string
  }
  return (await (await fetch(discovery.jwks_uri)).json()) as { keys: Jwk[] }
}

function assertAccessToken(jwt: string, jwks: { keys: Jwk[] }): Jwk {
  const { payload } = decode(jwt)
  assert.equal(payload.iss, provider.issuer)
  assert.ok([payload.aud].flat().includes(provider.audience), `aud ${JSON.stringify(payload.aud)}`)
  assert.ok(verifies(jwt, jwks), 'the signature verifies with the published key')
  return payload
}

test(
  'the discovery document is served over HTTPS that Node trusts through NODE_EXTRA_CA_CERTS, and fetches are ' +
    'counted',
  async () => {
    assert.match(provider.issuer, /^https:\/\/127\.0\.0\.1:\d+$/)
    const before = { discovery: provider.discoveryFetches, jwks: provider.jwksFetches }
    const response = await fetch(`${provider.issuer}/.well-known/openid-configuration`)
    assert.equal(response.status, 200)
    const discovery = (await response.json()) as { issuer: string; jwks_uri: string }
    assert.equal(discovery.issuer, provider.issuer)
    assert.equal(discovery.jwks_uri, `${provider.issuer}/jwks`)
    const jwks = await (await fetch(discovery.jwks_uri)).json()
    assert.deepEqual(jwks, provider.publicJwks())
    assert.deepEqual([...new Set(provider.publicJwks().keys.map((k) => k.alg))], [...SIGNING_ALGS])
    assert.ok(provider.publicJwks().keys.every((k) => k.d === undefined))
    assert.deepEqual(
      { discovery: provider.discoveryFetches, jwks: provider.jwksFetches },
      { discovery: before.discovery + 1, jwks: before.jwks + 1 },
    )
  },
)

test(
  'client_credentials gives a JWT access token for the audience, with the claims and scope asked for, in every ' +
    'alg',
  async () => {
    const jwks = await servedJwks()
    const claims = { email: 'cc@example.test', email_verified: true, name: 'Zoë Ångström', roles: ['admin'] }
    const token = await provider.clientCredentialsToken({ claims, scope: 'users:read products:read not:ours' })
    const { header } = decode(token)
    assert.equal(header.alg, 'RS256')
    assert.equal(header.typ, 'at+jwt')
    const payload = assertAccessToken(token, jwks)
    assert.equal(payload.scope, 'users:read products:read')
    assert.equal(payload.sub, 'test-service')
    assert.deepEqual(
      { email: payload.email, email_verified: payload.email_verified, name: payload.name, roles: payload.roles },
      claims,
    )

    assert.equal(
      assertAccessToken(await provider.clientCredentialsToken({ claims: { sub: 'someone' } }), jwks).sub,
      'someone',
    )
    for (const alg of SIGNING_ALGS) {
      const other = await provider.clientCredentialsToken({ alg })
      assert.equal(decode(other).header.alg, alg)
      assertAccessToken(other, jwks)
    }
  },
)

test(
  "authorization code with PKCE, login and consent driven over HTTP, gives a JWT access token with the account's " +
    'claims',
  async () => {
    const jwks = await servedJwks()
    provider.setAccount('alice', {
      email: 'alice@example.test',
      email_verified: true,
      name: 'Alice',
      realm_access: { roles: ['admin'] },
    })
    const token = await provider.authorizationCodeToken('alice', { scope: 'users:read users:write' })
    assert.equal(decode(token).header.alg, 'RS256')
    const payload = assertAccessToken(token, jwks)
    assert.equal(payload.sub, 'alice')
    assert.equal(payload.client_id, 'test-app')
    assert.equal(payload.scope, 'users:read users:write')
    assert.equal(payload.email, 'alice@example.test')
    assert.deepEqual(payload.realm_access, { roles: ['admin'] })
  },
)

test('sign forges tokens with the keys the provider publishes', async () => {
  const jwks = await servedJwks()
  for (const alg of SIGNING_ALGS) assert.ok(verifies(provider.sign({ iss: provider.issuer }, { alg }), jwks), alg)
  assert.equal(decode(provider.sign({}, { kid: null })).header.kid, undefined)
  assert.equal(decode(provider.sign({}, { kid: 'unknown', header: { typ: 'JWT' } })).header.kid, 'unknown')
  assert.equal(decode(provider.sign({}, { header: { typ: 'JWT' } })).header.typ, 'JWT')
  assert.equal(provider.sign({}, { alg: 'none' }).split('.')[2], '')

  const rsa = provider.publicJwks().keys.find((k) => k.alg === 'RS256')!
  const mismatched = decode(provider.sign({}, { alg: 'ES256', kid: rsa.kid as string })).header
  assert.deepEqual([mismatched.alg, mismatched.kid], ['ES256', rsa.kid])
  // Alg confusion: HS256 keyed with the PEM of the published RSA key.
  const confused = provider.sign({ sub: 'x' }, { alg: 'HS256' })
  const [h, p, mac] = confused.split('.')
  const secret = createPublicKey({ key: rsa as JsonWebKey, format: 'jwk' }).export({ format: 'pem', type: 'spki' })
  assert.equal(createHmac('sha256', secret).update(`${h}.${p}`).digest('base64url'), mac)
  assert.equal(decode(confused).header.kid, rsa.kid)
})

test('a rotation publishes a new kid that signs from then on; dropOld withdraws the old ones', async () => {
  const old = provider.publicJwks().keys.map((k) => k.kid)
  await provider.rotateKeys()
  let served = await servedJwks()
  const fresh = served.keys.map((k) => k.kid).filter((kid) => !old.includes(kid))
  assert.equal(fresh.length, SIGNING_ALGS.length)
  assert.ok(
    old.every((kid) => served.keys.some((k) => k.kid === kid)),
    'the old keys stay published',
  )
  const token = await provider.clientCredentialsToken()
  assert.ok(fresh.includes(decode(token).header.kid as string), 'the new key signs')
  assertAccessToken(token, served)

  await provider.rotateKeys({ algs: ['RS256'], dropOld: true })
  served = await servedJwks()
  assert.equal(served.keys.filter((k) => k.alg === 'RS256').length, 1)
  assert.equal(served.keys.filter((k) => k.alg === 'ES256').length, 2)
  assertAccessToken(await provider.authorizationCodeToken('alice'), served)
})

test('stop makes the provider unreachable; start serves again on the same port', async () => {
  const discovery = `${provider.issuer}/.well-known/openid-configuration`
  await provider.stop()
  await assert.rejects(fetch(discovery))
  await provider.start()
  assert.equal((await fetch(discovery)).status, 200)
})
