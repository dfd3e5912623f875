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
// declaration and its line in the registry alone; one with `trash: true`, its
// trash too (trashConformance below).

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
  genericConformance(api, spec)
  batchConformance(api, spec)
  if (spec.resource.trash) trashConformance(api, spec)
}

/** Its operations in POST /batch (docs/api.md, "Batches"): one transaction, each operation as it would be alone. */
function batchConformance(api: TestServer, spec: ResourceSpec): void {
  const { resource } = spec
  const { name, path, table, events } = resource
  let counter = 3_000_000 + Math.floor(Math.random() * 1000) * 1000
  const next = () => ++counter
  const rowCount = async () => Number((await api.sql.unsafe(`SELECT count(*) AS n FROM ${table}`))[0]!.n)
  const eventsOf = async (requestId: string) => {
    await api.published()
    return (await api.sql`SELECT type, subject_id FROM events WHERE request_id = ${requestId} ORDER BY id`).map((e) => [
      e.type,
      e.subject_id,
    ])
  }

  describe(`${name}: in a batch`, () => {
    test('create, change by reference, read and delete in one batch, each answered and recorded as alone', async () => {
      const requestId = `batch-${name}-${next()}`
      const [first, second] = [spec.create(next()), spec.create(next())]
      const res = await api.request('POST', '/batch', {
        headers: { 'x-request-id': requestId },
        body: {
          operations: [
            { method: 'POST', path, body: first },
            { method: 'POST', path, body: second },
            { method: 'PATCH', path: `${path}/{0.id}`, body: { [spec.patch[0]]: spec.patch[1] }, if_match: '"v1"' },
            { method: 'GET', path: `${path}/{1.id}` },
            { method: 'DELETE', path: `${path}/{1.id}`, if_match: '"v1"' },
          ],
        },
      })
      assert.equal(res.status, 200, res.text)
      const results = res.body.results as Array<{ status: number; location?: string; etag?: string; body?: any }>
      assert.deepEqual(
        results.map((r) => r.status),
        [201, 201, 200, 200, 204],
      )
      const [a, b] = [results[0]!.body.id as number, results[1]!.body.id as number]
      assert.equal(results[0]!.location, `${path}/${a}`)
      assert.deepEqual(results[2]!.body[spec.patch[0]], spec.patch[1])
      assert.equal(results[2]!.etag, '"v2"')
      assert.deepEqual((await api.request('GET', `${path}/${a}`)).body, results[2]!.body)
      assert.equal((await api.request('GET', `${path}/${b}`)).status, 404)
      assert.deepEqual(await eventsOf(requestId), [
        [events.created, a],
        [events.created, b],
        [events.updated, a],
        [events.deleted, b],
      ])
    })

    test('its unique member taken by the last operation: 409 with that index, no row and no event', async () => {
      const requestId = `batch-${name}-${next()}`
      const n = next()
      const [problem] = resource.uniqueCodes.values()
      const before = await rowCount()
      const res = await api.request('POST', '/batch', {
        headers: { 'x-request-id': requestId },
        body: {
          operations: [
            { method: 'POST', path, body: spec.create(n) },
            { method: 'POST', path, body: spec.create(next()) },
            { method: 'POST', path, body: spec.duplicate(n) },
          ],
        },
      })
      assert.equal(res.status, 409, res.text)
      assert.equal(res.body.code, problem!.code)
      assert.equal(res.body.operation, 2)
      assert.equal(await rowCount(), before)
      assert.deepEqual(await eventsOf(requestId), [])
    })

    if (resource.trash) {
      test('to the trash and back in one batch; a purge in a batch', async () => {
        const res = await api.request('POST', '/batch', {
          body: {
            operations: [
              { method: 'POST', path, body: spec.create(next()) },
              { method: 'DELETE', path: `${path}/{0.id}` },
              { method: 'POST', path: `${path}/{0.id}/restore` },
              { method: 'DELETE', path: `${path}/{0.id}?permanent=true` },
            ],
          },
        })
        assert.equal(res.status, 200, res.text)
        assert.deepEqual(
          res.body.results.map((r: { status: number }) => r.status),
          [201, 204, 200, 204],
        )
        const id = res.body.results[0].body.id as number
        assert.equal(res.body.results[2].body.id, id)
        assert.deepEqual([...(await api.sql.unsafe(`SELECT id FROM ${table} WHERE id = $1`, [id]))], [])
      })
    }
  })
}

function genericConformance(api: TestServer, spec: ResourceSpec): void {
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

    test(
      'DELETE with If-Match answers 204; the resource is then 404, and gone from the table (or in its ' + 'trash)',
      async () => {
        const created = await create()
        const url = `${path}/${created.body.id}`
        assert.equal((await api.request('DELETE', url, { headers: { 'if-match': '"v2"' } })).status, 412)
        const res = await api.request('DELETE', url, { headers: { 'if-match': '"v1"' } })
        assert.equal(res.status, 204)
        assert.equal((await api.request('GET', url)).status, 404)
        const rows = await api.sql.unsafe(`SELECT * FROM ${table} WHERE id = $1`, [created.body.id])
        if (resource.trash) assert.ok(rows[0]?.deleted_at, 'in the trash')
        else assert.equal(rows.length, 0)
      },
    )

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

/** Whether `url` lists the id, following its next links. */
async function listedIds(api: TestServer, url: string): Promise<number[]> {
  const ids: number[] = []
  for (let next: string | undefined = url; next;) {
    const page = await api.request('GET', next)
    assert.equal(page.status, 200, page.text)
    ids.push(...page.body.map((r: { id: number }) => r.id))
    next = /<([^>]+)>; rel="next"/.exec(page.headers.get('link') ?? '')?.[1]
  }
  return ids
}

/**
 * The trash of a resource that declares one: a DELETE moves a row there (404 to reads, absent from lists, filters and
 * counts, its unique member free), an admin lists it (`?trashed=true`, the same filters, sorts and pages, with
 * `deleted_at`), restores a row (`POST …/restore`, 409 when its unique member was taken meanwhile), purges one at
 * once (`?permanent=true`), and the service purges what has been there for TRASH_RETENTION (job trash.purge, on the
 * service's clock); each step is an event a webhook may subscribe to.
 */
function trashConformance(api: TestServer, spec: ResourceSpec): void {
  const { resource } = spec
  const { name, path, table } = resource
  const { subject, created: createdType, deleted, restored, purged } = resource.events
  let counter = 2_000_000 + Math.floor(Math.random() * 1000) * 1000
  const next = () => ++counter
  const create = async (n = next()) => {
    const res = await api.request('POST', path, { body: spec.create(n) })
    assert.equal(res.status, 201, res.text)
    return res.body as { id: number } & Record<string, unknown>
  }
  const remove = async (id: number, query = '') => {
    const res = await api.request('DELETE', `${path}/${id}${query}`)
    assert.equal(res.status, 204, res.text)
  }
  const stored = async (id: number) =>
    (await api.sql.unsafe(`SELECT id, deleted_at FROM ${table} WHERE id = $1`, [id]))[0] as unknown as
      { id: number; deleted_at: string | null } | undefined
  const value = (n: number) => encodeURIComponent(String(spec.sortValue(n)))
  const member = spec.sortable

  describe(`${name}: the trash`, () => {
    test('a deleted one is 404 to reads and writes, absent from lists, filters and counts; its row waits', async () => {
      const n = next()
      const item = await create(n)
      const url = `${path}/${item.id}`
      await remove(item.id)
      assert.equal((await api.request('GET', url)).status, 404)
      assert.equal((await api.request('PATCH', url, { body: { [spec.patch[0]]: spec.patch[1] } })).status, 404)
      assert.equal((await api.request('PUT', url, { body: spec.replace(next()) })).status, 404)
      assert.equal((await api.request('DELETE', url)).status, 404)
      const filtered = await api.request('GET', `${path}?${member}=${value(n)}&count=true`)
      assert.deepEqual(filtered.body, [])
      assert.equal(filtered.headers.get('x-total-count'), '0')
      assert.ok(!(await listedIds(api, `${path}?id=${item.id}`)).includes(item.id))
      assert.ok((await stored(item.id))?.deleted_at, 'the row is in the trash')
    })

    test('its unique member is free once it is in the trash', async () => {
      const n = next()
      const item = await create(n)
      await remove(item.id)
      const again = await api.request('POST', path, { body: spec.duplicate(n) })
      assert.equal(again.status, 201, again.text)
    })

    test('?trashed=true lists the trash with the same filters, sorts, pages and counts, with deleted_at', async () => {
      const base = next()
      counter += 5
      const ids: number[] = []
      for (let i = 0; i < 5; i++) ids.push((await create(base + i)).id)
      for (const id of ids.slice(0, 4)) await remove(id)
      const filter = `${member}[gte]=${value(base)}&${member}[lte]=${value(base + 4)}`
      const seen: Array<{ id: number; deleted_at: string }> = []
      let url: string | undefined = `${path}?trashed=true&${filter}&sort=-${member}&limit=3&count=true`
      while (url) {
        const page = await api.request('GET', url)
        assert.equal(page.status, 200, page.text)
        assert.equal(page.headers.get('x-total-count'), '4')
        seen.push(...page.body)
        url = /<([^>]+)>; rel="next"/.exec(page.headers.get('link') ?? '')?.[1]
      }
      assert.deepEqual(
        seen.map((r) => r.id),
        ids.slice(0, 4).reverse(),
      )
      for (const item of seen) assert.match(item.deleted_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/)
      const live = await api.request('GET', `${path}?${filter}&trashed=false&count=true`)
      assert.deepEqual(
        live.body.map((r: { id: number }) => r.id),
        [ids[4]],
      )
      assert.equal(live.headers.get('x-total-count'), '1')
      const fields = await api.request('GET', `${path}?trashed=true&id=${ids[0]}&fields=id,deleted_at`)
      assert.deepEqual(Object.keys(fields.body[0]), ['id', 'deleted_at'])
      // A cursor of the live list is not one of the trash's.
      const livePage = await api.request('GET', `${path}?${filter}&limit=1&trashed=false`)
      const cursor = /cursor=([^&>]+)/.exec(livePage.headers.get('link') ?? '')
      if (cursor) {
        const crossed = await api.request('GET', `${path}?${filter}&limit=1&trashed=true&cursor=${cursor[1]}`)
        assert.equal(crossed.status, 400, crossed.text)
      }
      // The live list never shows deleted_at.
      assert.equal((await api.request('GET', `${path}?fields=deleted_at`)).status, 400)
    })

    test('POST …/restore brings it back as it was (200, a new ETag); live and missing ids are 404', async () => {
      const item = await create()
      await remove(item.id)
      const res = await api.request('POST', `${path}/${item.id}/restore`)
      assert.equal(res.status, 200, res.text)
      assert.deepEqual(res.body, item)
      assert.equal(res.headers.get('etag'), '"v3"')
      const read = await api.request('GET', `${path}/${item.id}`)
      assert.equal(read.status, 200)
      assert.deepEqual(read.body, item)
      assert.equal((await stored(item.id))?.deleted_at, null)
      assert.ok((await listedIds(api, `${path}?id=${item.id}`)).includes(item.id))
      const live = await api.request('POST', `${path}/${item.id}/restore`)
      assert.equal(live.status, 404)
      assert.equal(live.body.code, 'not_found')
      assert.equal((await api.request('POST', `${path}/9007199254740993/restore`)).status, 404)
      assert.equal((await api.request('POST', `${path}/abc/restore`)).status, 404)
    })

    test(
      'a restore whose unique member was taken meanwhile is a 409 with its code, and it stays in the ' + 'trash',
      async () => {
        const n = next()
        const item = await create(n)
        await remove(item.id)
        assert.equal((await api.request('POST', path, { body: spec.duplicate(n) })).status, 201)
        const res = await api.request('POST', `${path}/${item.id}/restore`)
        assert.equal(res.status, 409, res.text)
        const [problem] = resource.uniqueCodes.values()
        assert.equal(res.body.code, problem!.code)
        assert.ok((await stored(item.id))?.deleted_at, 'still in the trash')
      },
    )

    test('DELETE ?permanent=true purges a live or a trashed one at once; then nothing can bring it back', async () => {
      const live = await create()
      const trashed = await create()
      await remove(trashed.id)
      await remove(live.id, '?permanent=true')
      await remove(trashed.id, '?permanent=true')
      for (const { id } of [live, trashed]) {
        assert.equal(await stored(id), undefined)
        assert.equal((await api.request('POST', `${path}/${id}/restore`)).status, 404)
        assert.equal((await api.request('DELETE', `${path}/${id}?permanent=true`)).status, 404)
        assert.ok(!(await listedIds(api, `${path}?trashed=true&id=${id}`)).includes(id))
      }
    })

    test('hostile input: trashed=yes, permanent=1, a caller who is no admin; nothing changes', async () => {
      const item = await create()
      const trashedOne = await create()
      await remove(trashedOne.id)
      const bad = await api.request('GET', `${path}?trashed=yes`)
      assert.equal(bad.status, 400)
      assert.equal(bad.body.code, 'invalid_parameter')
      assert.equal(bad.body.errors[0].path, 'trashed')
      const permanent1 = await api.request('DELETE', `${path}/${item.id}?permanent=1`)
      assert.equal(permanent1.status, 400)
      assert.equal(permanent1.body.errors[0].path, 'permanent')
      assert.equal((await api.request('DELETE', `${path}/${item.id}?purge=true`)).status, 400)
      const user = await api.createUser()
      const asUser = { auth: user.token }
      const listed = await api.request('GET', `${path}?trashed=true`, asUser)
      assert.equal(listed.status, 403, listed.text)
      assert.equal((await api.request('POST', `${path}/${trashedOne.id}/restore`, asUser)).status, 403)
      assert.equal((await api.request('DELETE', `${path}/${item.id}?permanent=true`, asUser)).status, 403)
      // An admin credential without the write scope may look at the trash, not restore or purge.
      const { read } = scopesOfResource(resource)
      const readOnly = { auth: api.jwtFor(api.admin.id, 'admin', [read]) }
      assert.equal((await api.request('GET', `${path}?trashed=true`, readOnly)).status, 200)
      const refused = await api.request('POST', `${path}/${trashedOne.id}/restore`, readOnly)
      assert.equal(refused.status, 403)
      assert.equal(refused.body.code, 'insufficient_scope')
      assert.equal((await api.request('GET', `${path}/${item.id}`)).status, 200)
      assert.ok((await stored(trashedOne.id))?.deleted_at)
    })

    test('each step is an event (deleted, restored, purged: the id alone), and a webhook may subscribe', async () => {
      for (const type of [restored, purged]) assert.ok(api.deps.registry.eventTypes.includes(type), type)
      const receiver = await startReceiver()
      const hook = await api.request('POST', '/webhooks', {
        body: { url: receiver.url, event_types: [restored, purged] },
      })
      assert.equal(hook.status, 201, hook.text)
      try {
        const item = await create()
        await remove(item.id)
        assert.equal((await api.request('POST', `${path}/${item.id}/restore`)).status, 200)
        await remove(item.id)
        await remove(item.id, '?permanent=true')
        await api.published()
        const feed = await api.request('GET', `/events?subject_type=${subject}&subject_id=${item.id}`)
        assert.deepEqual(
          feed.body.map((e: { type: string }) => e.type),
          [createdType, deleted, restored, deleted, purged],
        )
        assert.deepEqual(feed.body[1].data, item)
        assert.deepEqual(feed.body[2].data, item)
        assert.deepEqual(feed.body[4].data, { id: item.id })
        await receiver.waitFor(`the ${restored} and ${purged} of ${item.id}`, (received) => {
          const types = received
            .map((r) => JSON.parse(r.body) as { type: string; data: { id: number } })
            .filter((m) => m.data.id === item.id)
            .map((m) => m.type)
          return types.includes(restored) && types.includes(purged)
        })
      } finally {
        assert.equal((await api.request('DELETE', `/webhooks/${hook.body.id}`)).status, 204)
        await receiver.close()
      }
    })

    test('the service purges what has been in the trash for TRASH_RETENTION (job trash.purge, its clock)', async () => {
      const item = await create()
      const kept = await create()
      await remove(item.id)
      // Deleted at the service's now (the clock may have moved ahead of the database's already, in an earlier test).
      await api.sql.unsafe(`UPDATE ${table} SET deleted_at = $1 WHERE id = $2`, [
        new Date(api.clock.now()).toISOString(),
        item.id,
      ])
      await api.deps.trash.sweep()
      assert.ok(await stored(item.id), 'not due yet')
      api.clock.advance(api.deps.config.trashRetention * 1000 + 1000)
      // Tokens signed before the jump have expired on the service's clock.
      await api.renewAdminToken()
      assert.ok((await api.deps.trash.sweep()) >= 1)
      assert.equal(await stored(item.id), undefined)
      assert.ok(await stored(kept.id), 'a live one stays')
      await api.published()
      const feed = await api.request('GET', `/events?subject_type=${subject}&subject_id=${item.id}&type=${purged}`)
      assert.equal(feed.body.length, 1)
      assert.deepEqual(feed.body[0].actor, { user_id: null, credential: 'system' })
      assert.deepEqual(feed.body[0].data, { id: item.id })
    })

    test('/openapi.json names the restore operation and the trashed and permanent parameters', async () => {
      const doc = (await api.request('GET', '/openapi.json', { auth: null })).body
      const restore = doc.paths[`${path}/{id}/restore`].post
      assert.equal(restore.operationId, `restore${name}`)
      assert.equal(restore.responses['200'].content['application/json'].schema.$ref, `#/components/schemas/${name}`)
      for (const status of ['403', '404', '409']) assert.ok(restore.responses[status], status)
      const names = (op: { parameters: Array<{ name: string; examples?: unknown }> }) =>
        op.parameters.map((p) => p.name)
      assert.ok(names(doc.paths[path].get).includes('trashed'))
      assert.ok(names(doc.paths[`${path}/{id}`].delete).includes('permanent'))
      const page = doc.components.schemas[`${name}Page`]
      assert.ok(page.items.properties.deleted_at, 'a page item may carry deleted_at')
    })
  })
}
