import assert from 'node:assert/strict'
import { test } from 'node:test'
import { resourceConformance } from './helpers/resource-conformance.js'
import { startServer } from './helpers/server.js'
import { widgetRoutes, widgets, widgetsMigration } from './helpers/widgets.js'

// Adding a resource is a declaration and a migration (test/helpers/widgets.ts):
// the test-only widgets pass the same contract as products, a real resource.

const api = await startServer({}, {}, { routes: widgetRoutes })
await api.sql.unsafe(widgetsMigration)

resourceConformance(api, {
  name: 'Widget', path: '/widgets', table: 'widgets',
  create: (n) => ({ label: `Widget ${n}`, size: n, colour: 'blue' }),
  replace: (n) => ({ label: `Replaced ${n}`, size: 7, colour: 'green' }),
  patch: ['label', 'Patched'],
  resettable: ['colour', 'red'],
  numeric: 'size',
})

resourceConformance(api, {
  name: 'Product', path: '/products', table: 'products',
  create: (n) => ({ sku: `CONF-${n}`, name: `Product ${n}`, price: n, currency: 'EUR', stock: 3 }),
  replace: (n) => ({ sku: `REPL-${n}`, name: `Replaced ${n}`, description: 'new', price: 10, currency: 'USD', stock: 1 }),
  patch: ['price', 999],
  resettable: ['stock', 0],
  numeric: 'price',
})

test('the widget declaration and its migration are well under a hundred lines', async () => {
  const { readFile } = await import('node:fs/promises')
  const lines = (await readFile(new URL('./helpers/widgets.ts', import.meta.url), 'utf8')).split('\n').length
  assert.ok(lines < 100, `${lines} lines`)
  assert.deepEqual(widgets.outputMembers, ['id', 'label', 'size', 'colour', 'created_at', 'updated_at'])
})
