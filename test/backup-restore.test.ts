import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, test } from 'node:test'
import { launchService, type Spawned } from './fault-kit.js'
import { callAs } from './helpers/http-client.js'
import { startPgBouncer } from './helpers/pgbouncer.js'
import { dumpDatabase, restoreDatabase } from './helpers/backup.js'
import { createRolePair } from './helpers/roles.js'
import { startReceiver } from './helpers/webhook-receiver.js'
import { waitUntil } from './helpers/wait.js'

// Backup and restore as docs/operations.md tells an operator to do them: a
// running service (as the runtime role, deploy/postgres/runtime-role.psql)
// with users, products, an API key, events and a webhook is dumped with
// `pg_dump -Fc` while it serves writes; the dump is restored with
// `pg_restore --no-owner` into a new database of the owner, the runtime
// role's script is run on it, and the service started there answers the
// same: the same users, products, events and webhooks, the API key and the
// passwords still working; and the same through PgBouncer in transaction mode.

const roles = await createRolePair()
const folder = mkdtempSync(join(tmpdir(), 'upa-backup-'))
after(() => rmSync(folder, { recursive: true, force: true }))
const ADMIN = { email: 'backup-admin@example.com', password: 'a password that survives a restore' }

function startMain(vars: Record<string, string>): Promise<Spawned> {
  const instance = launchService({
    ADMIN_EMAIL: ADMIN.email,
    ADMIN_PASSWORD: ADMIN.password,
    WEBHOOK_ALLOW_PRIVATE: 'true',
    ...vars,
  })
  after(() => instance.kill('SIGKILL'))
  return instance.listening
}

/** Everything a client can read of the data, keyed by what it is. */
async function contents(base: string, token: string, apiKey: string) {
  const api = callAs(base, token)
  const read = async (path: string) => {
    const res = await api('GET', path)
    assert.equal(res.status, 200, `${path}: ${JSON.stringify(res.body)}`)
    return res.body
  }
  return {
    users: await read('/users?limit=200&sort=id'),
    products: await read('/products?limit=200&sort=id'),
    events: await read('/events?limit=200'),
    webhooks: await read('/webhooks?limit=200'),
    // Without last_used_at, which reading `asKey` below moves on.
    apiKeys: (await read('/api-keys?limit=200')).map(({ last_used_at: _, ...key }: { last_used_at: unknown }) => key),
    // The key itself, not only its listing: it authenticates.
    asKey: (await callAs(base, apiKey)('GET', '/auth/me')).body,
  }
}

test(
  'pg_dump -Fc of a serving database, pg_restore into a new one: the service there serves the same data, the API ' +
    'key and passwords working',
  async () => {
    const source = await roles.database()
    const receiver = await startReceiver()
    after(() => receiver.close())
    const first = await startMain({ DATABASE_URL: source.runtimeUrl, DATABASE_MIGRATION_URL: source.ownerUrl })

    const login = await callAs(first.url)('POST', '/auth/login', { body: ADMIN })
    assert.equal(login.status, 200, JSON.stringify(login.body))
    const token = login.body.access_token as string
    const api = callAs(first.url, token)
    const people = Array.from({ length: 3 }, (_, i) => ({
      name: `Kept ${i}`,
      email: `kept-${i}@example.com`,
      password: `kept password number ${i}`,
    }))
    for (const person of people) assert.equal((await api('POST', '/users', { body: person })).status, 201)
    const key = await api('POST', '/api-keys', { body: { name: 'survives', scopes: ['products:read', 'users:read'] } })
    assert.equal(key.status, 201, JSON.stringify(key.body))
    const hook = await api('POST', '/webhooks', { body: { url: receiver.url, event_types: ['product.created'] } })
    assert.equal(hook.status, 201, JSON.stringify(hook.body))
    for (let i = 0; i < 6; i++)
      assert.equal(
        (
          await api('POST', '/products', {
            body: { sku: `KEPT-${i}`, name: `Kept ${i}`, price: 10 + i, currency: 'EUR' },
          })
        ).status,
        201,
      )
    await waitUntil('six deliveries', () => receiver.received.length >= 6)
    await waitUntil(
      'every event published',
      async () => (await api('GET', '/events?type=product.created&limit=200')).body.length === 6,
    )
    const before = await contents(first.url, token, key.body.key)

    // The dump, while clients write: pg_dump reads one snapshot, and blocks no one.
    let writing = true
    const during: number[] = []
    const writer = (async () => {
      for (let i = 0; writing; i++)
        during.push(
          (await api('POST', '/products', { body: { sku: `DURING-${i}`, name: 'During', price: 1, currency: 'EUR' } }))
            .status,
        )
    })()
    const dump = join(folder, 'api.dump')
    const dumpStarted = performance.now()
    await dumpDatabase(source.ownerUrl, dump)
    const dumpMs = performance.now() - dumpStarted
    writing = false
    await writer
    assert.ok(during.length > 0 && during.every((s) => s === 201), `writes while dumping: ${during.join(',')}`)
    assert.ok(statSync(dump).size > 0)
    first.kill('SIGTERM')
    await first.exited

    // The documented restore: a new database of the owner, pg_restore as the owner, the runtime role's script.
    const target = await roles.database({ grant: false })
    await restoreDatabase(target.ownerUrl, dump)
    await roles.grantRuntime(target.name)
    const second = await startMain({ DATABASE_URL: target.runtimeUrl, DATABASE_MIGRATION_URL: target.ownerUrl })
    assert.equal(
      second.logs.some((l) => l.msg === 'migrations applied'),
      false,
      'nothing to migrate: the dump has schema_migrations',
    )

    // A JWT issued before the dump still works (same JWT_SECRETS, its session restored), and so does a fresh login.
    const restored = await contents(second.url, token, key.body.key)
    const kept = <T extends { id: number }>(items: T[], ids: Set<number>) => items.filter((item) => ids.has(item.id))
    for (const name of ['users', 'products', 'events', 'webhooks', 'apiKeys'] as const) {
      const ids = new Set<number>(before[name].map((item: { id: number }) => item.id))
      assert.deepEqual(kept(restored[name], ids), before[name], name)
    }
    assert.deepEqual(restored.asKey, before.asKey)
    assert.equal(
      (await callAs(second.url, key.body.key)('GET', '/products?limit=1')).status,
      200,
      'the API key authenticates',
    )
    for (const person of people)
      assert.equal(
        (await callAs(second.url)('POST', '/auth/login', { body: { email: person.email, password: person.password } }))
          .status,
        200,
        person.email,
      )
    // The dump's snapshot: the products written while dumping are there up to some point, each whole.
    const duringRestored = restored.products.filter((p: { sku: string }) => p.sku.startsWith('DURING-'))
    assert.ok(duringRestored.length <= during.length)
    console.log(
      `pg_dump -Fc: ${statSync(dump).size} bytes ` +
        `in ${Math.round(dumpMs)} ms, ` +
        `while ${during.length} writes succeeded (${duringRestored.length} of them in its snapshot)`,
    )

    // It goes on: a write on the restored service is delivered to the restored webhook.
    const sku = `AFTER-${randomBytes(2).toString('hex')}`
    assert.equal(
      (
        await callAs(second.url, token)('POST', '/products', {
          body: { sku, name: 'After', price: 3, currency: 'EUR' },
        })
      ).status,
      201,
    )
    await receiver.waitFor('the restored webhook to deliver', (received) => received.some((r) => r.body.includes(sku)))
    assert.deepEqual(
      second.logs.filter((l) => l.level === 'error'),
      [],
    )

    // The restored database served through PgBouncer in transaction
    // mode, as the runtime role (LISTEN direct): the same.
    second.kill('SIGTERM')
    await second.exited
    const bouncer = await startPgBouncer({ user: roles.runtime })
    const third = await startMain({
      DATABASE_URL: bouncer.urlFor(target.runtimeUrl),
      DATABASE_LISTEN_URL: target.runtimeUrl,
      DATABASE_MIGRATION_URL: target.ownerUrl,
    })
    assert.ok(
      third.logs.some((l) => String(l.msg).startsWith('DATABASE_URL goes through a transaction pooler')),
      'the pooler was detected',
    )
    const pooled = await contents(third.url, token, key.body.key)
    for (const name of ['users', 'products', 'events', 'webhooks', 'apiKeys'] as const) {
      const ids = new Set<number>(before[name].map((item: { id: number }) => item.id))
      assert.deepEqual(kept(pooled[name], ids), before[name], `${name} through PgBouncer`)
    }
    assert.deepEqual(pooled.asKey, before.asKey)
    assert.doesNotMatch(bouncer.log(), /ERROR|prepared statement|unsupported startup parameter/)
    assert.deepEqual(
      third.logs.filter((l) => l.level === 'error'),
      [],
    )
  },
)
