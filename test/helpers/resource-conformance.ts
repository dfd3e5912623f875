import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import type { TestServer } from './server.js'

// What every declared resource must do, checked the same way for each: a
// real one (products) and one declared only for the tests (widgets). A
// resource that passes these got create, read, replace, patch and delete,
// ETags, idempotency, collections and OpenAPI from its declaration alone.

export interface ResourceSpec {
  /** The OpenAPI component name, e.g. 'Product'. */
  name: string
  path: string
  table: string
  /** A valid create body; `n` makes it unique. Its `numeric` member must be `n`. */
  create(n: number): Record<string, unknown>
  /** A valid full replacement. */
  replace(n: number): Record<string, unknown>
  /** A member a client may patch, and a valid value for it. */
  patch: [string, unknown]
  /** A member a patch may reset with null, and the default it goes back to. */
  resettable: [string, unknown]
  /** A sortable integer member (filters, sorts, cursors). */
  numeric: string
}

export function resourceConformance(api: TestServer, spec: ResourceSpec): void {
  const { path } = spec
  let counter = 1_000_000 + Math.floor(Math.random() * 1000) * 1000
  const next = () => ++counter
  const rowCount = async () => Number((await api.sql.unsafe(`SELECT count(*) AS n FROM ${spec.table}`))[0]!.n)
  const create = async (n = next()) => {
    const res = await api.request('POST', path, { body: spec.create(n) })
    assert.equal(res.status, 201, res.text)
    return res
  }

  describe(`${spec.name}: the generic resource contract`, () => {
    test('POST answers 201 with Location and ETag; GET answers the same representation; the row is stored', async () => {
      const created = await create()
      const location = created.headers.get('location')!
      assert.equal(location, `${path}/${created.body.id}`)
      assert.equal(created.headers.get('etag'), '"v1"')
      const read = await api.request('GET', location)
      assert.equal(read.status, 200)
      assert.deepEqual(read.body, created.body)
      assert.equal(read.headers.get('etag'), '"v1"')
      const [row] = await api.sql.unsafe(`SELECT id FROM ${spec.table} WHERE id = $1`, [created.body.id])
      assert.ok(row)
    })

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

    test('PUT with the current If-Match replaces; a stale If-Match is 412 and changes nothing', async () => {
      const created = await create()
      const url = `${path}/${created.body.id}`
      const replacement = spec.replace(next())
      const put = await api.request('PUT', url, { body: replacement, headers: { 'if-match': '"v1"' } })
      assert.equal(put.status, 200, put.text)
      assert.equal(put.headers.get('etag'), '"v2"')
      for (const [member, value] of Object.entries(replacement)) assert.deepEqual(put.body[member], value, member)
      const stale = await api.request('PUT', url, { body: spec.replace(next()), headers: { 'if-match': '"v1"' } })
      assert.equal(stale.status, 412)
      assert.equal(stale.body.code, 'precondition_failed')
      assert.deepEqual((await api.request('GET', url)).body, put.body)
    })

    test('PATCH sets the members sent; null resets a member with a default; an unchanged patch keeps the ETag', async () => {
      const created = await create()
      const url = `${path}/${created.body.id}`
      const [member, value] = spec.patch
      const patched = await api.request('PATCH', url, { body: { [member]: value }, headers: { 'if-match': '"v1"' } })
      assert.equal(patched.status, 200, patched.text)
      assert.deepEqual(patched.body[member], value)
      const [resettable, fallback] = spec.resettable
      const reset = await api.request('PATCH', url, { body: { [resettable]: null } })
      assert.equal(reset.status, 200, reset.text)
      assert.deepEqual(reset.body[resettable], fallback)
      const same = await api.request('PATCH', url, { body: {} })
      assert.equal(same.headers.get('etag'), reset.headers.get('etag'))
    })

    test('hostile bodies are refused and change nothing: unknown member, wrong type, NUL, huge value, wrong content type, an echoed foreign id', async () => {
      const created = await create()
      const url = `${path}/${created.body.id}`
      const before = await rowCount()
      const valid = spec.create(next())
      const hostile: Array<[string, unknown, number]> = [
        ['unknown member', { ...valid, admin: true }, 422],
        ['wrong type', { ...valid, [spec.numeric]: 'seven' }, 422],
        ['huge number', { ...valid, [spec.numeric]: 1e300 }, 422],
        ['NUL', Object.fromEntries(Object.entries(valid).map(([k, v]) => [k, typeof v === 'string' ? `${v}\u0000` : v])), 422],
        ['array', [valid], 422],
        ['malformed JSON', '{"a":', 400],
      ]
      for (const [what, body, status] of hostile) {
        const res = await api.request('POST', path, { body })
        assert.equal(res.status, status, `${what}: ${res.text}`)
      }
      const wrongType = await api.request('POST', path, { body: JSON.stringify(valid), headers: { 'content-type': 'text/plain' } })
      assert.equal(wrongType.status, 415)
      const foreignId = await api.request('PUT', url, { body: { ...spec.replace(next()), id: created.body.id + 1 } })
      assert.equal(foreignId.status, 422)
      assert.equal(await rowCount(), before)
      assert.deepEqual((await api.request('GET', url)).body, created.body)
    })

    test('DELETE with If-Match answers 204; the resource is then 404 and gone from the table', async () => {
      const created = await create()
      const url = `${path}/${created.body.id}`
      assert.equal((await api.request('DELETE', url, { headers: { 'if-match': '"v2"' } })).status, 412)
      const res = await api.request('DELETE', url, { headers: { 'if-match': '"v1"' } })
      assert.equal(res.status, 204)
      assert.equal((await api.request('GET', url)).status, 404)
      assert.equal((await api.sql.unsafe(`SELECT id FROM ${spec.table} WHERE id = $1`, [created.body.id])).length, 0)
    })

    test('the collection filters, sorts, pages by cursor and counts', async () => {
      const base = next()
      const ids: number[] = []
      for (let i = 0; i < 5; i++) ids.push((await create(base + i)).body.id)
      const filter = `${spec.numeric}[gte]=${base}&${spec.numeric}[lte]=${base + 4}`
      const seen: number[] = []
      let url: string | undefined = `${path}?${filter}&sort=-${spec.numeric}&limit=2&count=true`
      while (url) {
        const page = await api.request('GET', url)
        assert.equal(page.status, 200, page.text)
        assert.equal(page.headers.get('x-total-count'), '5')
        seen.push(...page.body.map((r: { id: number }) => r.id))
        url = /<([^>]+)>; rel="next"/.exec(page.headers.get('link') ?? '')?.[1]
      }
      assert.deepEqual(seen, [...ids].reverse())
      const listed = await api.request('GET', `${path}?${spec.numeric}[in]=${base},${base + 2}&fields=id`)
      assert.deepEqual(listed.body, [{ id: ids[0] }, { id: ids[2] }])
      const bad = await api.request('GET', `${path}?${spec.numeric}[gt]=many`)
      assert.equal(bad.status, 400)
      assert.equal(bad.body.errors[0].path, `${spec.numeric}[gt]`)
    })

    test('/openapi.json names its schemas and operations', async () => {
      const doc = (await api.request('GET', '/openapi.json', { auth: null })).body
      for (const suffix of ['', 'Page', 'Create', 'Replace', 'Patch']) assert.ok(doc.components.schemas[`${spec.name}${suffix}`], `${spec.name}${suffix}`)
      const ids = [doc.paths[path].get, doc.paths[path].post, doc.paths[`${path}/{id}`].get, doc.paths[`${path}/{id}`].put, doc.paths[`${path}/{id}`].patch, doc.paths[`${path}/{id}`].delete].map((op) => op.operationId)
      assert.deepEqual(ids, [`list${spec.name}s`, `create${spec.name}`, `get${spec.name}`, `replace${spec.name}`, `update${spec.name}`, `delete${spec.name}`])
      assert.equal(doc.paths[path].post.requestBody.content['application/json'].schema.$ref, `#/components/schemas/${spec.name}Create`)
      assert.equal(doc.paths[`${path}/{id}`].get.responses['200'].content['application/json'].schema.$ref, `#/components/schemas/${spec.name}`)
    })
  })
}
