import assert from 'node:assert/strict'
import { test } from 'node:test'
import { startServer } from './helpers/server.js'

const api = await startServer()

test('smoke', async () => {
  const res = await api.request('POST', '/batch', {
    body: {
      operations: [
        { method: 'POST', path: '/products', body: { sku: 'B-1', name: 'One', price: 1, currency: 'EUR' } },
        { method: 'PATCH', path: '/products/{0.id}', body: { price: 2 } },
        { method: 'GET', path: '/products/{0.id}' },
      ],
    },
  })
  console.log(res.status, JSON.stringify(res.body))
  const bad = await api.request('POST', '/batch', {
    body: {
      operations: [
        { method: 'POST', path: '/products', body: { sku: 'B-2', name: 'One', price: 1, currency: 'EUR' } },
        { method: 'POST', path: '/products', body: { sku: 'B-2', name: 'One', price: 1, currency: 'EUR' } },
      ],
    },
  })
  console.log(bad.status, JSON.stringify(bad.body))
  assert.equal(res.status, 200)
})
