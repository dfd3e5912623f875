import assert from 'node:assert/strict'
import { test } from 'node:test'
import { startServer } from './helpers/server.js'

const api = await startServer()

test('GET /healthz answers ok', async () => {
  const res = await api.request('GET', '/healthz')
  assert.equal(res.status, 200)
  assert.deepEqual(res.body, { status: 'ok' })
})
