import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { startServer, type TestResponse, type TestServer } from './helpers/server.js'

// REQUIRE_IF_MATCH=true: a PUT, PATCH or DELETE of a versioned resource
// (/users/{id}, /products/{id}) without If-Match is refused with 428
// precondition_required (RFC 6585 §3) before anything is read or written, so
// no client can overwrite a change it never saw. With the current ETag the
// write goes through; creating POSTs and unversioned resources are not
// affected; off by default, where If-Match stays optional.

const strict = await startServer({ REQUIRE_IF_MATCH: 'true' })
const lenient = await startServer()

// ---------------------------------------------------------------------------
// Helpers

let sequence = 0
const unique = (tag: string) => `${tag}-${process.pid}-${++sequence}`

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.match(res.headers.get('content-type') ?? '', /^application\/problem\+json/)
  assert.equal(res.body.code, code, res.text)
}

interface Resource {
  collection: '/users' | '/products'
  table: 'users' | 'products'
  create: () => Record<string, unknown>
  replace: () => Record<string, unknown>
  patch: () => Record<string, unknown>
}

const resources: Resource[] = [
  {
    collection: '/users',
    table: 'users',
    create: () => ({ name: 'Versioned User', email: `${unique('ifm')}@example.com` }),
    replace: () => ({ name: 'Replaced User', email: `${unique('ifm-put')}@example.com` }),
    patch: () => ({ name: 'Patched User' }),
  },
  {
    collection: '/products',
    table: 'products',
    create: () => ({ sku: unique('IFM'), name: 'Versioned Product', price: 500, currency: 'EUR' }),
    replace: () => ({ sku: unique('IFM-PUT'), name: 'Replaced Product', price: 700, currency: 'USD' }),
    patch: () => ({ name: 'Patched Product' }),
  },
]

type Write = 'PUT' | 'PATCH' | 'DELETE'
const writes: Write[] = ['PUT', 'PATCH', 'DELETE']

const bodyFor = (resource: Resource, method: Write) =>
  method === 'PUT' ? resource.replace() : method === 'PATCH' ? resource.patch() : undefined
const okStatus = (method: Write) => (method === 'DELETE' ? 204 : 200)

/** Creates a resource through the API; its id and ETag. */
async function create(server: TestServer, resource: Resource): Promise<{ id: number; etag: string }> {
  const res = await server.request('POST', resource.collection, { body: resource.create() })
  assert.equal(res.status, 201, res.text)
  return { id: res.body.id, etag: res.headers.get('etag')! }
}

const row = async (server: TestServer, table: string, id: number) =>
  (await server.sql<Array<Record<string, unknown>>>`SELECT * FROM ${server.sql(table)} WHERE id = ${id}`)[0]

// ---------------------------------------------------------------------------
// REQUIRE_IF_MATCH=true

for (const resource of resources) {
  describe(`REQUIRE_IF_MATCH=true on ${resource.collection}/{id}`, () => {
    for (const method of writes) {
      test(`${method} without If-Match is 428 precondition_required and changes nothing`, async () => {
        const { id } = await create(strict, resource)
        const before = await row(strict, resource.table, id)
        const res = await strict.request(method, `${resource.collection}/${id}`, { body: bodyFor(resource, method) })
        assertProblem(res, 428, 'precondition_required')
        assert.match(res.body.detail, /If-Match/)
        assert.deepEqual(await row(strict, resource.table, id), before, 'the row is untouched')
      })

      test(`${method} with the current ETag in If-Match succeeds (${okStatus(method)}) and writes`, async () => {
        const { id, etag } = await create(strict, resource)
        const res = await strict.request(method, `${resource.collection}/${id}`, {
          body: bodyFor(resource, method),
          headers: { 'if-match': etag },
        })
        assert.equal(res.status, okStatus(method), res.text)
        const after = await row(strict, resource.table, id)
        // Users and products go to the trash.
        if (method === 'DELETE') assert.ok(after?.deleted_at, 'in the trash')
        else {
          assert.equal(after?.version, 2)
          assert.equal(res.headers.get('etag'), '"v2"')
        }
      })

      test(`${method} with a stale ETag is 412 precondition_failed (not 428) and changes nothing`, async () => {
        const { id, etag } = await create(strict, resource)
        const bumped = await strict.request('PATCH', `${resource.collection}/${id}`, {
          body: resource.patch(),
          headers: { 'if-match': etag },
        })
        assert.equal(bumped.status, 200, bumped.text)
        const before = await row(strict, resource.table, id)
        const res = await strict.request(method, `${resource.collection}/${id}`, {
          body: bodyFor(resource, method),
          headers: { 'if-match': etag },
        })
        assertProblem(res, 412, 'precondition_failed')
        assert.deepEqual(await row(strict, resource.table, id), before)
      })
    }

    test('If-Match: * satisfies the requirement', async () => {
      const { id } = await create(strict, resource)
      const res = await strict.request('PATCH', `${resource.collection}/${id}`, {
        body: resource.patch(),
        headers: { 'if-match': '*' },
      })
      assert.equal(res.status, 200, res.text)
    })

    test('POST (creating) needs no If-Match', async () => {
      const res = await strict.request('POST', resource.collection, { body: resource.create() })
      assert.equal(res.status, 201, res.text)
      assert.ok(await row(strict, resource.table, res.body.id))
    })

    test('GET and HEAD need no If-Match', async () => {
      const { id } = await create(strict, resource)
      assert.equal((await strict.request('GET', `${resource.collection}/${id}`)).status, 200)
      assert.equal((await strict.request('HEAD', `${resource.collection}/${id}`)).status, 200)
    })
  })
}

describe('REQUIRE_IF_MATCH=true: ordering and scope', () => {
  test('a user writing their own record without If-Match gets 428; with it, 200', async () => {
    const user = await strict.createUser({ name: 'Self' })
    assertProblem(
      await strict.request('PATCH', `/users/${user.id}`, { auth: user.token, body: { name: 'Self 2' } }),
      428,
      'precondition_required',
    )
    const etag = (await strict.request('GET', `/users/${user.id}`, { auth: user.token })).headers.get('etag')!
    const res = await strict.request('PATCH', `/users/${user.id}`, {
      auth: user.token,
      body: { name: 'Self 2' },
      headers: { 'if-match': etag },
    })
    assert.equal(res.status, 200, res.text)
    assert.equal((await row(strict, 'users', user.id))?.name, 'Self 2')
  })

  test(
    'authentication and authorization come first: anonymous is 401 and another user’s record 403, not ' + '428',
    async () => {
      const [a, b] = [await strict.createUser(), await strict.createUser()]
      assertProblem(await strict.request('DELETE', `/users/${a.id}`, { auth: null }), 401, 'unauthorized')
      assertProblem(await strict.request('DELETE', `/users/${a.id}`, { auth: b.token }), 403, 'forbidden')
      assert.ok(await row(strict, 'users', a.id))
    },
  )

  test('an unversioned resource (DELETE /api-keys/{id}) needs no If-Match', async () => {
    const created = await strict.request('POST', '/api-keys', {
      body: { name: 'unversioned', scopes: ['products:read'] },
    })
    assert.equal(created.status, 201, created.text)
    const res = await strict.request('DELETE', `/api-keys/${created.body.id}`)
    assert.equal(res.status, 204, res.text)
  })
})

// ---------------------------------------------------------------------------
// Off (the default)

for (const resource of resources) {
  describe(`REQUIRE_IF_MATCH off (default) on ${resource.collection}/{id}`, () => {
    for (const method of writes) {
      test(`${method} without If-Match succeeds (${okStatus(method)}) and writes`, async () => {
        const { id } = await create(lenient, resource)
        const res = await lenient.request(method, `${resource.collection}/${id}`, { body: bodyFor(resource, method) })
        assert.equal(res.status, okStatus(method), res.text)
        const after = await row(lenient, resource.table, id)
        // Users and products go to the trash.
        if (method === 'DELETE') assert.ok(after?.deleted_at, 'in the trash')
        else assert.equal(after?.version, 2)
      })
    }

    test('If-Match, when sent, is still checked: a stale one is 412', async () => {
      const { id, etag } = await create(lenient, resource)
      assert.equal(
        (await lenient.request('PATCH', `${resource.collection}/${id}`, { body: resource.patch() })).status,
        200,
      )
      assertProblem(
        await lenient.request('DELETE', `${resource.collection}/${id}`, { headers: { 'if-match': etag } }),
        412,
        'precondition_failed',
      )
      assert.ok(await row(lenient, resource.table, id))
    })
  })
}
