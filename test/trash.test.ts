import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, test } from 'node:test'
import { startServer, type TestResponse, type TestServer } from './helpers/server.js'
import { startReceiver } from './helpers/webhook-receiver.js'

// The trash of products on two instances, A and B, of the real server on one
// database, as behind a load balancer: a product deleted through one is gone
// from the other's reads and lists, listed in its trash, restored through
// either, refused a restore whose SKU was taken meanwhile, purged at once
// (permanent=true) or by either instance's job once TRASH_RETENTION has
// passed on its clock; each step an event in GET /events and a webhook
// delivery. (The same rules for every resource with a trash:
// test/helpers/resource-conformance.ts; users: test/trash-users.test.ts.)

const webhooks = { pollMs: 50, retryDelaysMs: [50], retryJitter: 0, timeoutMs: 1000, leaseMs: 3000 }
const A = await startServer({ WEBHOOK_ALLOW_PRIVATE: 'true' }, {}, { tuning: { webhooks } })
const B = await startServer({ WEBHOOK_ALLOW_PRIVATE: 'true' }, {}, { databaseUrl: A.databaseUrl, tuning: { webhooks } })
const { sql } = A
const admin = { auth: A.admin.token }
const receiver = await startReceiver()
after(() => receiver.close())
const types = ['product.created', 'product.deleted', 'product.restored', 'product.purged']
const hook = await A.request('POST', '/webhooks', { ...admin, body: { url: receiver.url, event_types: types } })
assert.equal(hook.status, 201, hook.text)

const sku = () => `TRASH-${randomBytes(4).toString('hex')}`

async function product(on: TestServer = A, over: Record<string, unknown> = {}) {
  const res = await on.request('POST', '/products', {
    ...admin,
    body: { sku: sku(), name: 'Lamp', price: 1200, currency: 'EUR', ...over },
  })
  assert.equal(res.status, 201, res.text)
  return res.body as { id: number; sku: string } & Record<string, unknown>
}

function assertProblem(res: TestResponse, status: number, code: string): void {
  assert.equal(res.status, status, res.text)
  assert.equal(res.body.code, code, res.text)
}

const stored = async (id: number) =>
  (await sql<Array<{ deleted_at: string | null }>>`SELECT deleted_at FROM products WHERE id = ${id}`)[0]

/** The types of the events of product `id`, in commit order, once published. */
async function eventsOf(id: number): Promise<Array<{ type: string; data: Record<string, unknown> }>> {
  await A.published()
  const feed = await A.request('GET', `/events?subject_type=product&subject_id=${id}`, admin)
  assert.equal(feed.status, 200, feed.text)
  return feed.body
}

/** The receiver got a delivery of each of `wanted` for product `id`. */
const delivered = (id: number, wanted: string[]) =>
  receiver.waitFor(`${wanted.join(', ')} of product ${id}`, (received) => {
    const got = received
      .map((r) => JSON.parse(r.body) as { type: string; data: { id: number } })
      .filter((m) => m.data.id === id)
      .map((m) => m.type)
    return wanted.every((t) => got.includes(t))
  })

test('deleted through A: B answers 404, lists and counts it no more, and lists it in its trash', async () => {
  const item = await product()
  assert.equal((await A.request('DELETE', `/products/${item.id}`, admin)).status, 204)
  assertProblem(await B.request('GET', `/products/${item.id}`, admin), 404, 'not_found')
  const live = await B.request('GET', `/products?sku=${item.sku}&count=true`, admin)
  assert.deepEqual(live.body, [])
  assert.equal(live.headers.get('x-total-count'), '0')
  const trash = await B.request('GET', `/products?trashed=true&sku=${item.sku}&count=true`, admin)
  assert.equal(trash.status, 200, trash.text)
  assert.equal(trash.headers.get('x-total-count'), '1')
  const { deleted_at: deletedAt, ...rest } = trash.body[0]
  assert.deepEqual(rest, item)
  assert.equal(deletedAt, (await sql`SELECT api_time(deleted_at) AS t FROM products WHERE id = ${item.id}`)[0]!.t)
  // A user who is no admin reads the catalogue, not its trash.
  const user = await B.createUser()
  assertProblem(await B.request('GET', '/products?trashed=true', { auth: user.token }), 403, 'forbidden')
  assert.equal((await B.request('GET', '/products?trashed=false', { auth: user.token })).status, 200)
})

test('the trash pages by cursor and sorts like the live list', async () => {
  const name = `Paged ${randomBytes(3).toString('hex')}`
  const ids: number[] = []
  for (let i = 0; i < 5; i++) ids.push((await product(A, { name, price: 100 + i })).id)
  for (const id of ids) assert.equal((await B.request('DELETE', `/products/${id}`, admin)).status, 204)
  const seen: number[] = []
  let url: string | undefined = `/products?trashed=true&q=${encodeURIComponent(name)}&sort=-price&limit=2`
  for (let page = 0; url; page++) {
    const res = await (page % 2 ? A : B).request('GET', url, admin)
    assert.equal(res.status, 200, res.text)
    seen.push(...res.body.map((r: { id: number }) => r.id))
    url = /<([^>]+)>; rel="next"/.exec(res.headers.get('link') ?? '')?.[1]
  }
  assert.deepEqual(seen, [...ids].reverse())
  const offset = await A.request('GET', `/products?trashed=true&q=${encodeURIComponent(name)}&offset=4`, admin)
  assert.deepEqual(
    offset.body.map((r: { id: number }) => r.id),
    [ids[4]],
  )
})

test('restored through B: 200 with the product, live again on A; events and deliveries follow', async () => {
  const item = await product()
  assert.equal((await A.request('DELETE', `/products/${item.id}`, admin)).status, 204)
  const restored = await B.request('POST', `/products/${item.id}/restore`, admin)
  assert.equal(restored.status, 200, restored.text)
  assert.deepEqual(restored.body, item)
  assert.equal(restored.headers.get('etag'), '"v3"')
  const read = await A.request('GET', `/products/${item.id}`, admin)
  assert.equal(read.status, 200)
  assert.equal(read.headers.get('etag'), '"v3"')
  assert.equal((await stored(item.id))!.deleted_at, null)
  const events = await eventsOf(item.id)
  assert.deepEqual(
    events.map((e) => e.type),
    ['product.created', 'product.deleted', 'product.restored'],
  )
  assert.deepEqual(events[2]!.data, item)
  await delivered(item.id, ['product.created', 'product.deleted', 'product.restored'])
})

test('a restore after its SKU was taken is 409 sku_taken, through either instance; nothing changes', async () => {
  const item = await product()
  assert.equal((await B.request('DELETE', `/products/${item.id}`, admin)).status, 204)
  await product(A, { sku: item.sku })
  for (const server of [A, B])
    assertProblem(await server.request('POST', `/products/${item.id}/restore`, admin), 409, 'sku_taken')
  assert.ok((await stored(item.id))!.deleted_at)
  assert.deepEqual(
    (await eventsOf(item.id)).map((e) => e.type),
    ['product.created', 'product.deleted'],
  )
})

test('hostile restores and purges: a live id, a missing id, bad parameters, a user; each changes nothing', async () => {
  const item = await product()
  assertProblem(await A.request('POST', `/products/${item.id}/restore`, admin), 404, 'not_found')
  assertProblem(await B.request('POST', '/products/9223372036854775807/restore', admin), 404, 'not_found')
  assertProblem(await A.request('POST', `/products/${item.id}/restore?now=1`, admin), 400, 'unknown_parameter')
  assertProblem(await A.request('DELETE', `/products/${item.id}?permanent=1`, admin), 400, 'invalid_parameter')
  assertProblem(await A.request('DELETE', `/products/${item.id}?permanent=`, admin), 400, 'invalid_parameter')
  assertProblem(await A.request('GET', '/products?trashed=yes', admin), 400, 'invalid_parameter')
  assertProblem(await A.request('GET', '/products?trashed=TRUE', admin), 400, 'invalid_parameter')
  const user = await A.createUser()
  assertProblem(
    await B.request('DELETE', `/products/${item.id}?permanent=true`, { auth: user.token }),
    403,
    'insufficient_scope',
  )
  assertProblem(
    await B.request('POST', `/products/${item.id}/restore`, { auth: user.token }),
    403,
    'insufficient_scope',
  )
  assert.equal((await A.request('GET', `/products/${item.id}`, admin)).status, 200)
  assert.deepEqual(
    (await eventsOf(item.id)).map((e) => e.type),
    ['product.created'],
  )
})

test('DELETE ?permanent=true purges a trashed product through B and a live one through A; events follow', async () => {
  const trashed = await product()
  const live = await product()
  assert.equal((await A.request('DELETE', `/products/${trashed.id}`, admin)).status, 204)
  assert.equal((await B.request('DELETE', `/products/${trashed.id}?permanent=true`, admin)).status, 204)
  assert.equal((await A.request('DELETE', `/products/${live.id}?permanent=true`, admin)).status, 204)
  for (const { id } of [trashed, live]) {
    assert.equal(await stored(id), undefined)
    assertProblem(await B.request('POST', `/products/${id}/restore`, admin), 404, 'not_found')
  }
  assert.deepEqual(
    (await eventsOf(trashed.id)).map((e) => e.type),
    ['product.created', 'product.deleted', 'product.purged'],
  )
  const events = await eventsOf(live.id)
  assert.deepEqual(
    events.map((e) => e.type),
    ['product.created', 'product.purged'],
  )
  assert.deepEqual(events[1]!.data, { id: live.id })
  await delivered(live.id, ['product.purged'])
  await delivered(trashed.id, ['product.deleted', 'product.purged'])
})

test('the job purges what has been in the trash for TRASH_RETENTION on its instance’s clock, not before', async () => {
  const due = await product()
  const fresh = await product()
  for (const { id } of [due, fresh]) assert.equal((await A.request('DELETE', `/products/${id}`, admin)).status, 204)
  // Both deleted at B's now; then B's clock moves past the retention for `due` only, which is held a day earlier.
  const now = B.clock.now()
  await sql`UPDATE products SET deleted_at = ${new Date(now - 86_400_000).toISOString()} WHERE id = ${due.id}`
  await sql`UPDATE products SET deleted_at = ${new Date(now).toISOString()} WHERE id = ${fresh.id}`
  await B.deps.trash.sweep()
  assert.ok(await stored(due.id), 'not due yet')
  B.clock.advance(B.deps.config.trashRetention * 1000 - 3_600_000)
  assert.ok((await B.deps.trash.sweep()) >= 1)
  assert.equal(await stored(due.id), undefined)
  assert.ok((await stored(fresh.id))!.deleted_at, 'the later one waits')
  const events = await eventsOf(due.id)
  assert.deepEqual(
    events.map((e) => e.type),
    ['product.created', 'product.deleted', 'product.purged'],
  )
  assert.deepEqual(events[2]!.data, { id: due.id })
  await delivered(due.id, ['product.purged'])
  // A purged product is gone for A too: a restore has nothing to bring back.
  assertProblem(await A.request('POST', `/products/${due.id}/restore`, admin), 404, 'not_found')
  assert.equal((await A.request('GET', `/products?trashed=true&sku=${due.sku}`, admin)).body.length, 0)
})
