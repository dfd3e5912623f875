import assert from 'node:assert/strict'
import type { Duplex } from 'node:stream'
import { setTimeout as sleep } from 'node:timers/promises'

// The connection cap (MAX_CONNECTIONS) as a client sees it, over plain TCP
// or TLS: `cap` connections are served, one more is closed without an
// answer while they still are, and once they close a new one is served.

/**
 * A keep-alive connection that asks GET /healthz on demand: 'answered' (a 200) or 'closed' (the server hung up first).
 */
class Connection {
  private text = ''
  private ended = false
  private wake = () => {}
  constructor(readonly socket: Duplex) {
    socket.on('data', (chunk: Buffer) => ((this.text += chunk.toString('utf8')), this.wake()))
    socket.on('error', () => {})
    socket.on('close', () => ((this.ended = true), this.wake()))
  }
  async ask(): Promise<'answered' | 'closed'> {
    this.text = ''
    if (!this.ended) this.socket.write('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n')
    const deadline = Date.now() + 10_000
    while (!this.text.includes('{"status":"ok"}') && !this.ended) {
      if (Date.now() > deadline) throw new Error(`no answer within 10 s: ${JSON.stringify(this.text)}`)
      await Promise.race([new Promise<void>((resolve) => (this.wake = resolve)), sleep(100)])
    }
    if (this.text.includes('{"status":"ok"}')) {
      assert.match(this.text, /^HTTP\/1\.1 200 /)
      return 'answered'
    }
    return 'closed'
  }
}

export async function assertConnectionCap(open: () => Duplex, cap: number): Promise<void> {
  const held: Connection[] = []
  try {
    for (let i = 0; i < cap; i++) {
      const c = new Connection(open())
      held.push(c)
      assert.equal(await c.ask(), 'answered', `connection ${i + 1} of ${cap}`)
    }
    const extra = new Connection(open())
    assert.equal(await extra.ask(), 'closed', `connection ${cap + 1} is closed by the server`)
    for (const [i, c] of held.entries()) assert.equal(await c.ask(), 'answered', `connection ${i + 1} still served`)
  } finally {
    for (const c of held) c.socket.destroy()
  }
  // The server counts a connection closed when it has seen it close: a short wait, then a new one is served.
  let outcome: 'answered' | 'closed' = 'closed'
  for (const deadline = Date.now() + 5000; outcome === 'closed' && Date.now() < deadline;) {
    const c = new Connection(open())
    outcome = await c.ask()
    c.socket.destroy()
    if (outcome === 'closed') await sleep(50)
  }
  assert.equal(outcome, 'answered', 'a new connection is served once the others closed')
}
