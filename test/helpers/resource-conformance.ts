import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { scopesOfResource } from '../../src/auth/scopes.js'
import type { Resource } from '../../src/core/resources/resource.js'
import type { TestServer } from './server.js'
import { startReceiver } from './webhook-receiver.js'

// What every declared resource must do, checked the same way for each: a
// real one (products) and one declared only for the tests (categories,
// test/resource-conformance.test.ts). A resource that passes these got
// create, read, replace, patch and delete, ETags, idempotency, collections,
// access by scope, its unique problem, events, webhooks and OpenAPI from its
// declaration and its line in the registry alone.

export interface ResourceSpec {
  /** Its declaration: names, path, table, uniques and event types are read from it. */
  resource: Resource
  /** A valid create body; `n` makes it unique. Its `sortable` member is `sortValue(n)`. */
  create(n: number): Record<string, unknown>
  /** A valid full replacement. */
  replace(n: number): Record<string, unknown>
  /** A member a client may patch, and a valid value for it. */
  patch: [string, unknown]
  /** A member a patch may reset with null, and the default it goes back to. */
  resettable: [string, unknown]
  /** A sortable member (filters, sorts, cursors), and its value in `create(n)`, ordered as n is. */
  sortable: string
  sortValue(n: number): string | number
  /** A valid create body whose unique member repeats that of `create(n)`. */
  duplicate(n: number): Record<string, unknown>
  /** Whether a signed-in user who is no admin may read it, and write it (its declared access). */
  userMay: { read: boolean; write: boolean }
}

export function resourceConformance(api: TestServer, spec: ResourceSpec): void {
  const { resource } = spec
  const { name, plural, path, table } = resource
  let counter = 1_000_000 + Math.floor(Math.random() * 1000) * 1000
  const next = () => ++counter
  const rowCount = async () => Number((await api.sql.unsafe(`SELECT count(*) AS n FROM ${table}`))[0]!.n)
  const create = async (n = next()) => {
    const res = await api.request('POST', path, { body: spec.create(n) })
    assert.equal(res.status, 201, res.text)
    return res
  }
  const value = (n: number) => encodeURIComponent(String(spec.sortValue(n)))

  describe(`${name}: the generic resource contract`, () => {
    test(
      'POST answers 201 with Location and ETag; GET answers the same representation; the row is ' + 'stored',
      async () => {
        const created = await create()
        const location = created.headers.get('location')!
        assert.equal(location, `${path}/${created.body.id}`)
        assert.equal(created.headers.get('etag'), '"v1"')
        const read = await api.request('GET', location)
        assert.equal(read.status, 200)
        assert.deepEqual(read.body, created.body)
        assert.equal(read.headers.get('etag'), '"v1"')
        const [row] = await api.sql.unsafe(`SELECT id FROM ${table} WHERE id = $1`, [created.body.id])
        assert.ok(row)
      },
    )

    test('If-None-Match with the current ETag answers 304 without a body', async () => {
      const created = await create()
      const res = await api.request('GET', `${path}/${created.body.id}`, { headers: { 'if-none-match': '"v1"' } })
      assert.equal(res.status, 304)
      assert.equal(res.text, '')
    })

    test('Idempotency-Key: a retried POST replays the first answer and creates one row', async () => {
      const body = spec.create(next())
      const before = await rowCount()
      const first = await api.request('POST', path, { body, headers: { 'idempotency-key': `k-${next()}` } })
      const key = first.headers.get('location')
      assert.equal(first.status, 201, first.text)
      const again = await api.request('POST', path, { body, headers: { 'idempotency-key': `k-${counter}` } })
      assert.equal(again.status, 201)
      assert.equal(again.headers.get('idempotent-replayed'), 'true')
      assert.equal(again.headers.get('location'), key)
      assert.deepEqual(again.body, first.body)
      assert.equal(await rowCount(), before + 1)
    })

    test(
      'a duplicate of its unique member is a 409 with the code and title its declaration names; nothing is ' + 'stored',
      async () => {
        const n = next()
        await create(n)
        const before = await rowCount()
        const [problem] = resource.uniqueCodes.values()
        assert.ok(problem, `${name} declares a unique member`)
        const res = await api.request('POST', path, { body: spec.duplicate(n) })
        assert.equal(res.status, 409, res.text)
        assert.equal(res.body.code, problem.code)
        assert.equal(res.body.title, resource.problems[problem.code]!.title)
        assert.equal(await rowCount(), before)
      },
    )

    test('PUT with the current If-Match replaces; a stale If-Match is 412 and changes nothing', async () => {
      const created = await create()
      const url = `${path}/${created.body.id}`
      const replacement = spec.replace(next())
      const put = await api.request('PUT', url, { body: replacement, headers: { 'if-match': '"v1"' } })
      assert.equal(put.status, 200, put.text)
      assert.equal(put.headers.get('etag'), '"v2"')
      for (const [member, given] of Object.entries(replacement)) assert.deepEqual(put.body[member], given, member)
      const stale = await api.request('PUT', url, { body: spec.replace(next()), headers: { 'if-match': '"v1"' } })
      assert.equal(stale.status, 412)
      assert.equal(stale.body.code, 'precondition_failed')
      assert.deepEqual((await api.request('GET', url)).body, put.body)
    })

    test(
      'PATCH sets the members sent; null resets a member with a default; an unchanged patch keeps the ' + 'ETag',
      async () => {
        const created = await create()
        const url = `${path}/${created.body.id}`
        const [member, given] = spec.patch
        const patched = await api.request('PATCH', url, { body: { [member]: given }, headers: { 'if-match': '"v1"' } })
        assert.equal(patched.status, 200, patched.text)
        assert.deepEqual(patched.body[member], given)
        const [resettable, fallback] = spec.resettable
        const reset = await api.request('PATCH', url, { body: { [resettable]: null } })
        assert.equal(reset.status, 200, reset.text)
        assert.deepEqual(reset.body[resettable], fallback)
        const same = await api.request('PATCH', url, { body: {} })
        assert.equal(same.headers.get('etag'), reset.headers.get('etag'))
      },
    )

    test(
      'hostile bodies are refused and change nothing: unknown member, wrong type, NUL, huge value, wrong content ' +
        'type, an echoed foreign id',
      async () => {
        const created = await create()
        const url = `${path}/${created.body.id}`
        const before = await rowCount()
        const valid = spec.create(next())
        const wrongType = typeof valid[spec.sortable] === 'string' ? 7 : 'seven'
        const hostile: Array<[string, unknown, number]> = [
          ['unknown member', { ...valid, admin: true }, 422],
          ['wrong type', { ...valid, [spec.sortable]: wrongType }, 422],
          ['huge number', { ...valid, [spec.sortable]: 1e300 }, 422],
          [
            'NUL',
            Object.fromEntries(Object.entries(valid).map(([k, v]) => [k, typeof v === 'string' ? `${v}\u0000` : v])),
            422,
          ],
          ['array', [valid], 422],
          ['malformed JSON', '{"a":', 400],
        ]
        for (const [what, body, status] of hostile) {
          const res = await api.request('POST', path, { body })
          assert.equal(res.status, status, `${what}: ${res.text}`)
        }
        const textPlain = await api.request('POST', path, {
          body: JSON.stringify(valid),
          headers: { 'content-type': 'text/plain' },
        })
        assert.equal(textPlain.status, 415)
        const foreignId = await api.request('PUT', url, { body: { ...spec.replace(next()), id: created.body.id + 1 } })
        assert.equal(foreignId.status, 422)
        assert.equal(await rowCount(), before)
        assert.deepEqual((await api.request('GET', url)).body, created.body)
      },
    )

    test('DELETE with If-Match answers 204; the resource is then 404, and gone from the table (or in its trash)', async () => {
      const created = await create()
      const url = `${path}/${created.body.id}`
      assert.equal((await api.request('DELETE', url, { headers: { 'if-match': '"v2"' } })).status, 412)
      const res = await api.request('DELETE', url, { headers: { 'if-match': '"v1"' } })
      assert.equal(res.status, 204)
      assert.equal((await api.request('GET', url)).status, 404)
      const rows = await api.sql.unsafe(`SELECT * FROM ${table} WHERE id = $1`, [created.body.id])
      if (resource.trash) assert.ok(rows[0]?.deleted_at, 'in the trash')
      else assert.equal(rows.length, 0)
    })

    test('the collection filters, sorts, pages by cursor and counts', async () => {
      const base = next()
      counter += 5
      const ids: number[] = []
      for (let i = 0; i < 5; i++) ids.push((await create(base + i)).body.id)
      const member = spec.sortable
      const filter = `${member}[gte]=${value(base)}&${member}[lte]=${value(base + 4)}`
      const seen: number[] = []
      let url: string | undefined = `${path}?${filter}&sort=-${member}&limit=2&count=true`
      while (url) {
        const page = await api.request('GET', url)
        assert.equal(page.status, 200, page.text)
        assert.equal(page.headers.get('x-total-count'), '5')
        seen.push(...page.body.map((r: { id: number }) => r.id))
        url = /<([^>]+)>; rel="next"/.exec(page.headers.get('link') ?? '')?.[1]
      }
      assert.deepEqual(seen, [...ids].reverse())
      const listed = await api.request(
        'GET',
        `${path}?${member}[in]=${value(base)},${value(base + 2)}&fields=id&sort=id`,
      )
      assert.deepEqual(listed.body, [{ id: ids[0] }, { id: ids[2] }])
      const bad = await api.request('GET', `${path}?id[gt]=many`)
      assert.equal(bad.status, 400)
      assert.equal(bad.body.errors[0].path, 'id[gt]')
    })

    test(
      'its scopes and roles decide who reads and writes: a user, a credential without the scope, an ' + 'admin',
      async () => {
        const scopes = scopesOfResource(resource)
        assert.ok(
          api.deps.registry.scopes.all.includes(scopes.read) && api.deps.registry.scopes.all.includes(scopes.write),
        )
        const user = await api.createUser()
        const created = await create()
        const read = await api.request('GET', `${path}/${created.body.id}`, { auth: user.token })
        assert.equal(read.status, spec.userMay.read ? 200 : 403, read.text)
        const write = await api.request('POST', path, { body: spec.create(next()), auth: user.token })
        assert.equal(write.status, spec.userMay.write ? 201 : 403, write.text)
        const readOnly = api.jwtFor(api.admin.id, 'admin', [scopes.read])
        assert.equal((await api.request('GET', path, { auth: readOnly })).status, 200)
        const refused = await api.request('POST', path, { body: spec.create(next()), auth: readOnly })
        assert.equal(refused.status, 403)
        assert.equal(refused.body.code, 'insufficient_scope')
        assert.equal(
          (await api.request('GET', path, { auth: api.jwtFor(api.admin.id, 'admin', [scopes.write]) })).status,
          403,
        )
      },
    )

    test('each write records its event, with the representation as its data', async () => {
      const created = await create()
      const url = `${path}/${created.body.id}`
      const patched = await api.request('PATCH', url, { body: { [spec.patch[0]]: spec.patch[1] } })
      assert.equal(patched.status, 200, patched.text)
      assert.equal(
        (await api.request('DELETE', url, { headers: { 'if-match': patched.headers.get('etag')! } })).status,
        204,
      )
      await api.published()
      const { subject, created: createdType, updated, deleted } = resource.events
      const feed = await api.request('GET', `/events?subject_type=${subject}&subject_id=${created.body.id}`)
      assert.equal(feed.status, 200, feed.text)
      assert.deepEqual(
        feed.body.map((e: { type: string }) => e.type),
        [createdType, updated, deleted],
      )
      assert.deepEqual(feed.body[0].data, created.body)
      assert.deepEqual(feed.body[1].data, patched.body)
    })

    test('a webhook may subscribe to its event types and receives them', async () => {
      const types = [resource.events.created, resource.events.updated, resource.events.deleted]
      for (const type of types) assert.ok(api.deps.registry.eventTypes.includes(type), type)
      const receiver = await startReceiver()
      const hook = await api.request('POST', '/webhooks', { body: { url: receiver.url, event_types: types } })
      assert.equal(hook.status, 201, hook.text)
      const created = await create()
      await receiver.waitFor(`the ${resource.events.created} of ${created.body.id}`, (received) =>
        received.some((r) => {
          const message = JSON.parse(r.body) as { type: string; data: unknown }
          return (
            message.type === resource.events.created && JSON.stringify(message.data).includes(`"id":${created.body.id}`)
          )
        }),
      )
      assert.equal((await api.request('DELETE', `/webhooks/${hook.body.id}`)).status, 204)
    })

    test('/openapi.json names its schemas, operations and problem code', async () => {
      const doc = (await api.request('GET', '/openapi.json', { auth: null })).body
      for (const suffix of ['', 'Page', 'Create', 'Replace', 'Patch'])
        assert.ok(doc.components.schemas[`${name}${suffix}`], `${name}${suffix}`)
      const ids = [
        doc.paths[path].get,
        doc.paths[path].post,
        doc.paths[`${path}/{id}`].get,
        doc.paths[`${path}/{id}`].put,
        doc.paths[`${path}/{id}`].patch,
        doc.paths[`${path}/{id}`].delete,
      ].map((op) => op.operationId)
      assert.deepEqual(ids, [
        `list${plural}`,
        `create${name}`,
        `get${name}`,
        `replace${name}`,
        `update${name}`,
        `delete${name}`,
      ])
      assert.equal(
        doc.paths[path].post.requestBody.content['application/json'].schema.$ref,
        `#/components/schemas/${name}Create`,
      )
      assert.equal(
        doc.paths[`${path}/{id}`].get.responses['200'].content['application/json'].schema.$ref,
        `#/components/schemas/${name}`,
      )
      assert.deepEqual(doc.paths[path].post.security, [
        { bearerAuth: [scopesOfResource(resource).write] },
        { identityProviderAuth: [scopesOfResource(resource).write] },
        { apiKeyAuth: [scopesOfResource(resource).write] },
      ])
      const codes = doc.components.schemas.Problem.properties.code.anyOf.map((c: { const: string }) => c.const)
      for (const { code } of resource.uniqueCodes.values()) assert.ok(codes.includes(code), code)
    })
  })
}
