import assert from 'node:assert/strict'
import { setTimeout as sleep } from 'node:timers/promises'
import type { TestResponse, TestServer } from './server.js'

// What a client sees of a credential that no longer holds: 401
// invalid_token with its challenge, on every instance, within the bound
// the contract gives other instances (a second, or more
// on a slow machine: test/helpers/time-bounds.ts).

export const INVALID_TOKEN_CHALLENGE = 'Bearer realm="api", error="invalid_token"'

export function assertInvalidToken(res: TestResponse, why = ''): void {
  assert.equal(res.status, 401, `${why} ${res.text}`.trim())
  assert.equal(res.body.code, 'invalid_token', res.text)
  assert.equal(res.headers.get('www-authenticate'), INVALID_TOKEN_CHALLENGE)
}

/** Every server answers `ask` with 401 invalid_token within `withinMs` of the call; how long the slowest took. */
export async function refusedEverywhere(
  servers: readonly TestServer[],
  ask: (server: TestServer) => Promise<TestResponse>,
  withinMs: number,
): Promise<number> {
  const started = performance.now()
  for (const server of servers) {
    for (;;) {
      const res = await ask(server)
      if (res.status === 401) {
        assertInvalidToken(res)
        break
      }
      assert.ok(performance.now() - started < withinMs, `still accepted after ${withinMs} ms: ${res.status}`)
      await sleep(5)
    }
  }
  return performance.now() - started
}
