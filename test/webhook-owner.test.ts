import assert from 'node:assert/strict'
import { cp, mkdtemp, readdir, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { after, describe, test } from 'node:test'
import type { TransactionSql } from 'postgres'
import { Webhook } from 'standardwebhooks'
import { connect } from '../src/core/db/connect.js'
import { migrate } from '../src/core/db/migrate.js'
import { waitUntil } from './helpers/wait.js'
import { createTestDatabase, startServer, type TestServer } from './helpers/server.js'
import { answerWith, startReceiver, type Receiver, type Reception } from './helpers/webhook-receiver.js'

// A webhook runs on the authority of its owner, an admin (sql/010). Demoted
// or deleted, the owner takes the webhook down with them: it is disabled in
// the transaction of the change, says why, and no event committed after the
// change reaches its URL, whichever instance sends. Another admin who
// re-enables it becomes its owner. Two instances on one database: `api`
// takes the requests, `sender` alone sends (its worker is the only one
// running), as a load balancer and a busy cluster would have it.

const fast = { pollMs: 50, retryDelaysMs: [300, 300], retryJitter: 0, timeoutMs: 1000, leaseMs: 3000 }

interface Setup {
  api: TestServer
  sender: TestServer
  owner: { id: number; email: string; token: string }
  other: { id: number; email: string; token: string }
  hooked: Receiver
  control: Receiver
  hook: { id: number; secret: string }
}

async function setUp(tuning: Partial<typeof fast> = {}): Promise<Setup> {
  const eventTypes = ['product.created', 'user.updated', 'login.failed']
  const api = await startServer({ WEBHOOK_ALLOW_PRIVATE: 'true' }, {}, { tuning: { webhooks: fast } })
  await api.deps.webhooks.stop()
  const sender = await startServer(
    { WEBHOOK_ALLOW_PRIVATE: 'true' },
    {},
    { databaseUrl: api.databaseUrl, tuning: { webhooks: { ...fast, ...tuning } } },
  )
  const owner = await api.createUser({ role: 'admin' })
  const other = await api.createUser({ role: 'admin' })
  const hooked = await startReceiver()
  const control = await startReceiver()
  const created = await api.request('POST', '/webhooks', {
    auth: owner.token,
    body: { url: hooked.url, event_types: eventTypes },
  })
  assert.equal(created.status, 201, created.text)
  assert.equal(created.body.owner_id, owner.id)
  // The file's admin's webhook: proof that deliveries go on for everyone else.
  const controlHook = await api.request('POST', '/webhooks', { body: { url: control.url, event_types: eventTypes } })
  assert.equal(controlHook.status, 201)
  return { api, sender, owner, other, hooked, control, hook: { id: created.body.id, secret: created.body.secret } }
}

let skus = 0
async function createProduct(server: TestServer): Promise<number> {
  const res = await server.request('POST', '/products', {
    body: { sku: `OWNER-${++skus}`, name: 'x', price: 1, currency: 'EUR' },
  })
  assert.equal(res.status, 201, res.text)
  return res.body.id
}

const eventsOf = (r: Reception[]) =>
  r.map((x) => JSON.parse(x.body) as { id: number; type: string; subject: { id: number } })
const productEvent = (r: Reception[], productId: number) =>
  eventsOf(r).find((e) => e.type === 'product.created' && e.subject.id === productId)

/**
 * Waits for the control receiver to get the product's event, then for the
 * sender to attempt whatever else is due: the deliveries of an event are made
 * together, so by then it has sent the event to every webhook it was made for.
 */
async function settledFor(s: Setup, productId: number) {
  await s.control.waitFor(
    `product ${productId} at the control receiver`,
    (r) => productEvent(r, productId) !== undefined,
  )
  await s.sender.published()
  await s.sender.deps.webhooks.drain()
}

/** The delivery of the product's event to the owner's webhook. */
async function deliveryOf(s: Setup, productId: number): Promise<{ id: number; attempts: number } | undefined> {
  const [row] = await s.api.sql<Array<{ id: number; attempts: number }>>`
    SELECT d.id, d.attempts FROM webhook_deliveries d JOIN events e ON e.id = d.event_id
    WHERE d.webhook_id = ${s.hook.id} AND e.type = 'product.created' AND e.subject_id = ${productId}`
  return row
}

async function assertDisabled(s: Setup, reason: string, ownerId: number | null) {
  const read = await s.api.request('GET', `/webhooks/${s.hook.id}`)
  assert.equal(read.status, 200)
  assert.equal(read.body.status, 'disabled')
  assert.equal(read.body.last_error, reason)
  assert.equal(read.body.owner_id, ownerId)
  // The event says so too, by the system, with the webhook as GET shows it.
  await s.api.published()
  const [event] = await s.api.sql<Array<{ actor_credential: string; data: Record<string, unknown> }>>`
    SELECT actor_credential, data FROM events WHERE type = 'webhook.updated'
      AND subject_id = ${s.hook.id} ORDER BY id DESC LIMIT 1`
  assert.equal(event?.actor_credential, 'system')
  assert.deepEqual(event?.data, read.body)
}

describe('a webhook follows its owner', () => {
  test(
    'owner demoted: disabled with the reason at once, and an event committed after the demotion is never ' +
      'delivered',
    async () => {
      const s = await setUp()
      const before = await createProduct(s.api)
      await s.hooked.waitFor('the first delivery', (r) => productEvent(r, before) !== undefined)

      const demoted = await s.api.request('PATCH', `/users/${s.owner.id}`, { body: { role: 'user' } })
      assert.equal(demoted.status, 200, demoted.text)
      // Straight after the answer, through the other instance.
      const after = await createProduct(s.sender)
      const failed = await s.sender.request('POST', '/auth/login', {
        auth: null,
        body: { email: s.owner.email, password: 'wrong password' },
      })
      assert.ok(failed.status === 401 || failed.status === 429)
      await settledFor(s, after)

      assert.equal(
        productEvent(s.hooked.received, after),
        undefined,
        'the product created after the demotion was not delivered',
      )
      const types = eventsOf(s.hooked.received).map((e) => e.type)
      assert.deepEqual(types, ['product.created'], 'neither the demotion (user.updated) nor the failed login after it')
      await assertDisabled(s, `its owner (user ${s.owner.id}) is no longer an admin`, s.owner.id)
      const [{ made }] = await s.api.sql<[{ made: number }]>`
      SELECT count(*)::int AS made FROM webhook_deliveries d JOIN events e ON e.id = d.event_id
      WHERE d.webhook_id = ${s.hook.id} AND e.type = 'product.created' AND e.subject_id = ${after}`
      assert.equal(made, 0, 'no delivery was even queued')
    },
  )

  test(
    'owner deleted: the deletion succeeds, the webhook is disabled with no owner, nothing after it is ' + 'delivered',
    async () => {
      const s = await setUp()
      const deleted = await s.api.request('DELETE', `/users/${s.owner.id}`)
      assert.equal(deleted.status, 204, deleted.text)
      // In the trash, which ends what the owner held as its removal did (sql/019).
      const [gone] = await s.api.sql`SELECT 1 FROM users WHERE id = ${s.owner.id} AND deleted_at IS NULL`
      assert.equal(gone, undefined)
      const after = await createProduct(s.sender)
      await settledFor(s, after)
      assert.equal(s.hooked.received.length, 0)
      await assertDisabled(s, `its owner (user ${s.owner.id}) was deleted`, null)
    },
  )

  test(
    'owner demoted, then deleted (the finding): both succeed, the webhook stays disabled and loses its ' + 'owner',
    async () => {
      const s = await setUp()
      assert.equal((await s.api.request('PATCH', `/users/${s.owner.id}`, { body: { role: 'user' } })).status, 200)
      assert.equal((await s.api.request('DELETE', `/users/${s.owner.id}`)).status, 204)
      const after = await createProduct(s.sender)
      await settledFor(s, after)
      assert.equal(s.hooked.received.length, 0)
      await assertDisabled(s, `its owner (user ${s.owner.id}) is no longer an admin`, null)
    },
  )

  test('deliveries already queued when the owner is demoted are not sent', async () => {
    const s = await setUp({ retryDelaysMs: [60_000, 60_000] })
    s.hooked.answer = answerWith(500)
    const queued = await createProduct(s.api)
    // Its first attempt made (its outcome may still be on its way to the database).
    await waitUntil(
      'the first attempt',
      async () => ((await deliveryOf(s, queued))?.attempts ?? 0) >= 1 && s.hooked.received.length >= 1,
    )
    s.hooked.answer = answerWith(204)
    const demoted = await s.api.request('PATCH', `/users/${s.owner.id}`, { body: { role: 'user' } })
    assert.equal(demoted.status, 200, demoted.text)
    const seen = s.hooked.received.length
    // Its retry brought forward to now: a delivery still pending would be sent by the drain.
    const { id } = (await deliveryOf(s, queued))!
    await s.api.sql`UPDATE webhook_deliveries SET next_attempt_at = now() WHERE id = ${id}`
    await s.sender.deps.webhooks.drain()
    assert.equal(s.hooked.received.length, seen)
    const deliveries = await s.api.request('GET', `/webhooks/${s.hook.id}/deliveries`)
    assert.equal(deliveries.status, 200)
    assert.deepEqual(
      deliveries.body.map((d: { status: string }) => d.status),
      ['failed'],
    )
  })

  test(
    'a demotion while the worker records a failed attempt: no deadlock, the demotion commits and the delivery ' +
      'fails',
    async () => {
      const s = await setUp({ retryDelaysMs: [60_000] })
      let release!: () => void
      const held = new Promise<void>((resolve) => {
        release = resolve
      })
      s.hooked.answer = (_req, res) => void held.then(() => answerWith(500)(_req, res, undefined as never))
      await createProduct(s.api)
      await s.hooked.waitFor('the attempt, held open', (r) => r.length === 1)

      // The demotion's first step, taken on its own: the webhook's row (sql/010
      // takes it, then the webhook's pending deliveries). The worker, recording
      // the failure, must wait for it without holding the delivery's row.
      let demotedAt: Date | undefined
      const demotion = s.api.sql.begin(async (tx) => {
        await tx`SELECT 1 FROM webhooks WHERE id = ${s.hook.id} FOR NO KEY UPDATE`
        release()
        await waitUntil('the worker to wait for the webhook', async () => {
          const [waiting] = await s.api
            .sql`SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND
            query ILIKE '%webhooks%'`
          return waiting !== undefined
        })
        await tx`UPDATE users SET role = 'user' WHERE id = ${s.owner.id}`
        demotedAt = new Date()
      })
      await demotion
      assert.ok(demotedAt, 'the demotion committed')
      await waitUntil('the attempt to be recorded', async () => {
        const [row] = await s.api
          .sql`SELECT count(*)::int AS n FROM webhook_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id
          WHERE d.webhook_id = ${s.hook.id}`
        return row?.n === 1
      })
      const deliveries = await s.api.request('GET', `/webhooks/${s.hook.id}/deliveries`)
      assert.deepEqual(
        deliveries.body.map((d: { status: string }) => d.status),
        ['failed'],
      )
      await assertDisabled(s, `its owner (user ${s.owner.id}) is no longer an admin`, s.owner.id)
      assert.equal(
        s.sender.logs.filter((l) => l.level === 'error').length,
        0,
        JSON.stringify(s.sender.logs.filter((l) => l.level === 'error')),
      )
    },
  )

  test("a demotion during the worker's claim: no deadlock, the demotion commits and the delivery fails", async () => {
    const s = await setUp({ retryDelaysMs: [60_000] })
    await s.sender.deps.webhooks.stop()
    s.hooked.answer = answerWith(500)
    const product = await createProduct(s.api)
    await s.api.published()
    const delivery = await deliveryOf(s, product)
    assert.ok(delivery, 'the delivery was made')

    // The demotion's first steps, held (the lock order, src/webhooks/delivery-queries.ts: the user's row,
    // then the owner's webhooks, then their deliveries) while the worker claims the delivery. A claim
    // that locked the delivery and then waited on the webhook would deadlock with the demotion's next step.
    const demotion = s.api.sql.begin(async (tx) => {
      await tx`SELECT 1 FROM users WHERE id = ${s.owner.id} FOR UPDATE`
      await tx`SELECT 1 FROM webhooks WHERE id = ${s.hook.id} FOR NO KEY UPDATE`
      s.sender.deps.webhooks.start()
      await waitUntil('the claim to commit, or to wait on a lock', async () => {
        const [{ waiting }] = await s.api.sql<[{ waiting: boolean }]>`
          SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()
            AND wait_event_type = 'Lock' AND query ILIKE '%FROM webhook_deliveries d JOIN webhooks%') AS waiting`
        return waiting || ((await deliveryOf(s, product))?.attempts ?? 0) > 0
      })
      await tx`UPDATE users SET role = 'user' WHERE id = ${s.owner.id}`
    })
    await demotion
    // The attempt claimed before the demotion goes on; its outcome is dropped, the delivery failed.
    await s.sender.deps.webhooks.drain()
    const troubles = s.sender.logs.filter((l) => l.level === 'error' || l.level === 'warn')
    assert.deepEqual(troubles, [], 'the claim was not aborted')
    assert.equal(s.hooked.received.length, 1)
    const deliveries = await s.api.request('GET', `/webhooks/${s.hook.id}/deliveries`)
    const states = deliveries.body.map((d: { status: string; attempt_count: number }) => [d.status, d.attempt_count])
    assert.deepEqual(states, [['failed', 1]])
    await assertDisabled(s, `its owner (user ${s.owner.id}) is no longer an admin`, s.owner.id)
  })

  test('another admin who re-enables it becomes its owner, and deliveries resume, signed as before', async () => {
    const s = await setUp()
    assert.equal((await s.api.request('PATCH', `/users/${s.owner.id}`, { body: { role: 'user' } })).status, 200)
    const enabled = await s.api.request('PATCH', `/webhooks/${s.hook.id}`, {
      auth: s.other.token,
      body: { status: 'active' },
    })
    assert.equal(enabled.status, 200, enabled.text)
    assert.equal(enabled.body.status, 'active')
    assert.equal(enabled.body.owner_id, s.other.id)
    assert.equal(enabled.body.last_error, null)
    const after = await createProduct(s.sender)
    await s.hooked.waitFor('the delivery after re-enabling', (r) => productEvent(r, after) !== undefined)
    const reception = s.hooked.received.find((r) => productEvent([r], after))!
    assert.doesNotThrow(() =>
      new Webhook(s.hook.secret).verify(reception.body, reception.headers as Record<string, string>),
    )
    const [row] = await s.api.sql`SELECT owner_id, created_by, status FROM webhooks WHERE id = ${s.hook.id}`
    assert.deepEqual({ ...row }, { owner_id: s.other.id, created_by: s.owner.id, status: 'active' })

    // The new owner's demotion disables it again: authority follows the new owner, not the creator.
    assert.equal((await s.api.request('PATCH', `/users/${s.other.id}`, { body: { role: 'user' } })).status, 200)
    await assertDisabled(s, `its owner (user ${s.other.id}) is no longer an admin`, s.other.id)
  })

  test('another admin changing other members, or pausing and resuming it, does not take ownership', async () => {
    const s = await setUp()
    const changed = await s.api.request('PATCH', `/webhooks/${s.hook.id}`, {
      auth: s.other.token,
      body: { description: 'renamed', event_types: ['product.created'] },
    })
    assert.equal(changed.status, 200, changed.text)
    assert.equal(changed.body.owner_id, s.owner.id)
    for (const status of ['paused', 'active']) {
      const res = await s.api.request('PATCH', `/webhooks/${s.hook.id}`, { auth: s.other.token, body: { status } })
      assert.equal(res.status, 200)
      assert.equal(res.body.owner_id, s.owner.id)
    }
    const rotated = await s.api.request('POST', `/webhooks/${s.hook.id}/rotate-secret`, { auth: s.other.token })
    assert.equal(rotated.status, 200)
    assert.equal(rotated.body.owner_id, s.owner.id)
    // Owned by the creator still, so the creator's demotion takes it down.
    assert.equal((await s.api.request('PATCH', `/users/${s.owner.id}`, { body: { role: 'user' } })).status, 200)
    assert.equal((await s.api.request('GET', `/webhooks/${s.hook.id}`)).body.status, 'disabled')
  })

  test('a paused webhook of a demoted owner is disabled too, and owner_id cannot be written by a client', async () => {
    const s = await setUp()
    assert.equal((await s.api.request('PATCH', `/webhooks/${s.hook.id}`, { body: { status: 'paused' } })).status, 200)
    // A read-only member echoed in a patch is ignored (docs/api.md), so the owner stays.
    const taken = await s.api.request('PATCH', `/webhooks/${s.hook.id}`, {
      auth: s.other.token,
      body: { owner_id: s.other.id },
    })
    assert.equal(taken.status, 200)
    assert.equal(taken.body.owner_id, s.owner.id)
    const created = await s.api.request('POST', '/webhooks', {
      auth: s.other.token,
      body: { url: s.hooked.url, event_types: ['product.created'], owner_id: s.owner.id },
    })
    assert.equal(created.status, 422, created.text)
    assert.equal(created.body.errors[0].path, '/owner_id')
    const [{ owned }] = await s.api.sql<
      [{ owned: number }]
    >`SELECT count(*)::int AS owned FROM webhooks WHERE owner_id = ${s.owner.id}`
    assert.equal(owned, 1)
    assert.equal((await s.api.request('PATCH', `/users/${s.owner.id}`, { body: { role: 'user' } })).status, 200)
    await assertDisabled(s, `its owner (user ${s.owner.id}) is no longer an admin`, s.owner.id)
  })
})

describe('the rule holds in the database, whoever writes', () => {
  test('a webhook written by hand in SQL with no admin owner is kept disabled', async () => {
    const server = await startServer({ WEBHOOK_ALLOW_PRIVATE: 'true' }, {}, { tuning: { webhooks: fast } })
    const user = await server.createUser({ role: 'user' })
    const [orphan] =
      await server.sql`INSERT INTO webhooks (url, event_types, secret_sealed) VALUES ('https://example.com/h',
        '{product.created}', 'x') RETURNING status, last_error`
    assert.deepEqual({ ...orphan }, { status: 'disabled', last_error: 'it has no owner' })
    const [byUser] = await server.sql`
      INSERT INTO webhooks (url, event_types, secret_sealed, owner_id) VALUES ('https://example.com/h',
      '{product.created}', 'x', ${user.id}) RETURNING id, status, last_error`
    assert.deepEqual(
      { status: byUser!.status, last_error: byUser!.last_error },
      { status: 'disabled', last_error: `its owner (user ${user.id}) is no longer an admin` },
    )
    const [stillDisabled] =
      await server.sql`UPDATE webhooks SET status = 'active' WHERE id = ${byUser!.id} RETURNING status`
    assert.equal(stillDisabled!.status, 'disabled')
    const [enabled] = await server.sql`UPDATE webhooks SET status = 'active', owner_id = ${server.admin.id}
      WHERE id = ${byUser!.id} RETURNING status, owner_id`
    assert.deepEqual({ ...enabled }, { status: 'active', owner_id: server.admin.id })
    // A demotion by hand, as in psql: the trigger disables all the same.
    await server.sql`UPDATE users SET role = 'user' WHERE id = ${server.admin.id}`
    const [after] = await server.sql`SELECT status, last_error FROM webhooks WHERE id = ${byUser!.id}`
    assert.deepEqual(
      { ...after },
      { status: 'disabled', last_error: `its owner (user ${server.admin.id}) is no longer an admin` },
    )
  })

  test(
    "a re-enabling and the new owner's demotion at the same time, in either order: the webhook ends " + 'disabled',
    async () => {
      const server = await startServer({ WEBHOOK_ALLOW_PRIVATE: 'true' }, {}, { tuning: { webhooks: fast } })
      const waitingOnLock = () =>
        waitUntil('a statement waiting on a row lock', async () => {
          const [{ n }] = await server.sql<
            [{ n: number }]
          >`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type =
          'Lock'`
          return n > 0
        })
      for (const demotionFirst of [true, false]) {
        const admin = await server.createUser({ role: 'admin' })
        const [hook] = await server.sql<[{ id: number }]>`
        INSERT INTO webhooks (url, event_types, secret_sealed, owner_id) VALUES ('https://example.com/h',
        '{product.created}', 'x', NULL) RETURNING id`
        let release!: () => void
        let written!: () => void
        const gate = new Promise<void>((resolve) => (release = resolve))
        const firstWritten = new Promise<void>((resolve) => (written = resolve))
        const hold = (statement: (tx: TransactionSql) => Promise<unknown>) =>
          server.sql.begin(async (tx) => {
            await statement(tx)
            written()
            await gate
          })
        const demote = (tx: TransactionSql) => tx`UPDATE users SET role = 'user' WHERE id = ${admin.id}`
        const enable = (tx: TransactionSql) =>
          tx`UPDATE webhooks SET status = 'active', owner_id = ${admin.id} WHERE id = ${hook.id}`
        // The first holds its change uncommitted; the second waits on it; then the first commits.
        const first = hold(demotionFirst ? demote : enable)
        await firstWritten
        const second = server.sql.begin((tx) => (demotionFirst ? enable : demote)(tx))
        await waitingOnLock()
        release()
        await Promise.all([first, second])
        const [row] = await server.sql`SELECT status, owner_id, last_error FROM webhooks WHERE id = ${hook.id}`
        assert.deepEqual(
          { ...row },
          { status: 'disabled', owner_id: admin.id, last_error: `its owner (user ${admin.id}) is no longer an admin` },
          `demotion first: ${demotionFirst}`,
        )
      }
    },
  )

  test(
    "a PATCH that may re-enable takes the caller's row before the webhook's (the lock order): it waits for a held " +
      'owner without holding the webhook',
    async () => {
      const server = await startServer({ WEBHOOK_ALLOW_PRIVATE: 'true' }, {}, { tuning: { webhooks: fast } })
      const admin = await server.createUser({ role: 'admin' })
      const [hook] = await server.sql<[{ id: number }]>`
      INSERT INTO webhooks (url, event_types, secret_sealed, status, created_by, owner_id)
      VALUES ('https://example.com/h', '{product.created}', 'x', 'disabled', ${admin.id}, NULL) RETURNING id`
      let release!: () => void
      let held!: () => void
      const gate = new Promise<void>((resolve) => (release = resolve))
      const userHeld = new Promise<void>((resolve) => (held = resolve))
      // As the admin's deletion or demotion takes it first, before the webhooks its trigger changes.
      const holder = server.sql.begin(async (tx) => {
        await tx`SELECT 1 FROM users WHERE id = ${admin.id} FOR UPDATE`
        held()
        await gate
      })
      await userHeld
      const patched = server.request('PATCH', `/webhooks/${hook.id}`, { auth: admin.token, body: { status: 'active' } })
      await waitUntil('the PATCH waiting on a row lock', async () => {
        const [{ n }] = await server.sql<[{ n: number }]>`
        SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`
        return n > 0
      })
      // Waiting for the user, the PATCH holds nothing of the webhook: a deletion holding the user could take it.
      const [free] = await server.sql.begin((tx) => tx`SELECT id FROM webhooks WHERE id = ${hook.id} FOR UPDATE NOWAIT`)
      assert.equal(free?.id, hook.id)
      release()
      await holder
      const res = await patched
      assert.equal(res.status, 200, res.text)
      assert.deepEqual(
        { status: res.body.status, owner_id: res.body.owner_id },
        { status: 'active', owner_id: admin.id },
      )
    },
  )
})

describe('the upgrade (sql/010)', () => {
  test(
    'webhooks made before owners existed belong to their creator; those of a creator gone or demoted are ' +
      'disabled, their pending deliveries failed',
    async () => {
      // An empty database, migrated up to 009 from a copy of sql/.
      const sql = connect(await createTestDatabase({ empty: true }), { max: 1, statementTimeoutMs: 60_000 })
      const before = await mkdtemp(join(tmpdir(), 'upa-owner-'))
      after(async () => {
        await sql.end({ timeout: 5 })
        await rm(before, { recursive: true, force: true })
      })
      const sqlDir = new URL('../sql/', import.meta.url)
      await cp(sqlDir, before, { recursive: true })
      for (const file of await readdir(before)) if (Number(file.slice(0, 3)) >= 10) await rm(join(before, file))
      await migrate(sql, pathToFileURL(before + '/'))

      const [admin, demoted] = await sql<Array<{ id: number }>>`
      INSERT INTO users (name, email, role) VALUES ('A', 'a@example.com', 'admin'), ('D', 'd@example.com', 'user')
      RETURNING id`
      const hooks = await sql<Array<{ id: number }>>`
      INSERT INTO webhooks (url, event_types, secret_sealed, created_by, status) VALUES
        ('https://a.example.com/', '{product.created}', 'x', ${admin!.id}, 'active'),
        ('https://d.example.com/', '{product.created}', 'x', ${demoted!.id}, 'active'),
        ('https://n.example.com/', '{product.created}', 'x', NULL, 'paused')
      RETURNING id`
      const [event] = await sql<[{ id: number }]>`
      INSERT INTO events (id, type, occurred_at, subject_type, data) VALUES (1, 'product.created', now(), 'product',
      '{}') RETURNING id`
      await sql`INSERT INTO webhook_deliveries (webhook_id, event_id) SELECT id, ${event.id} FROM webhooks`

      await migrate(sql, sqlDir)
      const rows = await sql`SELECT id, status, owner_id, last_error, version FROM webhooks ORDER BY id`
      assert.deepEqual(
        rows.map((r) => ({ ...r })),
        [
          { id: hooks[0]!.id, status: 'active', owner_id: admin!.id, last_error: null, version: 1 },
          {
            id: hooks[1]!.id,
            status: 'disabled',
            owner_id: demoted!.id,
            last_error: `its owner (user ${demoted!.id}) is no longer an admin`,
            version: 2,
          },
          { id: hooks[2]!.id, status: 'disabled', owner_id: null, last_error: 'it has no owner', version: 2 },
        ],
      )
      const deliveries = await sql`SELECT webhook_id, status FROM webhook_deliveries ORDER BY webhook_id`
      assert.deepEqual(
        deliveries.map((d) => d.status),
        ['pending', 'failed', 'failed'],
      )
      const events =
        await sql`SELECT subject_id, actor_credential, data->>'status' AS status FROM event_outbox WHERE type =
        'webhook.updated' ORDER BY subject_id`
      assert.deepEqual(
        events.map((e) => ({ ...e })),
        [
          { subject_id: hooks[1]!.id, actor_credential: 'system', status: 'disabled' },
          { subject_id: hooks[2]!.id, actor_credential: 'system', status: 'disabled' },
        ],
      )
    },
  )
})
