import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { startServer } from './helpers/server.js'

// MAX_API_KEYS_PER_USER: a user holds at most that many live keys, so a
// stolen token cannot mint keys without bound (each is a way back in, and
// each a row every instance may cache). Concurrent creations cannot together
// pass the limit; expired keys do not count; deleting one frees a place.

const MAX = 3
const api = await startServer({ MAX_API_KEYS_PER_USER: String(MAX) })

const create = (token: string, name = 'k') =>
  api.request('POST', '/api-keys', { auth: token, body: { name, scopes: ['users:read'] } })
const liveKeys = async (userId: number) =>
  (
    await api.sql<
      [{ n: number }]
    >`SELECT count(*)::int AS n FROM api_keys WHERE user_id = ${userId} AND (expires_at IS NULL OR expires_at > now())`
  )[0].n

describe('MAX_API_KEYS_PER_USER', () => {
  test('the key beyond the limit is 409 api_key_limit and nothing is created; deleting one frees a place', async () => {
    const user = await api.createUser({ session: true })
    const ids: number[] = []
    for (let i = 0; i < MAX; i++) {
      const res = await create(user.token)
      assert.equal(res.status, 201, res.text)
      ids.push(res.body.id)
    }
    const refused = await create(user.token)
    assert.equal(refused.status, 409, refused.text)
    assert.equal(refused.body.code, 'api_key_limit')
    assert.match(refused.body.detail, /MAX_API_KEYS_PER_USER/)
    assert.equal(refused.body.key, undefined)
    assert.equal(await liveKeys(user.id), MAX)
    assert.equal((await api.request('DELETE', `/api-keys/${ids[0]}`, { auth: user.token })).status, 204)
    assert.equal((await create(user.token)).status, 201)
  })

  test('20 concurrent creations: exactly the limit succeeds, the rest are 409', async () => {
    const user = await api.createUser({ session: true })
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => create(user.token, `race ${i}`)))
    assert.equal(results.filter((r) => r.status === 201).length, MAX)
    assert.equal(results.filter((r) => r.status === 409 && r.body.code === 'api_key_limit').length, 20 - MAX)
    assert.equal(await liveKeys(user.id), MAX)
  })

  test('expired keys do not count; the limit is per user', async () => {
    const user = await api.createUser({ session: true })
    for (let i = 0; i < MAX; i++) assert.equal((await create(user.token)).status, 201)
    await api.sql`UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE user_id = ${user.id}`
    assert.equal((await create(user.token)).status, 201)
    const other = await api.createUser({ session: true })
    assert.equal((await create(other.token)).status, 201)
  })
})
