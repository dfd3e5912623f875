import assert from 'node:assert/strict'
import { connect } from 'node:net'
import { test } from 'node:test'
import { assertConnectionCap } from './helpers/connection-cap.js'
import { startServer } from './helpers/server.js'

// MAX_CONNECTIONS bounds the connections one instance holds open: past it,
// each new connection is closed as it arrives (and counted), so a flood of
// idle connections cannot exhaust file descriptors or memory. The same cap
// over HTTPS is in test/https.test.ts.

const CAP = 10
const api = await startServer({ MAX_CONNECTIONS: String(CAP) })
const port = Number(new URL(api.url).port)

test(
  `with MAX_CONNECTIONS=${CAP}, ` +
    `connection ${CAP + 1} is closed while the first ${CAP} are served, and new ones are accepted once those close`,
  async () => {
    await assertConnectionCap(() => connect(port, '127.0.0.1'), CAP)
    const metrics = await api.request('GET', '/metrics')
    assert.equal(metrics.status, 200)
    const dropped = Number(/^http_connections_dropped_total (\d+)$/m.exec(metrics.text)?.[1])
    assert.ok(dropped >= 1, `http_connections_dropped_total ${dropped}`)
  },
)
