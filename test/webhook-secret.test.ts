import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { Webhook } from 'standardwebhooks'
import { retryDelayMs } from '../src/core/lib/retry-schedule.js'
import { newSigningSecret, signatureHeader, signatureOf } from '../src/core/http/standard-webhooks.js'
import { openSecret, SealingKeyMissing, sealSecret } from '../src/webhooks/secret.js'

// The pure parts of webhooks: sealing the signing secret, the Standard
// Webhooks signature (held to the standardwebhooks package), the retry schedule.

const keyA = { kid: 'a', secret: Buffer.from('the first jwt secret, at least 32 bytes long') }
const keyB = { kid: 'b', secret: Buffer.from('the second jwt secret, at least 32 bytes long') }

describe('signing secret sealing', () => {
  test('a new secret is whsec_ and the base64 of 32 random bytes', () => {
    const a = newSigningSecret()
    assert.match(a, /^whsec_[A-Za-z0-9+/]{43}=$/)
    assert.equal(Buffer.from(a.slice(6), 'base64').length, 32)
    assert.notEqual(a, newSigningSecret())
  })

  test('opens what it sealed, under the kid that sealed it, and seals differently each time', () => {
    const secret = newSigningSecret()
    const sealed = sealSecret(secret, [keyA, keyB])
    assert.match(sealed, /^v1\.a\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/)
    assert.ok(
      !sealed.includes(secret.slice(6)) &&
        !sealed.includes(Buffer.from(secret.slice(6), 'base64').toString('base64url')),
    )
    assert.notEqual(sealSecret(secret, [keyA]), sealed, 'a fresh IV each time')
    assert.equal(openSecret(sealed, [keyA]), secret)
    // After the JWT secrets rotate (b signs now, a still verifies), the secret still opens.
    assert.equal(openSecret(sealed, [keyB, keyA]), secret)
  })

  test('fails clearly when the kid is gone, and refuses a tampered or relabelled text', () => {
    const sealed = sealSecret(newSigningSecret(), [keyA])
    assert.throws(
      () => openSecret(sealed, [keyB]),
      (err: unknown) =>
        err instanceof SealingKeyMissing &&
        err.kid === 'a' &&
        /kid "a", which is no longer configured/.test(err.message),
    )
    const parts = sealed.split('.')
    const flipped = Buffer.from(parts[3]!, 'base64url')
    flipped[0]! ^= 1
    assert.throws(() => openSecret([...parts.slice(0, 3), flipped.toString('base64url'), parts[4]].join('.'), [keyA]))
    // The same key under another kid: the kid is authenticated data, so the tag fails.
    assert.throws(() => openSecret(['v1', 'b', ...parts.slice(2)].join('.'), [keyA, { kid: 'b', secret: keyA.secret }]))
    assert.throws(() => openSecret('v2.a.x.y.z', [keyA]), /not a sealed text/)
    assert.throws(() => openSecret('whsec_plain', [keyA]), /not a sealed text/)
  })
})

describe('Standard Webhooks signature', () => {
  const body = '{"id":7,"type":"product.created","data":{"name":"Ünïcode ✓"}}'

  test('matches the standardwebhooks package, byte for byte', () => {
    for (let i = 0; i < 20; i++) {
      const secret = newSigningSecret()
      const at = new Date(Date.UTC(2026, 10, 24, 12, 0, i))
      assert.equal(
        signatureOf(secret, `${i}`, Math.floor(at.getTime() / 1000), body),
        new Webhook(secret).sign(`${i}`, at, body),
      )
    }
  })

  test('a header with two signatures verifies with either secret, and with neither other', () => {
    const [current, previous, other] = [newSigningSecret(), newSigningSecret(), newSigningSecret()]
    const timestamp = Math.floor(Date.now() / 1000)
    const headers = {
      'webhook-id': '42',
      'webhook-timestamp': String(timestamp),
      'webhook-signature': signatureHeader([current, previous], '42', timestamp, body),
    }
    assert.equal(headers['webhook-signature'].split(' ').length, 2)
    assert.deepEqual(new Webhook(current).verify(body, headers), JSON.parse(body))
    assert.deepEqual(new Webhook(previous).verify(body, headers), JSON.parse(body))
    assert.throws(() => new Webhook(other).verify(body, headers), /signature/i)
    assert.throws(() => new Webhook(current).verify(body.replace('7', '8'), headers), /signature/i)
    assert.throws(() => new Webhook(current).verify(body, { ...headers, 'webhook-id': '43' }), /signature/i)
  })
})

describe('retry schedule', () => {
  const schedule = { delaysMs: [5000, 300_000, 1_800_000], jitter: 0.2 }

  test('follows the schedule, scaled by the jitter factor, and ends after its last entry', () => {
    assert.equal(
      retryDelayMs(schedule, 1, () => 0.5),
      5000,
    )
    assert.equal(
      retryDelayMs(schedule, 1, () => 0),
      4000,
    )
    assert.equal(
      retryDelayMs(schedule, 1, () => 1),
      6000,
    )
    assert.equal(
      retryDelayMs(schedule, 3, () => 0.5),
      1_800_000,
    )
    assert.equal(
      retryDelayMs(schedule, 4, () => 0.5),
      undefined,
    )
    assert.equal(retryDelayMs({ delaysMs: [], jitter: 0 }, 1), undefined)
    for (let i = 0; i < 100; i++) {
      const d = retryDelayMs(schedule, 2)!
      assert.ok(d >= 240_000 && d <= 360_000, String(d))
    }
  })
})
