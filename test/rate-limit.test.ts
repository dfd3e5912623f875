import assert from 'node:assert/strict'
import { request as httpRequest, type IncomingMessage } from 'node:http'
import { describe, test } from 'node:test'
import { addressBucket, clientAddress, trustedProxies, type TrustProxy } from '../src/core/http/client-address.js'
import { RateLimiter } from '../src/core/http/rate-limit.js'
import { startServer, type TestResponse } from './helpers/server.js'

// The rate limit: a fixed one-minute window per credential, or per client
// address when anonymous; RateLimit-* figures on every counted answer; 429
// rate_limited with Retry-After past the limit; the client address from
// X-Forwarded-For only as far as TRUST_PROXY says; memory bounded however many
// clients appear. RateLimiter and clientAddress are checked on their own (an
// injected clock, fake requests), the rest through real servers.
//
// Every server test uses a credential or a client address of its own, so the
// one-minute windows of different tests never meet. Distinct client addresses
// are real: requests leave from 127.0.0.2, 127.0.0.3, ... (all loopback on Linux).

const LIMIT = 5
const limited = await startServer({ RATE_LIMIT: String(LIMIT) })
const behindOneProxy = await startServer({ RATE_LIMIT: String(LIMIT), TRUST_PROXY: '1' })
const behindListedProxy = await startServer({ RATE_LIMIT: String(LIMIT), TRUST_PROXY: '127.0.0.1' })
const unlimited = await startServer() // the helper's default: RATE_LIMIT=0

// ---------------------------------------------------------------------------
// Helpers

let lastOctet = 1
/** A loopback address no other test of this file sends from. */
const freshAddress = () => `127.0.0.${++lastOctet}`

/** One request from a chosen local address, on a connection of its own. */
function send(
  baseUrl: string,
  method: string,
  path: string,
  options: { headers?: Record<string, string>; from?: string } = {},
): Promise<TestResponse> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      new URL(path, baseUrl),
      { method, headers: options.headers, localAddress: options.from, agent: false },
      (res) => {
        const chunks: Buffer[] = []
        res.on('data', (c: Buffer) => chunks.push(c))
        res.on('error', reject)
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8')
          const headers = new Headers()
          for (const [name, value] of Object.entries(res.headers))
            if (value !== undefined) headers.set(name, Array.isArray(value) ? value.join(', ') : value)
          resolve({
            status: res.statusCode!,
            headers,
            text,
            body: /json/.test(res.headers['content-type'] ?? '') && text ? JSON.parse(text) : undefined,
          })
        })
      },
    )
    req.on('error', reject)
    req.end()
  })
}

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/)
  assert.equal(res.body.code, code, res.text)
}

/** The three RateLimit fields, as numbers; asserts they are all there and integers. */
function rateFigures(res: TestResponse): { limit: number; remaining: number; reset: number } {
  const figures = {
    limit: res.headers.get('ratelimit-limit'),
    remaining: res.headers.get('ratelimit-remaining'),
    reset: res.headers.get('ratelimit-reset'),
  }
  for (const [name, value] of Object.entries(figures))
    assert.match(value ?? '(absent)', /^[0-9]+$/, `RateLimit ${name} on a ${res.status}`)
  return { limit: Number(figures.limit), remaining: Number(figures.remaining), reset: Number(figures.reset) }
}

function assertNoRateHeaders(res: TestResponse): void {
  for (const name of ['ratelimit-limit', 'ratelimit-remaining', 'ratelimit-reset'])
    assert.equal(res.headers.get(name), null, `${name} on ${res.status}`)
}

/** Asserts a 429 rate_limited with Retry-After (= RateLimit-Reset, within the minute) and Remaining 0. */
function assertRateLimited(res: TestResponse): void {
  assertProblem(res, 429, 'rate_limited')
  const { limit, remaining, reset } = rateFigures(res)
  assert.equal(limit, LIMIT)
  assert.equal(remaining, 0)
  assert.ok(reset >= 1 && reset <= 60, `RateLimit-Reset ${reset} within the window`)
  assert.equal(res.headers.get('retry-after'), String(reset), 'Retry-After says when the window resets')
}

/** Sends `LIMIT` requests that must all be admitted (status `admitted`), with Remaining counting down to 0. */
async function spendWindow(sendOne: (i: number) => Promise<TestResponse>, admitted: number): Promise<void> {
  for (let i = 1; i <= LIMIT; i++) {
    const res = await sendOne(i)
    assert.equal(res.status, admitted, `request ${i}: ${res.text}`)
    const { limit, remaining, reset } = rateFigures(res)
    assert.equal(limit, LIMIT)
    assert.equal(remaining, LIMIT - i, `RateLimit-Remaining after request ${i}`)
    assert.ok(reset >= 1 && reset <= 60, `RateLimit-Reset ${reset} within the window`)
  }
}

/** A fake request: only what clientAddress reads. */
const fakeRequest = (remoteAddress: string | undefined, xff?: string | string[]) =>
  ({
    socket: { remoteAddress },
    headers: xff === undefined ? {} : { 'x-forwarded-for': xff },
  }) as unknown as IncomingMessage

// ---------------------------------------------------------------------------
// RateLimiter on its own

describe('RateLimiter', () => {
  const clock = () => {
    const c = { t: 1_000_000, now: () => c.t }
    return c
  }

  test('counts down Remaining, admits exactly `limit` hits per window and refuses the rest', () => {
    const c = clock()
    const limiter = new RateLimiter(3, 1000, c.now)
    const decisions = [1, 2, 3, 4, 5].map(() => limiter.hit('k'))
    assert.deepEqual(
      decisions.map((d) => [d.allowed, d.limit, d.remaining]),
      [
        [true, 3, 2],
        [true, 3, 1],
        [true, 3, 0],
        [false, 3, 0],
        [false, 3, 0],
      ],
    )
  })

  test('Reset is the whole seconds left in the window, at least 1', () => {
    const c = clock()
    const limiter = new RateLimiter(100, 1000, c.now)
    const cases: Array<[elapsedMs: number, reset: number]> = [
      [0, 60],
      [1, 60],
      [999, 60],
      [1000, 59],
      [30_000, 30],
      [58_500, 2],
      [59_000, 1],
      [59_999, 1],
    ]
    const start = c.t
    for (const [elapsed, reset] of cases) {
      c.t = start + elapsed
      assert.equal(limiter.hit('k').resetSeconds, reset, `${elapsed} ms into the window`)
    }
  })

  test('a refused key is admitted again, with a full window, 60 s after its window started', () => {
    const c = clock()
    const limiter = new RateLimiter(2, 1000, c.now)
    limiter.hit('k')
    c.t += 10_000
    limiter.hit('k')
    assert.equal(limiter.hit('k').allowed, false)
    c.t += 49_999 // 59.999 s after the first hit
    assert.equal(limiter.hit('k').allowed, false, 'still the same window')
    c.t += 1 // exactly 60 s
    const fresh = limiter.hit('k')
    assert.deepEqual([fresh.allowed, fresh.remaining, fresh.resetSeconds], [true, 1, 60])
  })

  test('keys have windows of their own', () => {
    const c = clock()
    const limiter = new RateLimiter(1, 1000, c.now)
    assert.equal(limiter.hit('a').allowed, true)
    assert.equal(limiter.hit('a').allowed, false)
    assert.equal(limiter.hit('b').allowed, true)
    c.t += 20_000
    assert.equal(limiter.hit('c').allowed, true)
    assert.equal(limiter.hit('b').allowed, false)
  })

  test(
    'memory is bounded: 100,000 distinct keys leave at most maxKeys (1000) windows, and limiting still ' + 'works',
    () => {
      const c = clock()
      const limiter = new RateLimiter(2, 1000, c.now)
      for (let i = 0; i < 100_000; i++) {
        limiter.hit(`flood ${i}`)
        if (i % 10_000 === 0) c.t += 1 // time moves, but far less than a window
      }
      assert.equal(limiter.size, 1000)
      limiter.hit('victim')
      limiter.hit('victim')
      assert.equal(limiter.hit('victim').allowed, false, 'a recent key is still limited after the flood')
      assert.ok(limiter.size <= 1000)
    },
  )

  test(
    'the default bound (the one the server uses) holds too: 150,000 distinct keys keep at most 100,000 ' + 'windows',
    () => {
      const c = clock()
      const limiter = new RateLimiter(10, undefined, c.now)
      for (let i = 0; i < 150_000; i++) limiter.hit(`client ${i}`)
      assert.equal(limiter.size, 100_000)
    },
  )

  test('expired windows are dropped as requests arrive', () => {
    const c = clock()
    const limiter = new RateLimiter(5, 1000, c.now)
    for (let i = 0; i < 500; i++) limiter.hit(`old ${i}`)
    c.t += 30_000
    for (let i = 0; i < 10; i++) limiter.hit(`newer ${i}`)
    assert.equal(limiter.size, 510)
    c.t += 30_000 // the first 500 windows are 60 s old now, the 10 newer ones 30 s
    limiter.hit('now')
    assert.equal(limiter.size, 11)
  })
})

// ---------------------------------------------------------------------------
// clientAddress on its own

describe('clientAddress', () => {
  const proxies = trustedProxies(['10.0.0.1', '10.0.0.2'])
  const cases: Array<
    [name: string, trust: TrustProxy, peer: string | undefined, xff: string | string[] | undefined, expected: string]
  > = [
    ['TRUST_PROXY=0: the peer, whatever X-Forwarded-For says', 0, '203.0.113.9', '198.51.100.1', '203.0.113.9'],
    ['TRUST_PROXY=0: an IPv4-mapped IPv6 peer is its IPv4 address', 0, '::ffff:203.0.113.9', undefined, '203.0.113.9'],
    ['TRUST_PROXY=0: an IPv6 peer as is', 0, '2001:db8::1', '198.51.100.1', '2001:db8::1'],
    [
      'TRUST_PROXY=1: the right-most X-Forwarded-For entry',
      1,
      '10.0.0.1',
      'forged, 198.51.100.1, 203.0.113.7',
      '203.0.113.7',
    ],
    ['TRUST_PROXY=1: without X-Forwarded-For, the peer', 1, '10.0.0.1', undefined, '10.0.0.1'],
    ['TRUST_PROXY=1: an empty X-Forwarded-For, the peer', 1, '10.0.0.1', '', '10.0.0.1'],
    [
      'TRUST_PROXY=1: entries are trimmed and IPv4-mapped ones normalized',
      1,
      '10.0.0.1',
      ' 198.51.100.1 ,  ::ffff:203.0.113.7 ',
      '203.0.113.7',
    ],
    [
      'TRUST_PROXY=1: repeated X-Forwarded-For fields are one list',
      1,
      '10.0.0.1',
      ['198.51.100.1', '203.0.113.7'],
      '203.0.113.7',
    ],
    ['TRUST_PROXY=2: the second entry from the right', 2, '10.0.0.2', 'forged, 203.0.113.7, 10.0.0.1', '203.0.113.7'],
    // Fewer entries than trusted hops: the request bypassed a proxy, and the left-most entry may be the client's own.
    [
      'TRUST_PROXY=5 with only two entries: the peer, not a client-chosen entry',
      5,
      '10.0.0.2',
      '203.0.113.7, 10.0.0.1',
      '10.0.0.2',
    ],
    ['TRUST_PROXY=2 with one entry: the peer', 2, '10.0.0.2', '203.0.113.7', '10.0.0.2'],
    ['TRUST_PROXY=1: a port is not part of the address', 1, '10.0.0.1', '203.0.113.7:5678', '203.0.113.7'],
    ['TRUST_PROXY=1: a bracketed IPv6 address with a port', 1, '10.0.0.1', '[2001:DB8::7]:443', '2001:db8::7'],
    ['TRUST_PROXY=1: an IPv6 address with a zone id', 1, '10.0.0.1', 'fe80::1%eth0', 'fe80::1'],
    ['TRUST_PROXY=1: nine IPv6 groups (not an address): the peer', 1, '10.0.0.1', '1:2:3:4:5:6:7:8::9', '10.0.0.1'],
    ['TRUST_PROXY=1: garbage: the peer', 1, '10.0.0.1', 'not an address', '10.0.0.1'],
    ['TRUST_PROXY=1: a NUL byte: the peer', 1, '10.0.0.1', '203.0.113.7\u0000', '10.0.0.1'],
    ['TRUST_PROXY=1: 999.1.1.1: the peer', 1, '10.0.0.1', '999.1.1.1', '10.0.0.1'],
    ['TRUST_PROXY=2: an invalid entry in the trusted part: the peer', 2, '10.0.0.2', '203.0.113.7, bogus', '10.0.0.2'],
    [
      'TRUST_PROXY=1: an invalid entry left of the trusted part is never read',
      1,
      '10.0.0.1',
      '1:2:3:4:5:6:7:8::9, 203.0.113.7',
      '203.0.113.7',
    ],
    [
      'proxy list: an invalid entry stops at the proxy right of it',
      proxies,
      '10.0.0.1',
      '203.0.113.7, bogus, 10.0.0.2',
      '10.0.0.2',
    ],
    [
      'proxy list: the right-most address that is not a listed proxy',
      proxies,
      '10.0.0.1',
      'forged, 203.0.113.7, 10.0.0.2',
      '203.0.113.7',
    ],
    [
      'proxy list: a peer that is not a listed proxy is the client, its header ignored',
      proxies,
      '192.0.2.50',
      '203.0.113.7',
      '192.0.2.50',
    ],
    [
      'proxy list: a listed IPv4 proxy matches on a dual-stack socket (::ffff:)',
      proxies,
      '::ffff:10.0.0.1',
      '203.0.113.7',
      '203.0.113.7',
    ],
    ['proxy list: every address a proxy, the left-most', proxies, '10.0.0.1', '10.0.0.2', '10.0.0.2'],
    [
      'proxy list written as ::ffff:a.b.c.d matches the peer it names',
      trustedProxies(['::ffff:10.0.0.1']),
      '::ffff:10.0.0.1',
      '203.0.113.7',
      '203.0.113.7',
    ],
    [
      'proxy list in upper case matches the lower-case IPv6 peer',
      trustedProxies(['FD00::1']),
      'fd00::1',
      '203.0.113.7',
      '203.0.113.7',
    ],
  ]
  for (const [name, trust, peer, xff, expected] of cases) {
    test(name, () => assert.equal(clientAddress(fakeRequest(peer, xff), trust), expected))
  }

  test('rotating the left part of X-Forwarded-For never changes the address (TRUST_PROXY=0, 1 and a list)', () => {
    for (const trust of [0, 1, proxies] as TrustProxy[]) {
      const seen = new Set<string>()
      for (let i = 0; i < 50; i++)
        seen.add(clientAddress(fakeRequest('10.0.0.1', `198.51.100.${i}, 203.0.113.7`), trust))
      assert.equal(seen.size, 1, `trust ${String(trust instanceof Set ? [...trust] : trust)}: ${[...seen].join(' ')}`)
    }
  })
})

// ---------------------------------------------------------------------------
// Through the server: per credential

describe('rate limit per credential (RATE_LIMIT=5)', () => {
  test(
    'every counted answer carries RateLimit-Limit/Remaining/Reset; the 6th request in the minute is 429 ' +
      'rate_limited with Retry-After and the handler does not run',
    async () => {
      const user = await limited.createUser({ name: 'Before' })
      await spendWindow(() => limited.request('GET', `/users/${user.id}`, { auth: user.token }), 200)
      const refused = await limited.request('PATCH', `/users/${user.id}`, { auth: user.token, body: { name: 'After' } })
      assertRateLimited(refused)
      const [row] = await limited.sql<
        [{ name: string; version: number }]
      >`SELECT name, version FROM users WHERE id = ${user.id}`
      assert.deepEqual({ ...row }, { name: 'Before', version: 1 }, 'the refused PATCH changed nothing')
      assertRateLimited(await limited.request('GET', `/users/${user.id}`, { auth: user.token }))
    },
  )

  test('errors after authentication count too (a 403 carries the figures)', async () => {
    const user = await limited.createUser()
    const res = await limited.request('GET', '/users', { auth: user.token })
    assertProblem(res, 403, 'forbidden')
    assert.equal(rateFigures(res).remaining, LIMIT - 1)
  })

  test('two users have separate buckets: one refused, the other still admitted with its own count', async () => {
    const [a, b] = [await limited.createUser(), await limited.createUser()]
    await spendWindow(() => limited.request('GET', `/users/${a.id}`, { auth: a.token }), 200)
    assertRateLimited(await limited.request('GET', `/users/${a.id}`, { auth: a.token }))
    const other = await limited.request('GET', `/users/${b.id}`, { auth: b.token })
    assert.equal(other.status, 200)
    assert.equal(rateFigures(other).remaining, LIMIT - 1)
  })

  test('an API key is a credential of its own: its bucket is not its owner’s JWT bucket', async () => {
    const owner = await limited.createUser({ session: true })
    const created = await limited.request('POST', '/api-keys', {
      auth: owner.token,
      body: { name: 'limited key', scopes: ['products:read'] },
    })
    assert.equal(created.status, 201, created.text)
    assert.equal(rateFigures(created).remaining, LIMIT - 1)
    await spendWindow(
      () => limited.request('GET', '/products', { auth: null, headers: { 'x-api-key': created.body.key } }),
      200,
    )
    assertRateLimited(
      await limited.request('GET', '/products', { auth: null, headers: { 'x-api-key': created.body.key } }),
    )
    const jwt = await limited.request('GET', `/users/${owner.id}`, { auth: owner.token })
    assert.equal(jwt.status, 200)
    assert.equal(rateFigures(jwt).remaining, LIMIT - 2, 'the JWT bucket only holds the creation and this request')
  })

  test("a user's credentials together get at most 3 × RATE_LIMIT: N keys do not give N times the limit", async () => {
    const owner = await limited.createUser({ session: true })
    const keys: string[] = []
    for (let i = 0; i < 3; i++) {
      const created = await limited.request('POST', '/api-keys', {
        auth: owner.token,
        body: { name: `key ${i}`, scopes: ['products:read'] },
      })
      assert.equal(created.status, 201, created.text)
      keys.push(created.body.key)
    }
    const withKey = (key: string) => limited.request('GET', '/products', { auth: null, headers: { 'x-api-key': key } })
    // The user has spent 3 (the creations); each key's own window holds 5.
    for (const key of keys.slice(0, 2)) for (let i = 0; i < LIMIT; i++) assert.equal((await withKey(key)).status, 200)
    for (let i = 0; i < 2; i++) assert.equal((await withKey(keys[2]!)).status, 200)
    // 15 spent by the user: the third key, with 3 left in its own window, is refused by the user's bucket.
    const refused = await withKey(keys[2]!)
    assertProblem(refused, 429, 'rate_limited')
    assert.equal(rateFigures(refused).limit, 3 * LIMIT)
    assert.equal(rateFigures(refused).remaining, 0)
  })

  test('a credential’s requests do not count against its client address', async () => {
    const from = freshAddress()
    const user = await limited.createUser()
    for (let i = 0; i < LIMIT + 2; i++)
      await send(limited.url, 'GET', `/users/${user.id}`, { from, headers: { authorization: `Bearer ${user.token}` } })
    const anonymous = await send(limited.url, 'GET', '/users', { from })
    assertProblem(anonymous, 401, 'unauthorized')
    assert.equal(rateFigures(anonymous).remaining, LIMIT - 1)
  })
})

// ---------------------------------------------------------------------------
// Through the server: per client address

describe('rate limit per client address when anonymous (RATE_LIMIT=5, TRUST_PROXY=0)', () => {
  test('anonymous requests count against the address: 5 answers (401 here) with the figures, then 429', async () => {
    const from = freshAddress()
    await spendWindow(() => send(limited.url, 'GET', '/users', { from }), 401)
    assertRateLimited(await send(limited.url, 'GET', '/users', { from }))
  })

  test('two addresses have separate buckets', async () => {
    const [a, b] = [freshAddress(), freshAddress()]
    await spendWindow(() => send(limited.url, 'GET', '/products', { from: a }), 401)
    assertRateLimited(await send(limited.url, 'GET', '/products', { from: a }))
    const other = await send(limited.url, 'GET', '/products', { from: b })
    assertProblem(other, 401, 'unauthorized')
    assert.equal(rateFigures(other).remaining, LIMIT - 1)
  })

  test('rotating X-Forwarded-For does not escape the limit when no proxy is trusted', async () => {
    const from = freshAddress()
    await spendWindow(
      (i) => send(limited.url, 'GET', '/users', { from, headers: { 'x-forwarded-for': `198.51.100.${i}` } }),
      401,
    )
    assertRateLimited(
      await send(limited.url, 'GET', '/users', { from, headers: { 'x-forwarded-for': '198.51.100.99' } }),
    )
  })

  const badCredentials: Array<[name: string, headers: Record<string, string>]> = [
    ['a forged JWT', { authorization: 'Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl' }],
    ['an unknown opaque token', { authorization: 'Bearer not-a-token' }],
    ['an unknown API key', { 'x-api-key': `upa_ak_${'A'.repeat(43)}` }],
  ]
  for (const [name, headers] of badCredentials) {
    test(
      `bad credentials (${name}) count against the address: 401 invalid_token with the figures, then 429, ` +
        `and the address stays limited for anonymous requests`,
      async () => {
        const from = freshAddress()
        await spendWindow(async () => {
          const res = await send(limited.url, 'GET', '/products', { from, headers })
          assert.equal(res.body?.code, 'invalid_token', res.text)
          return res
        }, 401)
        assertRateLimited(await send(limited.url, 'GET', '/products', { from, headers }))
        assertRateLimited(await send(limited.url, 'GET', '/products', { from }))
      },
    )
  }

  test('an address that has spent its window is refused before its credential costs a database read', async () => {
    const from = freshAddress()
    await spendWindow(() => send(limited.url, 'GET', '/products', { from }), 401)
    const statements = async () =>
      Number(/^db_queries_total ([0-9]+)$/m.exec((await limited.request('GET', '/metrics')).text)![1])
    const before = await statements()
    const credentials: Array<Record<string, string>> = [
      { 'x-api-key': `upa_ak_${'B'.repeat(43)}` },
      { authorization: `Bearer upa_at_${'C'.repeat(43)}` },
    ]
    for (const headers of credentials) {
      assertRateLimited(await send(limited.url, 'GET', '/products', { from, headers }))
    }
    assert.equal((await statements()) - before, 0, 'no statement looked the credentials up')
  })

  test('/healthz and /readyz are exempt: admitted from a limited address, without RateLimit fields', async () => {
    const from = freshAddress()
    for (let i = 0; i <= LIMIT; i++) await send(limited.url, 'GET', '/users', { from })
    assertRateLimited(await send(limited.url, 'GET', '/users', { from }))
    for (const path of ['/healthz', '/readyz']) {
      for (let i = 0; i < LIMIT + 2; i++) {
        const res = await send(limited.url, 'GET', path, { from })
        assert.equal(res.status, 200, `${path} #${i + 1}: ${res.text}`)
        assertNoRateHeaders(res)
      }
    }
  })

  test(
    'a request with a bad credential to /healthz is not counted (public routes never look at ' + 'credentials)',
    async () => {
      const from = freshAddress()
      for (let i = 0; i < LIMIT + 2; i++)
        assert.equal(
          (await send(limited.url, 'GET', '/healthz', { from, headers: { authorization: 'Bearer nope' } })).status,
          200,
        )
      const res = await send(limited.url, 'GET', '/users', { from })
      assert.equal(rateFigures(res).remaining, LIMIT - 1)
    },
  )
})

describe('X-Forwarded-For behind trusted proxies', () => {
  test('TRUST_PROXY=1: only the right-most entry counts, so rotating the rest does not escape the limit', async () => {
    await spendWindow(
      (i) => send(behindOneProxy.url, 'GET', '/users', { headers: { 'x-forwarded-for': `10.9.9.${i}, 198.51.100.7` } }),
      401,
    )
    assertRateLimited(
      await send(behindOneProxy.url, 'GET', '/users', { headers: { 'x-forwarded-for': '10.9.9.99, 198.51.100.7' } }),
    )
    assertRateLimited(
      await send(behindOneProxy.url, 'GET', '/users', { headers: { 'x-forwarded-for': '198.51.100.7' } }),
    )
  })

  test('TRUST_PROXY=1: another right-most entry is another client with a bucket of its own', async () => {
    await spendWindow(
      () => send(behindOneProxy.url, 'GET', '/users', { headers: { 'x-forwarded-for': '198.51.100.20' } }),
      401,
    )
    assertRateLimited(
      await send(behindOneProxy.url, 'GET', '/users', { headers: { 'x-forwarded-for': '198.51.100.20' } }),
    )
    const other = await send(behindOneProxy.url, 'GET', '/users', {
      headers: { 'x-forwarded-for': '198.51.100.20, 198.51.100.21' },
    })
    assertProblem(other, 401, 'unauthorized')
    assert.equal(rateFigures(other).remaining, LIMIT - 1)
  })

  test('TRUST_PROXY=<list>: the right-most address that is not a listed proxy counts', async () => {
    // The peer (127.0.0.1) and an inner hop (127.0.0.1 again) are listed proxies; 198.51.100.30 is the client.
    await spendWindow(
      (i) =>
        send(behindListedProxy.url, 'GET', '/users', {
          headers: { 'x-forwarded-for': `10.8.8.${i}, 198.51.100.30, 127.0.0.1` },
        }),
      401,
    )
    assertRateLimited(
      await send(behindListedProxy.url, 'GET', '/users', { headers: { 'x-forwarded-for': '198.51.100.30' } }),
    )
    const other = await send(behindListedProxy.url, 'GET', '/users', {
      headers: { 'x-forwarded-for': '198.51.100.31' },
    })
    assert.equal(rateFigures(other).remaining, LIMIT - 1)
  })

  test(
    'TRUST_PROXY=<list>: a peer that is not a listed proxy is the client; its X-Forwarded-For is ' + 'ignored',
    async () => {
      const from = freshAddress()
      await spendWindow(
        (i) =>
          send(behindListedProxy.url, 'GET', '/users', {
            from,
            headers: { 'x-forwarded-for': `198.51.100.${100 + i}` },
          }),
        401,
      )
      assertRateLimited(
        await send(behindListedProxy.url, 'GET', '/users', { from, headers: { 'x-forwarded-for': '198.51.100.200' } }),
      )
    },
  )
})

describe('hostile X-Forwarded-For through the server (TRUST_PROXY=1)', () => {
  const hostile = [
    '1:2:3:4:5:6:7:8::9',
    '::::::::::',
    'not an address',
    '203.0.113.7\t, , ,',
    Array.from({ length: 1000 }, (_, i) => `198.51.100.${i % 250}`).join(','),
    '[::1',
    '1.2.3.4:99999',
  ]
  for (const xff of hostile) {
    test(
      `X-Forwarded-For ${JSON.stringify(xff.slice(0, 40))}: an ordinary answer on every kind of endpoint, nothing ` +
        `logged as an error`,
      async () => {
        for (const [method, path] of [
          ['GET', '/users'],
          ['GET', '/healthz'],
          ['POST', '/auth/login'],
          ['GET', '/nowhere'],
        ]) {
          const res = await send(behindOneProxy.url, method!, path!, { headers: { 'x-forwarded-for': xff } })
          assert.ok(res.status < 500, `${method} ${path}: ${res.status} ${res.text}`)
        }
        assert.deepEqual(
          behindOneProxy.logs.filter((l) => l.level === 'error'),
          [],
        )
      },
    )
  }

  test('a malformed X-Forwarded-For counts against the peer: rotating garbage does not escape the limit', async () => {
    const from = freshAddress()
    await spendWindow(
      (i) => send(behindOneProxy.url, 'GET', '/users', { from, headers: { 'x-forwarded-for': `garbage-${i}` } }),
      401,
    )
    assertRateLimited(
      await send(behindOneProxy.url, 'GET', '/users', { from, headers: { 'x-forwarded-for': '1:2:3:4:5:6:7:8::9' } }),
    )
    const logged = behindOneProxy.logs.filter((l) => l.msg === 'request').at(-1)!
    assert.equal(logged.client, from)
  })
})

describe('RATE_LIMIT=0', () => {
  test('turns the limit off: no RateLimit fields and no 429, for credentials and anonymous callers alike', async () => {
    const user = await unlimited.createUser()
    for (let i = 0; i < 3 * LIMIT; i++) {
      const withCredential = await unlimited.request('GET', `/users/${user.id}`, { auth: user.token })
      assert.equal(withCredential.status, 200)
      assertNoRateHeaders(withCredential)
      const anonymous = await unlimited.request('GET', '/users', { auth: null })
      assertProblem(anonymous, 401, 'unauthorized')
      assertNoRateHeaders(anonymous)
    }
  })
})

describe('addressBucket', () => {
  const cases: Array<[string, string]> = [
    ['203.0.113.7', 'address 203.0.113.7'],
    ['2001:db8:0:1::5', 'address 2001:db8:0:1::/64'],
    ['2001:DB8:0:1:ffff:1:2:9', 'address 2001:db8:0:1::/64'],
    ['2001:0db8:0000:0001::abcd', 'address 2001:db8:0:1::/64'],
    ['fe80::1:2:3:4:5', 'address fe80:0:0:1::/64'],
    ['::1', 'address 0:0:0:0::/64'],
  ]
  for (const [address, bucket] of cases) {
    test(`counts ${address} as ${bucket}`, () => assert.equal(addressBucket(address), bucket))
  }
  test('two addresses of one IPv6 /64 share a bucket; another /64 does not', () => {
    assert.equal(addressBucket('2001:db8:aa:bb::1'), addressBucket('2001:db8:aa:bb:ffff:ffff:ffff:fffe'))
    assert.notEqual(addressBucket('2001:db8:aa:bb::1'), addressBucket('2001:db8:aa:bc::1'))
  })
})
