import assert from 'node:assert/strict'
import { createHash, randomBytes, randomUUID } from 'node:crypto'
import { after, describe, test } from 'node:test'
import { createLogger } from '../src/core/log.js'
import { createService } from '../src/service.js'
import { startServer, type TestResponse } from './helpers/server.js'

// Idempotency-Key on the creating POSTs (/users, /products): the first
// answer is stored and replayed to retries with the same key and body
// (`Idempotent-Replayed: true`, one row created); another body with the key is
// 422; while the first runs, 409; keys belong to their caller; a failed first
// request leaves no record; records expire after 24 hours, and a "running"
// record abandoned for over a minute is taken over. The record lives in
// PostgreSQL, so all of this holds across instances: a second instance of the
// app runs on this file's database too. POST /api-keys is left out on purpose
// (a replay would need the secret stored): checked here that nothing is.
//
// Top-level tests run one after another (node:test's default).

const api = await startServer()
const { sql } = api

// A second instance of the application on the same database.
const second = createService({ ...api.deps.config, poolMax: 5 }, { log: createLogger('error', () => {}) })
after(() => second.close())
const secondUrl = `http://127.0.0.1:${(await second.listen(0, '127.0.0.1')).port}`

// ---------------------------------------------------------------------------
// Helpers

let sequence = 0
const unique = (tag: string) => `${tag}-${process.pid}-${++sequence}`
const newKey = () => `key-${randomBytes(12).toString('base64url')}`

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/)
  assert.equal(res.body.code, code, res.text)
}

/** POST with an Idempotency-Key, as the admin unless `token` says otherwise. */
const post = (path: string, key: string, body: unknown, token?: string) =>
  api.request('POST', path, { body, headers: { 'idempotency-key': key }, auth: token })

/** The same POST to the second instance. */
async function postToSecond(path: string, key: string, body: unknown, token = api.admin.token): Promise<TestResponse> {
  const res = await fetch(secondUrl + path, {
    method: 'POST',
    headers: { 'idempotency-key': key, authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, headers: res.headers, text, body: text ? JSON.parse(text) : undefined }
}

interface Endpoint {
  path: string
  /** A body that creates something new each time it is called. */
  body: () => Record<string, unknown>
  /** How many rows exist for what `body` describes. */
  rows: (body: Record<string, unknown>) => Promise<number>
  /** The code of a second create with the same body. */
  conflict: string
}

const count = async (query: Promise<Array<{ n: number }>>) => (await query)[0]!.n

const endpoints: Endpoint[] = [
  {
    path: '/users',
    body: () => ({ name: 'Idem User', email: `${unique('idem')}@example.com` }),
    rows: (b) =>
      count(sql<Array<{ n: number }>>`SELECT count(*)::int AS n FROM users WHERE email = ${b.email as string}`),
    conflict: 'email_taken',
  },
  {
    path: '/products',
    body: () => ({ sku: unique('IDEM'), name: 'Idem Product', price: 1999, currency: 'EUR' }),
    rows: (b) =>
      count(sql<Array<{ n: number }>>`SELECT count(*)::int AS n FROM products WHERE sku = ${b.sku as string}`),
    conflict: 'sku_taken',
  },
]
const [users, products] = endpoints as [Endpoint, Endpoint]
const deleteProduct = (id: number) => sql`DELETE FROM products WHERE id = ${id}`

interface StoredRecord {
  caller: string
  fingerprint: string
  status: number | null
  headers: Record<string, string> | null
  body: string | null
}
const recordCount = () => count(sql<Array<{ n: number }>>`SELECT count(*)::int AS n FROM idempotency_keys`)
const records = (key: string) =>
  sql<StoredRecord[]>`SELECT caller, fingerprint, status, headers, body FROM idempotency_keys WHERE key = ${key}`

/** Ages the record of `key` (and optionally marks it still running). */
async function age(key: string, interval: string, running = false): Promise<void> {
  const updated = running
    ? await sql`UPDATE idempotency_keys SET created_at = now()
      - ${interval}::interval, status = NULL, headers = NULL, body = NULL WHERE key = ${key}`
    : await sql`UPDATE idempotency_keys SET created_at = now() - ${interval}::interval WHERE key = ${key}`
  assert.equal(updated.count, 1, `one record for ${key}`)
}

/** Asserts `retry` is the replay of `first`: same status, body, Location and ETag, marked replayed. */
function assertReplay(first: TestResponse, retry: TestResponse): void {
  assert.equal(retry.status, first.status, retry.text)
  assert.deepEqual(retry.body, first.body)
  assert.equal(retry.headers.get('location'), first.headers.get('location'))
  assert.equal(retry.headers.get('etag'), first.headers.get('etag'))
  assert.match(retry.headers.get('content-type') ?? '', /^application\/json/)
  assert.equal(retry.headers.get('idempotent-replayed'), 'true')
  assert.notEqual(
    retry.headers.get('x-request-id'),
    first.headers.get('x-request-id'),
    'the request id is the retry’s own',
  )
}

function assertFresh(res: TestResponse, message = ''): void {
  assert.equal(res.status, 201, `${message} ${res.text}`)
  assert.equal(res.headers.get('idempotent-replayed'), null, 'a first answer is not marked replayed')
}

/**
 * Of concurrent answers with one key and body: one original 201, the rest replays of it or 409 idempotency_key_in_use.
 */
function assertOneRan(answers: TestResponse[], message = ''): void {
  const summary = answers
    .map(
      (r) =>
        `${r.status}${r.headers.get('idempotent-replayed') ? 'r' : ''}${r.status === 201 ? '' : `:${r.body?.code}`}`,
    )
    .join(' ')
  const originals = answers.filter((r) => r.status === 201 && r.headers.get('idempotent-replayed') === null)
  assert.equal(originals.length, 1, `${message}one request ran; answers: ${summary}`)
  for (const res of answers) {
    if (res.status === 409 && res.body?.code === 'idempotency_key_in_use') {
      assert.equal(res.headers.get('retry-after'), '1')
    } else {
      assert.equal(res.status, 201, `${message}${summary}`)
      assert.deepEqual(res.body, originals[0]!.body, 'a replay is the original answer')
    }
  }
}

// ---------------------------------------------------------------------------
// Replay and reuse, on every creating POST

for (const endpoint of endpoints) {
  describe(`POST ${endpoint.path} with Idempotency-Key`, () => {
    test(
      'a retry with the same key and body gets the first answer again (status, body, Location, ETag) marked ' +
        'Idempotent-Replayed, and one row exists',
      async () => {
        const key = newKey()
        const body = endpoint.body()
        const first = await post(endpoint.path, key, body)
        assertFresh(first)
        assert.ok(first.headers.get('location'), 'Location on the first answer')
        for (let i = 0; i < 3; i++) assertReplay(first, await post(endpoint.path, key, body))
        assert.equal(await endpoint.rows(body), 1)
        const [record] = await records(key)
        assert.equal(record?.status, 201)
        assert.equal(record?.caller, `user ${api.admin.id}`)
      },
    )

    test('the same key with another body is 422 idempotency_key_reused and creates nothing', async () => {
      const key = newKey()
      const body = endpoint.body()
      assertFresh(await post(endpoint.path, key, body))
      const other = endpoint.body()
      assertProblem(await post(endpoint.path, key, other), 422, 'idempotency_key_reused')
      assert.equal(await endpoint.rows(other), 0)
      assert.equal(await endpoint.rows(body), 1)
    })

    test('without Idempotency-Key nothing is recorded and a retry runs again (here: 409, the row exists)', async () => {
      const before = await recordCount()
      const body = endpoint.body()
      assert.equal((await api.request('POST', endpoint.path, { body })).status, 201)
      assertProblem(await api.request('POST', endpoint.path, { body }), 409, endpoint.conflict)
      assert.equal(await recordCount(), before)
    })
  })
}

describe('Idempotency-Key: scope and what is stored', () => {
  test('the same key on another endpoint is 422 idempotency_key_reused (the path is part of the request)', async () => {
    const key = newKey()
    assertFresh(await post('/users', key, users.body()))
    const product = products.body()
    assertProblem(await post('/products', key, product), 422, 'idempotency_key_reused')
    assert.equal(await products.rows(product), 0)
  })

  test('the replay holds after the resource changed: the stored answer, not the current state', async () => {
    const key = newKey()
    const body = products.body()
    const first = await post('/products', key, body)
    assertFresh(first)
    const patched = await api.request('PATCH', `/products/${first.body.id}`, { body: { name: 'Renamed' } })
    assert.equal(patched.status, 200)
    assertReplay(first, await post('/products', key, body))
  })

  test(
    'a user created with a password: the record holds neither the password nor an unkeyed hash of the ' + 'request',
    async () => {
      const key = newKey()
      const password = `pw-${randomBytes(6).toString('hex')}`
      const body = { ...users.body(), password }
      const first = await post('/users', key, body)
      assertFresh(first)
      assertReplay(first, await post('/users', key, body))
      const [record] = await records(key)
      assert.ok(record)
      assert.ok(!JSON.stringify(record).includes(password), 'no password in the record')
      // Anyone reading the table could test guesses against a plain SHA-256 of the
      // request at a billion a second, around the scrypt hash of the password.
      const unkeyed = createHash('sha256')
        .update(JSON.stringify(['POST', '/users', body]))
        .digest('base64url')
      assert.notEqual(record.fingerprint, unkeyed, 'the fingerprint is keyed by a server secret')
    },
  )

  test(
    'POST /api-keys does not take part (a replay would need the secret stored): no record, and a retry creates a ' +
      'second key',
    async () => {
      const user = await api.createUser({ session: true })
      const key = newKey()
      const body = { name: unique('no idem'), scopes: ['products:read'] }
      const first = await post('/api-keys', key, body, user.token)
      const second = await post('/api-keys', key, body, user.token)
      for (const res of [first, second]) assertFresh(res)
      assert.notEqual(first.body.id, second.body.id)
      assert.equal((await records(key)).length, 0)
      const [{ n }] = await sql<
        [{ n: number }]
      >`SELECT count(*)::int AS n FROM idempotency_keys WHERE body LIKE ${'%' + first.body.key + '%'}`
      assert.equal(n, 0, 'no stored answer holds the secret')
    },
  )
})

// ---------------------------------------------------------------------------
// The key itself

describe('Idempotency-Key syntax', () => {
  const refused: Array<[name: string, key: string]> = [
    ['256 characters', 'k'.repeat(256)],
    ['an empty value', ''],
    ['a tab inside', 'a\tb'],
    ['a non-ASCII character', 'clé'],
  ]
  for (const [name, key] of refused) {
    test(`a key of ${name} is 400 invalid_request and nothing is created or recorded`, async () => {
      const before = await recordCount()
      const body = users.body()
      const res = await post('/users', key, body)
      assertProblem(res, 400, 'invalid_request')
      assert.match(res.body.detail, /Idempotency-Key/)
      assert.equal(await users.rows(body), 0)
      assert.equal(await recordCount(), before)
    })
  }

  const accepted: Array<[name: string, key: string]> = [
    ['255 characters (the longest)', newKey().padEnd(255, 'k')],
    ['one character', 'x'],
    ['inner spaces and punctuation', `order 42 / ${randomBytes(4).toString('hex')} ~!@#$%^&*()`],
    ['a UUID', randomUUID()],
  ]
  for (const [name, key] of accepted) {
    test(`a key of ${name} is accepted and replayed`, async () => {
      const body = products.body()
      const first = await post('/products', key, body)
      assertFresh(first)
      assertReplay(first, await post('/products', key, body))
      assert.equal(await products.rows(body), 1)
      assert.equal((await records(key)).length, 1)
    })
  }
})

// ---------------------------------------------------------------------------
// Whose key

describe('Idempotency-Key belongs to its caller', () => {
  for (const endpoint of endpoints) {
    test(
      `another admin sending the same key to ` +
        `POST ${endpoint.path} creates its own; each retry replays its caller’s answer`,
      async () => {
        const other = await api.createUser({ role: 'admin' })
        const key = newKey()
        const [mine, theirs] = [endpoint.body(), endpoint.body()]
        const first = await post(endpoint.path, key, mine)
        const second = await post(endpoint.path, key, theirs, other.token)
        assertFresh(first)
        assertFresh(second, 'not a 422: the key is another caller’s')
        assert.notEqual(first.body.id, second.body.id)
        assert.equal(await endpoint.rows(mine), 1)
        assert.equal(await endpoint.rows(theirs), 1)
        assert.deepEqual(
          (await records(key)).map((r) => r.caller).sort(),
          [`user ${api.admin.id}`, `user ${other.id}`].sort(),
        )
        assertReplay(first, await post(endpoint.path, key, mine))
        assertReplay(second, await post(endpoint.path, key, theirs, other.token))
      },
    )
  }
})

// ---------------------------------------------------------------------------
// Failures and concurrency

describe('a first request that fails leaves no record', () => {
  test(
    '409 email_taken: no record; a retry runs again (409 again), and once the conflict is gone it creates the ' +
      'user',
    async () => {
      const key = newKey()
      const body = users.body()
      const taken = await api.createUser({ email: body.email as string })
      assertProblem(await post('/users', key, body), 409, 'email_taken')
      assert.equal((await records(key)).length, 0)
      assertProblem(await post('/users', key, body), 409, 'email_taken')
      await sql`DELETE FROM users WHERE id = ${taken.id}`
      const retry = await post('/users', key, body)
      assertFresh(retry)
      assert.equal(await users.rows(body), 1)
      assert.equal((await records(key))[0]?.status, 201)
    },
  )

  test('409 sku_taken: no record, the key stays free for another body', async () => {
    const key = newKey()
    const body = products.body()
    assert.equal((await api.request('POST', '/products', { body })).status, 201)
    assertProblem(await post('/products', key, body), 409, 'sku_taken')
    assert.equal((await records(key)).length, 0)
    const other = products.body()
    assertFresh(await post('/products', key, other))
    assert.equal(await products.rows(other), 1)
  })

  const refused: Array<[name: string, body: Record<string, unknown>, status: number, code: string]> = [
    [
      '422 validation_failed (an unknown currency)',
      { sku: 'BAD-CUR', name: 'x', price: 1, currency: 'XYZ' },
      422,
      'validation_failed',
    ],
    [
      '422 validation_failed (a member missing)',
      { sku: 'NO-PRICE', name: 'x', currency: 'EUR' },
      422,
      'validation_failed',
    ],
  ]
  for (const [name, body, status, code] of refused) {
    test(`${name}: no record, the key stays free for another body`, async () => {
      const key = newKey()
      assertProblem(await post('/products', key, body), status, code)
      assert.equal((await records(key)).length, 0)
      const good = products.body()
      assertFresh(await post('/products', key, good))
    })
  }

  test('403 from authorization (a plain user on POST /products): no record', async () => {
    const user = await api.createUser()
    const key = newKey()
    const body = products.body()
    assertProblem(await post('/products', key, body, user.token), 403, 'insufficient_scope')
    assert.equal((await records(key)).length, 0)
    assert.equal(await products.rows(body), 0)
  })
})

describe('concurrent requests with one key', () => {
  for (const endpoint of endpoints) {
    test(
      `20 concurrent POST ${endpoint.path} with one key and body: one row, every answer 201 (one original, the ` +
        `rest replays) or 409 idempotency_key_in_use`,
      async () => {
        const key = newKey()
        const body = endpoint.body()
        const answers = await Promise.all(Array.from({ length: 20 }, () => post(endpoint.path, key, body)))
        assertOneRan(answers)
        assert.equal(await endpoint.rows(body), 1)
      },
    )
  }

  test(
    'a record still running (under a minute old) answers 409 idempotency_key_in_use with Retry-After and creates ' +
      'nothing',
    async () => {
      const key = newKey()
      const body = products.body()
      const first = await post('/products', key, body)
      assertFresh(first)
      await deleteProduct(first.body.id)
      await age(key, '50 seconds', true)
      const res = await post('/products', key, body)
      assertProblem(res, 409, 'idempotency_key_in_use')
      assert.equal(res.headers.get('retry-after'), '1')
      assert.equal(await products.rows(body), 0)
      assert.equal((await records(key))[0]?.status, null, 'the running record is left alone')
    },
  )
})

describe('two instances on one database', () => {
  test('created through one instance, replayed by the other; another body is 422 there too', async () => {
    const key = newKey()
    const body = products.body()
    const first = await post('/products', key, body)
    assertFresh(first)
    assertReplay(first, await postToSecond('/products', key, body))
    const other = products.body()
    assertProblem(await postToSecond('/products', key, other), 422, 'idempotency_key_reused')
    assert.equal(await products.rows(body), 1)
    assert.equal(await products.rows(other), 0)
  })

  test('20 concurrent requests split over both instances create one row', async () => {
    const key = newKey()
    const body = users.body()
    const answers = await Promise.all(
      Array.from({ length: 20 }, (_, i) => (i % 2 ? post('/users', key, body) : postToSecond('/users', key, body))),
    )
    assertOneRan(answers)
    assert.equal(await users.rows(body), 1)
  })
})

// ---------------------------------------------------------------------------
// Expiry and abandoned records

describe('expiry and abandoned records', () => {
  test('a record 23 hours old is still replayed', async () => {
    const key = newKey()
    const body = products.body()
    const first = await post('/products', key, body)
    await age(key, '23 hours')
    assertReplay(first, await post('/products', key, body))
    assert.equal(await products.rows(body), 1)
  })

  test(
    'a record over 24 hours old is not replayed: the request runs again (409 here, the product ' + 'exists)',
    async () => {
      const key = newKey()
      const body = products.body()
      assertFresh(await post('/products', key, body))
      await age(key, '25 hours')
      assertProblem(await post('/products', key, body), 409, 'sku_taken')
      assert.equal((await records(key)).length, 0, 'the expired record is gone')
    },
  )

  test(
    'a record over 24 hours old: once the product is gone the request creates it anew, and that answer is the new ' +
      'record',
    async () => {
      const key = newKey()
      const body = products.body()
      const first = await post('/products', key, body)
      await deleteProduct(first.body.id)
      await age(key, '25 hours')
      const again = await post('/products', key, body)
      assertFresh(again)
      assert.notEqual(again.body.id, first.body.id)
      assert.equal(await products.rows(body), 1)
      assertReplay(again, await post('/products', key, body))
    },
  )

  test('an expired key may be used with another body', async () => {
    const key = newKey()
    assertFresh(await post('/products', key, products.body()))
    await age(key, '25 hours')
    const other = products.body()
    assertFresh(await post('/products', key, other))
    assert.equal(await products.rows(other), 1)
  })

  test(
    'a running record abandoned for 2 minutes (its process died before the insert) is taken over: the request ' +
      'runs',
    async () => {
      const key = newKey()
      const body = products.body()
      const first = await post('/products', key, body)
      await deleteProduct(first.body.id)
      await age(key, '2 minutes', true)
      const taken = await post('/products', key, body)
      assertFresh(taken)
      assert.notEqual(taken.body.id, first.body.id)
      assert.equal(await products.rows(body), 1)
      assert.equal((await records(key))[0]?.status, 201)
    },
  )

  test('20 concurrent retries (over both instances) of an abandoned record: exactly one takes it over', async () => {
    for (let round = 0; round < 5; round++) {
      const key = newKey()
      const body = products.body()
      const first = await post('/products', key, body)
      await deleteProduct(first.body.id)
      await age(key, '2 minutes', true)
      const answers = await Promise.all(
        Array.from({ length: 20 }, (_, i) =>
          i % 2 ? post('/products', key, body) : postToSecond('/products', key, body),
        ),
      )
      assertOneRan(answers, `round ${round}: `)
      assert.equal(await products.rows(body), 1)
    }
  })
})
