import assert from 'node:assert/strict'
import { test } from 'node:test'
import { products } from '../src/products/resource.js'
import { categoriesMigration, categories, categoriesRegistry } from './helpers/categories.js'
import { resourceConformance } from './helpers/resource-conformance.js'
import { startServer } from './helpers/server.js'

// Adding a resource is a migration, a declaration and a line in the registry
// (test/helpers/categories.ts): the test-only categories pass the same
// contract as products, a real resource, which proves the suite itself.

const api = await startServer(
  { WEBHOOK_ALLOW_PRIVATE: 'true' },
  {},
  {
    registry: categoriesRegistry,
    tuning: { webhooks: { pollMs: 50, retryDelaysMs: [50], retryJitter: 0, timeoutMs: 1000, leaseMs: 3000 } },
  },
)
await api.sql.unsafe(categoriesMigration)

const categoryName = (n: number) => `category-${n}`

resourceConformance(api, {
  resource: categories,
  create: (n) => ({ name: categoryName(n), description: `About ${n}` }),
  replace: (n) => ({ name: categoryName(n), description: 'replaced' }),
  patch: ['description', 'patched'],
  resettable: ['description', ''],
  sortable: 'name',
  sortValue: categoryName,
  duplicate: (n) => ({ name: categoryName(n) }),
  userMay: { read: true, write: false },
})

resourceConformance(api, {
  resource: products,
  create: (n) => ({ sku: `CONF-${n}`, name: `Product ${n}`, price: n, currency: 'EUR', stock: 3 }),
  replace: (n) => ({
    sku: `REPL-${n}`,
    name: `Replaced ${n}`,
    description: 'new',
    price: 10,
    currency: 'USD',
    stock: 1,
  }),
  patch: ['price', 999],
  resettable: ['stock', 0],
  sortable: 'price',
  sortValue: (n) => n,
  duplicate: (n) => ({ sku: `CONF-${n}`, name: 'Another', price: 1, currency: 'EUR' }),
  userMay: { read: true, write: false },
})

test(
  'the categories declaration gives its plural, scopes, event types and problem code to the service, and nothing ' +
    'else had to change',
  async () => {
    const { registry } = api.deps
    assert.deepEqual(
      registry.scopes.byRole.user.filter((s) => s.startsWith('categories:')),
      ['categories:read'],
    )
    assert.deepEqual(
      registry.scopes.byRole.admin.filter((s) => s.startsWith('categories:')),
      ['categories:read', 'categories:write'],
    )
    assert.deepEqual(
      registry.eventTypes.filter((t) => t.startsWith('category.')),
      ['category.created', 'category.updated', 'category.deleted', 'category.restored', 'category.purged'],
    )
    assert.deepEqual(registry.problems.category_name_taken, { status: 409, title: 'Category name already in use' })
    const doc = (await api.request('GET', '/openapi.json', { auth: null })).body
    assert.equal(doc.paths['/categories'].get.operationId, 'listCategories')
    assert.ok(doc.components.schemas.WebhookCreate.properties.event_types.items.enum.includes('category.created'))
  },
)
