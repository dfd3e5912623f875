import assert from 'node:assert/strict'
import { createHmac } from 'node:crypto'
import { describe, test } from 'node:test'
import { jwtVerify, SignJWT } from 'jose'
import {
  InvalidTokenError,
  signJwt,
  verifyJwt,
  type JwtClaims,
  type SigningKey,
  type VerifyOptions,
} from '../src/auth/jwt.js'

// HS256 JWTs without a server: every token an attacker can build is refused
// with InvalidTokenError, for the reason we expect (so a token refused for the
// wrong reason, e.g. a forged signature that slipped past the algorithm check
// only to fail on a claim, does not pass unnoticed); leeway, key selection and
// rotation; the RFC 7515 example; and interoperability with `jose`.

const NOW = 1_800_000_000
const KEY: SigningKey = { kid: 'k1', secret: Buffer.from('unit-test-secret-that-is-at-least-32-bytes') }
const OTHER: SigningKey = { kid: 'k2', secret: Buffer.from('another-unit-test-secret-of-32-bytes-or-more') }
const OPTIONS: VerifyOptions = { keys: [KEY], issuer: 'test-issuer', audience: 'test-audience', now: NOW }

const claims = (over: Record<string, unknown> = {}): JwtClaims =>
  ({
    sub: '42',
    iss: 'test-issuer',
    aud: 'test-audience',
    iat: NOW,
    exp: NOW + 900,
    role: 'user',
    scope: 'products:read',
    sid: '7',
    gen: 0,
    ...over,
  }) as JwtClaims

const b64 = (value: unknown) =>
  Buffer.from(typeof value === 'string' ? value : JSON.stringify(value)).toString('base64url')
const hmac = (bits: 256 | 384 | 512, secret: Buffer, input: string) =>
  createHmac(`sha${bits}`, secret).update(input).digest('base64url')

/**
 * A token from any header and payload (objects are JSON-encoded, strings taken as they are), HMAC-signed unless
 * `signature` is given.
 */
function forge(
  header: unknown,
  payload: unknown,
  { secret = KEY.secret, bits = 256, signature }: { secret?: Buffer; bits?: 256 | 384 | 512; signature?: string } = {},
): string {
  const input = `${b64(header)}.${b64(payload)}`
  return `${input}.${signature ?? hmac(bits, secret, input)}`
}

const HS256 = { alg: 'HS256', typ: 'JWT', kid: KEY.kid }
const valid = signJwt(claims(), KEY)
const [validHeader, validPayload, validSignature] = valid.split('.') as [string, string, string]

/** A valid token whose signature contains `-` or `_` (about 98% of them do), to re-encode as `+` and `/`. */
function tokenWithUrlSafeChars(): string {
  for (let i = 0; ; i++) {
    const token = signJwt(claims({ iat: NOW - i }), KEY)
    if (/[-_]/.test(token.split('.')[2]!)) return token
  }
}

/** The same 32 bytes, another text: the last of 43 characters carries 4 bits of the MAC and 2 unused bits. */
function sameBytesOtherText(signature: string): string {
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
  const last = alphabet.indexOf(signature.at(-1)!)
  const changed = signature.slice(0, -1) + alphabet[last ^ 1]
  assert.notEqual(changed, signature)
  assert.deepEqual(
    Buffer.from(changed, 'base64url'),
    Buffer.from(signature, 'base64url'),
    'precondition: decodes to the same bytes',
  )
  return changed
}

function assertRefused(token: string, reason: string, options: VerifyOptions = OPTIONS): void {
  assert.throws(
    () => verifyJwt(token, options),
    (err: unknown) => {
      assert.ok(err instanceof InvalidTokenError, `expected InvalidTokenError, got ${String(err)}`)
      assert.equal(err.message, reason)
      return true
    },
  )
}

describe('verifyJwt refuses every forged or broken token', () => {
  const padded = tokenWithUrlSafeChars()
  const [ph, pp, ps] = padded.split('.') as [string, string, string]
  const attacks: Array<{ name: string; token: string; reason: string; options?: VerifyOptions }> = [
    // The algorithm comes first (RFC 8725 §3.1): none in any spelling, with or without a signature.
    ...['none', 'None', 'NONE', 'nOnE'].flatMap((alg) => [
      {
        name: `alg ${alg} without a signature`,
        token: `${b64({ alg, typ: 'JWT' })}.${validPayload}.`,
        reason: 'not a JWS compact serialization',
      },
      {
        name: `alg ${alg} with a valid HS256 signature`,
        token: forge({ alg, typ: 'JWT' }, claims()),
        reason: 'algorithm not accepted',
      },
      {
        name: `alg ${alg} with a kid and an HS256 signature`,
        token: forge({ alg, kid: KEY.kid }, claims()),
        reason: 'algorithm not accepted',
      },
    ]),
    { name: 'alg missing', token: forge({ typ: 'JWT', kid: KEY.kid }, claims()), reason: 'algorithm not accepted' },
    {
      name: 'alg as an array',
      token: forge({ alg: ['HS256'], kid: KEY.kid }, claims()),
      reason: 'algorithm not accepted',
    },
    {
      name: 'alg hs256 (lower case)',
      token: forge({ alg: 'hs256', kid: KEY.kid }, claims()),
      reason: 'algorithm not accepted',
    },
    // Other HMACs, signed correctly with the right key at their own size.
    {
      name: 'HS384 header, HMAC-SHA384 signature',
      token: forge({ ...HS256, alg: 'HS384' }, claims(), { bits: 384 }),
      reason: 'algorithm not accepted',
    },
    {
      name: 'HS512 header, HMAC-SHA512 signature',
      token: forge({ ...HS256, alg: 'HS512' }, claims(), { bits: 512 }),
      reason: 'algorithm not accepted',
    },
    {
      name: 'HS384 header, HMAC-SHA256 signature',
      token: forge({ ...HS256, alg: 'HS384' }, claims()),
      reason: 'algorithm not accepted',
    },
    {
      name: 'HS512 header, HMAC-SHA256 signature',
      token: forge({ ...HS256, alg: 'HS512' }, claims()),
      reason: 'algorithm not accepted',
    },
    // The RS256/HS256 confusion: a public-key algorithm with an HMAC made with the shared secret.
    {
      name: 'RS256 header, HMAC-SHA256 signature',
      token: forge({ ...HS256, alg: 'RS256' }, claims()),
      reason: 'algorithm not accepted',
    },
    {
      name: 'ES256 header, HMAC-SHA256 signature',
      token: forge({ ...HS256, alg: 'ES256' }, claims()),
      reason: 'algorithm not accepted',
    },
    // The signature: stripped, re-encoded, made with another key, or kept while the payload changed.
    {
      name: 'signature stripped (trailing dot)',
      token: `${validHeader}.${validPayload}.`,
      reason: 'not a JWS compact serialization',
    },
    {
      name: 'signature stripped (two segments)',
      token: `${validHeader}.${validPayload}`,
      reason: 'not a JWS compact serialization',
    },
    { name: 'signature with = padding', token: `${valid}=`, reason: 'not a JWS compact serialization' },
    {
      name: 'signature in base64 (+ and /) instead of base64url',
      token: `${ph}.${pp}.${ps.replaceAll('-', '+').replaceAll('_', '/')}`,
      reason: 'not a JWS compact serialization',
    },
    {
      name: 'signature with another last character that decodes to the same bytes',
      token: `${validHeader}.${validPayload}.${sameBytesOtherText(validSignature)}`,
      reason: 'bad signature',
    },
    {
      name: 'signature of another token',
      token: `${validHeader}.${validPayload}.${signJwt(claims({ sub: '43' }), KEY).split('.')[2]}`,
      reason: 'bad signature',
    },
    {
      name: 'signed with another key under our kid',
      token: forge(HS256, claims(), { secret: OTHER.secret }),
      reason: 'bad signature',
    },
    {
      name: 'signed with an empty key',
      token: forge(HS256, claims(), { secret: Buffer.alloc(0) }),
      reason: 'bad signature',
    },
    {
      name: 'signed with an empty key, no kid',
      token: forge({ alg: 'HS256', typ: 'JWT' }, claims(), { secret: Buffer.alloc(0) }),
      reason: 'bad signature',
    },
    {
      name: 'a key embedded in the header (jwk) is not trusted',
      token: forge({ ...HS256, jwk: { kty: 'oct', k: b64('attacker') } }, claims(), {
        secret: Buffer.from('attacker'),
      }),
      reason: 'bad signature',
    },
    {
      name: 'a key URL in the header (jku) is not followed',
      token: forge({ ...HS256, jku: 'https://attacker.example/jwks.json' }, claims(), { secret: OTHER.secret }),
      reason: 'bad signature',
    },
    {
      name: 'payload edited (role admin), old signature kept',
      token: `${validHeader}.${b64(claims({ role: 'admin' }))}.${validSignature}`,
      reason: 'bad signature',
    },
    {
      name: 'payload edited (sub), old signature kept',
      token: `${validHeader}.${b64(claims({ sub: '1' }))}.${validSignature}`,
      reason: 'bad signature',
    },
    {
      name: 'header edited (kid removed), old signature kept',
      token: `${b64({ alg: 'HS256', typ: 'JWT' })}.${validPayload}.${validSignature}`,
      reason: 'bad signature',
    },
    {
      name: 'valid token, but no key configured',
      token: valid,
      reason: 'unknown kid',
      options: { ...OPTIONS, keys: [] },
    },
    {
      name: 'valid token without kid, but no key configured',
      token: forge({ alg: 'HS256' }, claims()),
      reason: 'bad signature',
      options: { ...OPTIONS, keys: [] },
    },
    // kid only ever selects among configured keys.
    { name: 'unknown kid', token: forge({ ...HS256, kid: 'k9' }, claims()), reason: 'unknown kid' },
    { name: 'kid with a path', token: forge({ ...HS256, kid: '../../etc/passwd' }, claims()), reason: 'unknown kid' },
    { name: 'kid with SQL', token: forge({ ...HS256, kid: "' OR 1=1 --" }, claims()), reason: 'unknown kid' },
    { name: 'kid as a number', token: forge({ ...HS256, kid: 1 }, claims()), reason: 'unknown kid' },
    { name: 'kid null', token: forge({ ...HS256, kid: null }, claims()), reason: 'unknown kid' },
    { name: 'kid empty', token: forge({ ...HS256, kid: '' }, claims()), reason: 'unknown kid' },
    {
      name: 'kid of another key, signed with ours',
      token: forge({ ...HS256, kid: OTHER.kid }, claims()),
      reason: 'bad signature',
      options: { ...OPTIONS, keys: [KEY, OTHER] },
    },
    // Header members we do not understand.
    {
      name: 'unknown crit extension',
      token: forge({ ...HS256, crit: ['exp'], exp: NOW + 60 }, claims()),
      reason: 'critical extension',
    },
    { name: 'empty crit', token: forge({ ...HS256, crit: [] }, claims()), reason: 'critical extension' },
    { name: 'typ other than JWT', token: forge({ ...HS256, typ: 'at+jwt' }, claims()), reason: 'unexpected typ' },
    // Claims, checked only after the signature.
    {
      name: 'expired (beyond the 30 s leeway)',
      token: signJwt(claims({ exp: NOW - 31, iat: NOW - 931 }), KEY),
      reason: 'expired',
    },
    {
      name: 'expired long ago',
      token: signJwt(claims({ exp: NOW - 86_400, iat: NOW - 90_000 }), KEY),
      reason: 'expired',
    },
    { name: 'exp missing', token: forge(HS256, { ...claims(), exp: undefined }), reason: 'exp missing' },
    { name: 'exp as a string', token: forge(HS256, claims({ exp: String(NOW + 900) })), reason: 'exp missing' },
    { name: 'exp null', token: forge(HS256, claims({ exp: null })), reason: 'exp missing' },
    {
      name: 'exp as a huge number (Infinity after parsing)',
      token: forge(HS256, `{"sub":"42","exp":1e999}`),
      reason: 'exp missing',
    },
    {
      name: 'nbf in the future (beyond leeway)',
      token: signJwt(claims({ nbf: NOW + 31 }), KEY),
      reason: 'not yet valid',
    },
    { name: 'nbf as a string', token: signJwt(claims({ nbf: String(NOW) }), KEY), reason: 'not yet valid' },
    {
      name: 'iat in the future (beyond leeway)',
      token: signJwt(claims({ iat: NOW + 31 }), KEY),
      reason: 'issued in the future',
    },
    { name: 'iat as a string', token: signJwt(claims({ iat: String(NOW) }), KEY), reason: 'issued in the future' },
    { name: 'wrong iss', token: signJwt(claims({ iss: 'someone-else' }), KEY), reason: 'wrong issuer' },
    { name: 'iss missing', token: forge(HS256, { ...claims(), iss: undefined }), reason: 'wrong issuer' },
    { name: 'wrong aud', token: signJwt(claims({ aud: 'another-service' }), KEY), reason: 'wrong audience' },
    {
      name: 'aud array without ours',
      token: signJwt(claims({ aud: ['another-service', 'third'] }), KEY),
      reason: 'wrong audience',
    },
    { name: 'aud missing', token: forge(HS256, { ...claims(), aud: undefined }), reason: 'wrong audience' },
    { name: 'sub not a user id', token: signJwt(claims({ sub: 'admin' }), KEY), reason: 'bad subject' },
    { name: 'sub as a number', token: signJwt(claims({ sub: 42 }), KEY), reason: 'bad subject' },
    { name: 'sub 0', token: signJwt(claims({ sub: '0' }), KEY), reason: 'bad subject' },
    { name: 'role missing', token: forge(HS256, { ...claims(), role: undefined }), reason: 'missing role or scope' },
    {
      name: 'scope as an array',
      token: signJwt(claims({ scope: ['products:read'] }), KEY),
      reason: 'missing role or scope',
    },
    // Without a session and an epoch a token could not be revoked: refused.
    { name: 'sid missing', token: forge(HS256, { ...claims(), sid: undefined }), reason: 'bad session' },
    { name: 'sid as a number', token: signJwt(claims({ sid: 7 }), KEY), reason: 'bad session' },
    { name: 'sid not an id', token: signJwt(claims({ sid: '0' }), KEY), reason: 'bad session' },
    { name: 'gen missing', token: forge(HS256, { ...claims(), gen: undefined }), reason: 'bad epoch' },
    { name: 'gen negative', token: signJwt(claims({ gen: -1 }), KEY), reason: 'bad epoch' },
    { name: 'gen fractional', token: signJwt(claims({ gen: 0.5 }), KEY), reason: 'bad epoch' },
    { name: 'gen as a string', token: signJwt(claims({ gen: '0' }), KEY), reason: 'bad epoch' },
    // Shape.
    { name: 'four segments', token: `${valid}.${validSignature}`, reason: 'not a JWS compact serialization' },
    { name: 'one segment', token: validPayload, reason: 'not a JWS compact serialization' },
    { name: 'empty string', token: '', reason: 'not a JWS compact serialization' },
    {
      name: 'non-base64url characters in the header',
      token: `${validHeader}*.${validPayload}.${validSignature}`,
      reason: 'not a JWS compact serialization',
    },
    {
      name: 'non-base64url characters in the payload',
      token: `${validHeader}.${validPayload}!.${validSignature}`,
      reason: 'not a JWS compact serialization',
    },
    {
      name: 'white space inside',
      token: `${validHeader}.${validPayload} .${validSignature}`,
      reason: 'not a JWS compact serialization',
    },
    {
      name: 'header not JSON (correctly signed)',
      token: forge('not json', claims()),
      reason: 'segment is not a JSON object',
    },
    { name: 'header a JSON string', token: forge('"HS256"', claims()), reason: 'segment is not a JSON object' },
    { name: 'header null', token: forge('null', claims()), reason: 'segment is not a JSON object' },
    {
      name: 'payload an array (correctly signed)',
      token: forge(HS256, [claims()]),
      reason: 'segment is not a JSON object',
    },
    {
      name: 'payload not JSON (correctly signed)',
      token: forge(HS256, '{"sub":"42",'),
      reason: 'segment is not a JSON object',
    },
    { name: 'a 5000-character token', token: forge(HS256, claims({ pad: 'x'.repeat(3600) })), reason: 'too long' },
  ]

  for (const { name, token, reason, options } of attacks) {
    test(`refuses ${name} (${reason})`, () => assertRefused(token, reason, options))
  }

  test('the 5000-character token is that long, and the same claims without padding verify', () => {
    const long = attacks.find((a) => a.name === 'a 5000-character token')!.token
    assert.ok(long.length >= 5000, `length ${long.length}`)
    assert.equal(verifyJwt(forge(HS256, claims()), OPTIONS).sub, '42')
  })

  test(
    'the forged tokens differ from valid ones only in what they attack: a correctly signed HS256 twin ' + 'verifies',
    () => {
      // Guards the table: `forge` makes good tokens when nothing is wrong.
      assert.equal(verifyJwt(forge(HS256, claims()), OPTIONS).sub, '42')
      assert.equal(verifyJwt(forge({ alg: 'HS256' }, claims()), OPTIONS).sub, '42')
      assert.equal(verifyJwt(padded, OPTIONS).sub, '42')
    },
  )
})

describe('verifyJwt accepts what it should', () => {
  test('a token from signJwt verifies and returns its claims', () => {
    assert.deepEqual(verifyJwt(valid, OPTIONS), claims())
  })

  test('signJwt writes the header {alg: HS256, typ: JWT, kid}', () => {
    assert.deepEqual(JSON.parse(Buffer.from(validHeader, 'base64url').toString()), {
      alg: 'HS256',
      typ: 'JWT',
      kid: 'k1',
    })
  })

  const leeway: Array<[string, Record<string, unknown>]> = [
    ['expired 29 s ago', { exp: NOW - 29, iat: NOW - 929 }],
    ['nbf 29 s ahead', { nbf: NOW + 29 }],
    ['iat 29 s ahead', { iat: NOW + 29 }],
    ['nbf now', { nbf: NOW }],
  ]
  for (const [name, over] of leeway) {
    test(`accepts a token ${name} (within the 30 s leeway)`, () => {
      assert.equal(verifyJwt(signJwt(claims(over), KEY), OPTIONS).sub, '42')
    })
  }

  test('the leeway is configurable: 0 s refuses what 30 s accepts', () => {
    const token = signJwt(claims({ exp: NOW - 1, iat: NOW - 901 }), KEY)
    assert.equal(verifyJwt(token, OPTIONS).sub, '42')
    assertRefused(token, 'expired', { ...OPTIONS, leewaySeconds: 0 })
  })

  test('aud may be an array that contains ours', () => {
    assert.equal(verifyJwt(signJwt(claims({ aud: ['other', 'test-audience'] }), KEY), OPTIONS).sub, '42')
  })

  test('kid selects among several keys', () => {
    const options = { ...OPTIONS, keys: [KEY, OTHER] }
    assert.equal(verifyJwt(signJwt(claims({ sub: '1' }), KEY), options).sub, '1')
    assert.equal(verifyJwt(signJwt(claims({ sub: '2' }), OTHER), options).sub, '2')
    // The kid is not a hint to try the others: a mismatch is refused.
    assertRefused(forge({ ...HS256, kid: KEY.kid }, claims(), { secret: OTHER.secret }), 'bad signature', options)
  })

  test('a token without kid verifies with any configured key', () => {
    const options = { ...OPTIONS, keys: [KEY, OTHER] }
    assert.equal(verifyJwt(forge({ alg: 'HS256', typ: 'JWT' }, claims(), { secret: KEY.secret }), options).sub, '42')
    assert.equal(verifyJwt(forge({ alg: 'HS256', typ: 'JWT' }, claims(), { secret: OTHER.secret }), options).sub, '42')
    assertRefused(
      forge({ alg: 'HS256' }, claims(), { secret: Buffer.from('a third secret nobody configured!!') }),
      'bad signature',
      options,
    )
  })

  test('rotation: the new key signs, tokens of the old key verify until it is dropped', () => {
    const NEW: SigningKey = { kid: 'k-new', secret: Buffer.from('the-new-signing-secret-of-32-bytes-or-more') }
    const oldToken = signJwt(claims({ sub: '7' }), KEY)
    const rotated = { ...OPTIONS, keys: [NEW, KEY] }
    const newToken = signJwt(claims({ sub: '8' }), rotated.keys[0]!)
    assert.equal(JSON.parse(Buffer.from(newToken.split('.')[0]!, 'base64url').toString()).kid, 'k-new')
    assert.equal(verifyJwt(oldToken, rotated).sub, '7')
    assert.equal(verifyJwt(newToken, rotated).sub, '8')
    // The old key dropped: its tokens are refused, the new ones still verify.
    assertRefused(oldToken, 'unknown kid', { ...OPTIONS, keys: [NEW] })
    assert.equal(verifyJwt(newToken, { ...OPTIONS, keys: [NEW] }).sub, '8')
    // Before the new key is configured anywhere, its tokens are refused.
    assertRefused(newToken, 'unknown kid')
  })
})

describe('interoperability', () => {
  // RFC 7515 appendix A.1: header {"typ":"JWT",\r\n "alg":"HS256"}, key from the JWK's k value.
  const RFC_TOKEN =
    'eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9' +
    '.eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ' +
    '.dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk'
  const RFC_KEY: SigningKey = {
    kid: 'rfc7515',
    secret: Buffer.from(
      'AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-EstJQLr_T-1qS0gZH75aKtMN3Yj0iPS4hcgUuTwjAzZr1Z9CAow',
      'base64url',
    ),
  }

  test('the RFC 7515 A.1 token passes the signature check and is refused only as expired', () => {
    assert.equal(Buffer.from(RFC_TOKEN.split('.')[0]!, 'base64url').toString(), '{"typ":"JWT",\r\n "alg":"HS256"}')
    // 'expired' is decided after the signature: the MAC over the exact bytes matched.
    assertRefused(RFC_TOKEN, 'expired', { ...OPTIONS, keys: [RFC_KEY], now: Date.now() / 1000 })
    // Before its exp it gets further still, to the claims it lacks for us.
    assertRefused(RFC_TOKEN, 'wrong audience', { ...OPTIONS, keys: [RFC_KEY], issuer: 'joe', now: 1300819380 - 60 })
    // With another key, the same token fails at the signature.
    assertRefused(RFC_TOKEN, 'bad signature', { ...OPTIONS, now: Date.now() / 1000 })
  })

  test('a token minted by jose (HS256, kid, iss, aud, sub, exp, role, scope, sid, gen) verifies', async () => {
    const token = await new SignJWT({ role: 'admin', scope: 'users:read products:read', sid: '99', gen: 3 })
      .setProtectedHeader({ alg: 'HS256', kid: KEY.kid })
      .setIssuer('test-issuer')
      .setAudience('test-audience')
      .setSubject('1234')
      .setIssuedAt(NOW)
      .setExpirationTime(NOW + 600)
      .sign(new Uint8Array(KEY.secret))
    const verified = verifyJwt(token, OPTIONS)
    assert.deepEqual(verified, {
      role: 'admin',
      scope: 'users:read products:read',
      sid: '99',
      gen: 3,
      iss: 'test-issuer',
      aud: 'test-audience',
      sub: '1234',
      iat: NOW,
      exp: NOW + 600,
    })
  })

  test('a token minted by jose with another key is refused', async () => {
    const token = await new SignJWT({ role: 'admin', scope: '' })
      .setProtectedHeader({ alg: 'HS256', kid: KEY.kid })
      .setIssuer('test-issuer')
      .setAudience('test-audience')
      .setSubject('1')
      .setExpirationTime(NOW + 600)
      .sign(new Uint8Array(OTHER.secret))
    assertRefused(token, 'bad signature')
  })

  test('a token signed by signJwt verifies with jose.jwtVerify', async () => {
    const { payload, protectedHeader } = await jwtVerify(valid, new Uint8Array(KEY.secret), {
      algorithms: ['HS256'],
      issuer: 'test-issuer',
      audience: 'test-audience',
      currentDate: new Date(NOW * 1000),
    })
    assert.deepEqual(protectedHeader, { alg: 'HS256', typ: 'JWT', kid: 'k1' })
    assert.deepEqual(payload, claims())
  })
})
