import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { startServer, type TestResponse, type TestServer } from './helpers/server.js'

// CORS: off unless CORS_ORIGINS lists origins. A listed origin gets
// Access-Control-Allow-Origin echoed (preflights also the methods, request
// headers and max age; other answers the exposed headers); any other origin
// gets no Access-Control-* field at all; `Vary: Origin` is on every answer
// while CORS is on; Access-Control-Allow-Credentials is never sent (the API
// takes credentials in headers, not cookies).

const APP = 'https://app.example.com'
const cors = await startServer({ CORS_ORIGINS: APP })
const anyOrigin = await startServer({ CORS_ORIGINS: '*' })
const off = await startServer()

// ---------------------------------------------------------------------------
// Helpers

/** A comma-separated field as a lower-case list. */
const list = (res: TestResponse, name: string) =>
  (res.headers.get(name) ?? '')
    .split(',')
    .map((s) => s.trim().toLowerCase())
    .filter(Boolean)

const accessControlFields = (res: TestResponse) =>
  [...res.headers.keys()].filter((name) => name.startsWith('access-control-'))

function assertVaryOrigin(res: TestResponse): void {
  assert.ok(list(res, 'vary').includes('origin'), `Vary: Origin on a ${res.status}, got ${res.headers.get('vary')}`)
}

function assertNoCredentialsField(res: TestResponse): void {
  assert.equal(
    res.headers.get('access-control-allow-credentials'),
    null,
    'Access-Control-Allow-Credentials is never sent',
  )
}

const preflight = (
  server: TestServer,
  path: string,
  origin: string,
  method = 'POST',
  requestHeaders = 'authorization, content-type, idempotency-key',
) =>
  server.request('OPTIONS', path, {
    auth: null,
    headers: { origin, 'access-control-request-method': method, 'access-control-request-headers': requestHeaders },
  })

const REQUEST_HEADERS = [
  'authorization',
  'content-type',
  'if-match',
  'idempotency-key',
  'if-none-match',
  'x-api-key',
  'x-request-id',
]
const EXPOSED_HEADERS = [
  'etag',
  'link',
  'location',
  'x-total-count',
  'x-request-id',
  'retry-after',
  'idempotent-replayed',
  'ratelimit-limit',
  'ratelimit-remaining',
  'ratelimit-reset',
]

// ---------------------------------------------------------------------------
// A listed origin

describe('CORS_ORIGINS lists the origin', () => {
  const preflights: Array<[path: string, methods: string[]]> = [
    ['/users', ['GET', 'HEAD', 'POST', 'OPTIONS']],
    ['/users/1', ['GET', 'HEAD', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']],
    ['/products/7', ['GET', 'HEAD', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']],
    ['/api-keys', ['GET', 'HEAD', 'POST', 'OPTIONS']],
  ]
  for (const [path, methods] of preflights) {
    test(
      `a preflight for ${path} (anonymous) is 204 with the origin echoed, its methods, the request headers and a ` +
        `max age`,
      async () => {
        const res = await preflight(cors, path, APP)
        assert.equal(res.status, 204, res.text)
        assert.equal(res.text, '')
        assert.equal(res.headers.get('access-control-allow-origin'), APP)
        assert.deepEqual(list(res, 'access-control-allow-methods').sort(), methods.map((m) => m.toLowerCase()).sort())
        const allowed = list(res, 'access-control-allow-headers')
        for (const header of REQUEST_HEADERS)
          assert.ok(allowed.includes(header), `Access-Control-Allow-Headers includes ${header}: ${allowed.join(', ')}`)
        const maxAge = res.headers.get('access-control-max-age')
        assert.match(maxAge ?? '', /^[1-9][0-9]*$/, 'a positive Access-Control-Max-Age')
        assertVaryOrigin(res)
        assertNoCredentialsField(res)
      },
    )
  }

  test('a preflight is not rate limited and not authenticated: a bad credential on OPTIONS is still 204', async () => {
    const res = await cors.request('OPTIONS', '/users', {
      auth: 'garbage',
      headers: { origin: APP, 'access-control-request-method': 'GET' },
    })
    assert.equal(res.status, 204)
    assert.equal(res.headers.get('access-control-allow-origin'), APP)
  })

  test(
    'a GET from the origin gets Access-Control-Allow-Origin and Expose-Headers naming the fields a client ' + 'reads',
    async () => {
      const res = await cors.request('GET', '/users', { headers: { origin: APP } })
      assert.equal(res.status, 200, res.text)
      assert.equal(res.headers.get('access-control-allow-origin'), APP)
      const exposed = list(res, 'access-control-expose-headers')
      for (const header of EXPOSED_HEADERS)
        assert.ok(exposed.includes(header), `Access-Control-Expose-Headers includes ${header}: ${exposed.join(', ')}`)
      assert.equal(
        res.headers.get('access-control-allow-methods'),
        null,
        'preflight-only fields stay off simple answers',
      )
      assert.equal(res.headers.get('access-control-max-age'), null)
      assertVaryOrigin(res)
      assertNoCredentialsField(res)
    },
  )

  test('a POST from the origin: 201 with Location readable (exposed) by the page', async () => {
    const res = await cors.request('POST', '/products', {
      headers: { origin: APP },
      body: { sku: `CORS-${Date.now()}`, name: 'Cors', price: 100, currency: 'EUR' },
    })
    assert.equal(res.status, 201, res.text)
    assert.equal(res.headers.get('access-control-allow-origin'), APP)
    assert.ok(res.headers.get('location'))
    assert.ok(list(res, 'access-control-expose-headers').includes('location'))
  })

  // A page must be able to read an error too, or all it sees is a network failure.
  const errors: Array<[name: string, send: () => Promise<TestResponse>, status: number]> = [
    ['401 without a credential', () => cors.request('GET', '/users', { auth: null, headers: { origin: APP } }), 401],
    ['405 for an unsupported method', () => cors.request('DELETE', '/users', { headers: { origin: APP } }), 405],
    ['422 for an invalid body', () => cors.request('POST', '/users', { headers: { origin: APP }, body: {} }), 422],
    ['404 for a missing resource', () => cors.request('GET', '/users/999999999', { headers: { origin: APP } }), 404],
  ]
  for (const [name, send, status] of errors) {
    test(`an error answer (${name}) carries the CORS fields`, async () => {
      const res = await send()
      assert.equal(res.status, status, res.text)
      assert.equal(res.headers.get('access-control-allow-origin'), APP)
      assert.ok(list(res, 'access-control-expose-headers').includes('x-request-id'))
      assertVaryOrigin(res)
      assertNoCredentialsField(res)
    })
  }

  test('a 404 for a path no route matches carries the CORS fields too', async () => {
    const res = await cors.request('GET', '/no-such-thing', { headers: { origin: APP } })
    assert.equal(res.status, 404)
    assertVaryOrigin(res)
    assert.equal(res.headers.get('access-control-allow-origin'), APP)
  })

  test('a request without Origin gets Vary: Origin and no Access-Control-* field', async () => {
    for (const res of [await cors.request('GET', '/users'), await cors.request('OPTIONS', '/users', { auth: null })]) {
      assert.ok(res.status === 200 || res.status === 204, res.text)
      assert.deepEqual(accessControlFields(res), [])
      assertVaryOrigin(res)
    }
  })
})

// ---------------------------------------------------------------------------
// Origins that are not listed

describe('an origin that is not listed', () => {
  const strangers = [
    'https://evil.example.com',
    'http://app.example.com', // another scheme is another origin
    'https://app.example.com:8443', // another port too
    'https://app.example.com.evil.example', // a suffix is not the origin
    'https://example.com',
    'null',
  ]
  for (const origin of strangers) {
    test(
      `${origin}: neither a preflight nor a GET gets any Access-Control-* field; both get Vary: ` + `Origin`,
      async () => {
        const pre = await preflight(cors, '/users', origin)
        assert.equal(pre.status, 204)
        assert.deepEqual(accessControlFields(pre), [])
        assertVaryOrigin(pre)
        const get = await cors.request('GET', '/users', { headers: { origin } })
        assert.equal(get.status, 200)
        assert.deepEqual(accessControlFields(get), [])
        assertVaryOrigin(get)
      },
    )
  }
})

// ---------------------------------------------------------------------------
// CORS_ORIGINS=* and CORS off

describe('CORS_ORIGINS=*', () => {
  for (const origin of [APP, 'https://anything.example.org', 'http://localhost:5173']) {
    test(`any origin (${origin}) gets Access-Control-Allow-Origin: *, never credentials`, async () => {
      const pre = await preflight(anyOrigin, '/products', origin)
      assert.equal(pre.status, 204)
      assert.equal(pre.headers.get('access-control-allow-origin'), '*')
      assert.ok(list(pre, 'access-control-allow-headers').includes('authorization'))
      assertNoCredentialsField(pre)
      const get = await anyOrigin.request('GET', '/products', { headers: { origin } })
      assert.equal(get.status, 200)
      assert.equal(get.headers.get('access-control-allow-origin'), '*')
      assert.ok(list(get, 'access-control-expose-headers').includes('etag'))
      assertVaryOrigin(get)
      assertNoCredentialsField(get)
    })
  }
})

describe('CORS off (the default)', () => {
  const requests: Array<[name: string, send: () => Promise<TestResponse>, status: number]> = [
    ['a preflight', () => preflight(off, '/users', APP), 204],
    ['a GET', () => off.request('GET', '/users', { headers: { origin: APP } }), 200],
    ['a 401', () => off.request('GET', '/users', { auth: null, headers: { origin: APP } }), 401],
  ]
  for (const [name, send, status] of requests) {
    test(`${name} with an Origin gets no Access-Control-* field and no Vary`, async () => {
      const res = await send()
      assert.equal(res.status, status, res.text)
      assert.deepEqual(accessControlFields(res), [])
      assert.equal(res.headers.get('vary'), null)
    })
  }

  test('a preflight still answers 204 with Allow (plain OPTIONS)', async () => {
    const res = await preflight(off, '/users/1', APP, 'DELETE')
    assert.equal(res.status, 204)
    assert.deepEqual(list(res, 'allow').sort(), ['delete', 'get', 'head', 'options', 'patch', 'put'])
  })
})
