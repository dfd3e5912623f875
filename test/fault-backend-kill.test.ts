import assert from 'node:assert/strict'
import { after, test } from 'node:test'
import { applicationRegistry } from './helpers/registry.js'
import { openSession } from '../src/auth/sessions/sessions.js'
import { hashSecret } from '../src/auth/tokens.js'
import { connect } from '../src/core/db/connect.js'
import { call, everyClient, holdRowLock, startLoad, waitFor } from './fault-kit.js'
import { startServer } from './helpers/server.js'

// A backend killed (pg_terminate_backend) in the middle of a transaction that
// has already written, while other clients keep the service busy: the
// client of that transaction gets 503 database_unavailable, nothing of the
// transaction is committed, a retry succeeds, and nobody else notices.
//
// The transaction is a refresh-token rotation (POST /auth/refresh): it marks
// the presented refresh token used, then inserts the next one. This test
// holds a lock on the session row, which the insert needs (its foreign key),
// so the transaction stops right between its two writes; that is where its
// backend is killed. Had the first write survived, the retry would be refused
// (a used refresh token) and the session revoked. How soon after the kill
// the 503 comes is a figure of `make bench-faults` (bench/faults/db-outage.ts).

const api = await startServer({ LOG_LEVEL: 'warn' })
const admin = connect(api.databaseUrl, { max: 2, statementTimeoutMs: 30_000 })
after(() => admin.end({ timeout: 1 }))

test(
  'a backend killed between the two writes of a refresh-token rotation, under load: 503 for its client, nothing ' +
    'committed, the retry succeeds, other clients unaffected',
  async () => {
    const user = await api.createUser()
    const others = await Promise.all([0, 1, 2, 3].map(() => api.createUser()))
    const load = startLoad(6, (client, seq) =>
      client % 2
        ? call(api.url, 'GET', `/users/${others[client % 4]!.id}`, {
            token: api.admin.token,
            client,
            seq,
            what: 'read',
          })
        : call(api.url, 'PATCH', `/users/${others[client % 4]!.id}`, {
            token: api.admin.token,
            client,
            seq,
            what: 'update',
            body: { name: `Load ${seq}` },
          }),
    )
    try {
      for (let round = 0; round < 3; round++) {
        const opened = await openSession(
          api.sql,
          api.deps,
          { id: user.id, role: 'user', credential_epoch: 0 },
          [...applicationRegistry.scopes.byRole.user],
          'jwt',
          { userAgent: undefined, address: '127.0.0.1' },
          'test-request',
        )
        const { refresh_token: refresh } = opened!
        const [{ session_id: sessionId }] = await admin<
          [{ session_id: number }]
        >`SELECT session_id FROM refresh_tokens WHERE token_hash = ${hashSecret(refresh)}`

        const lock = await holdRowLock(admin, 'sessions', sessionId)
        try {
          const rotation = call(api.url, 'POST', '/auth/refresh', { body: { refresh_token: refresh }, what: 'refresh' })
          // The rotation's first write is done (it has a transaction id) and its second waits for the lock.
          let victim: { pid: number; wrote: boolean } | undefined
          await waitFor(
            'the rotation to wait between its writes',
            async () => {
              ;[victim] = await admin<Array<{ pid: number; wrote: boolean }>>`
            SELECT pid, backend_xid IS NOT NULL AS wrote FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE
            'INSERT INTO refresh_tokens%'`
              return victim !== undefined
            },
            10_000,
            10,
          )
          assert.equal(victim!.wrote, true, 'the transaction had written when it was killed')
          await admin`SELECT pg_terminate_backend(${victim!.pid})`
          const answer = await rotation
          assert.equal(answer.status, 503, JSON.stringify(answer.body))
          assert.equal(answer.code, 'database_unavailable')
          assert.ok(answer.retryAfter)
        } finally {
          lock.release()
          await lock.done
        }
        // Nothing of the killed transaction is there: the token is unused, no successor was issued.
        const tokens = await admin<
          Array<{ used: boolean }>
        >`SELECT used_at IS NOT NULL AS used FROM refresh_tokens WHERE session_id = ${sessionId}`
        assert.deepEqual(
          tokens.map((r) => r.used),
          [false],
        )
        const [{ revoked }] = await admin<
          [{ revoked: boolean }]
        >`SELECT revoked_at IS NOT NULL AS revoked FROM sessions WHERE id = ${sessionId}`
        assert.equal(revoked, false)
        // So the client's retry is an ordinary rotation.
        const retry = await call(api.url, 'POST', '/auth/refresh', { body: { refresh_token: refresh } })
        assert.equal(retry.status, 200, JSON.stringify(retry.body))
        assert.notEqual(retry.body.refresh_token, refresh)
      }
    } finally {
      await load.stop()
    }
    const outcomes = load.outcomes
    assert.ok(
      everyClient(outcomes, () => true),
      'every other client was answered meanwhile',
    )
    assert.deepEqual(
      outcomes.filter((o) => o.status !== 200).map((o) => `${o.what}: ${o.error ?? `${o.status} ${o.code}`}`),
      [],
    )
    assert.deepEqual(
      api.logs.filter((l) => l.level === 'error'),
      [],
    )
  },
)
