import { createServer, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { after } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'

// A webhook receiver for tests: a real node:http server on a random port of
// 127.0.0.1 that records every request it gets (headers and raw body) and
// answers as the test says (by default 204).

export interface Reception {
  headers: IncomingHttpHeaders
  body: string
  at: number
}

export type Answer = (req: IncomingMessage, res: ServerResponse, reception: Reception) => void

export interface Receiver {
  url: string
  port: number
  received: Reception[]
  /** TCP connections accepted, requests or not. */
  connections: number
  /** How the next requests are answered; default 204. */
  answer: Answer
  /** Receptions per webhook-id. */
  countsById(): Map<string, number>
  /** Waits until `check` holds for what was received (default 15 s). */
  waitFor(what: string, check: (received: Reception[]) => boolean, timeoutMs?: number): Promise<void>
  close(): Promise<void>
}

export const answerWith =
  (status: number, body = ''): Answer =>
  (_req, res) => {
    res.writeHead(status, { 'content-type': 'text/plain' })
    res.end(body)
  }

/**
 * Answers `status` with 10 MB in 160 chunks of 64 KiB, a chunk every 2 ms, so
 * that socket buffers cannot swallow it all before the client closes;
 * `closed` is told how many bytes were written when the connection closed.
 */
export const answerEndlessly =
  (status: number, closed: (sent: number) => void): Answer =>
  (_req, res) => {
    let sent = 0
    res.on('close', () => closed(sent))
    res.writeHead(status, { 'content-type': 'application/octet-stream' })
    const chunk = Buffer.alloc(64 * 1024, 'x')
    const timer = setInterval(() => {
      if (res.destroyed || sent >= 10 * 1024 * 1024) return void (clearInterval(timer), res.destroyed || res.end())
      res.write(chunk)
      sent += chunk.length
    }, 2)
  }

export async function startReceiver(path = '/hook'): Promise<Receiver> {
  const received: Reception[] = []
  const receiver: Receiver = {
    url: '',
    port: 0,
    received,
    connections: 0,
    answer: answerWith(204),
    countsById() {
      const counts = new Map<string, number>()
      for (const r of received)
        counts.set(String(r.headers['webhook-id']), (counts.get(String(r.headers['webhook-id'])) ?? 0) + 1)
      return counts
    },
    async waitFor(what, check, timeoutMs = 15_000) {
      const deadline = Date.now() + timeoutMs
      while (!check(received)) {
        if (Date.now() > deadline)
          throw new Error(`receiver: timed out waiting for ${what} (received ${received.length})`)
        await sleep(20)
      }
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
  const server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      const reception = { headers: req.headers, body: Buffer.concat(chunks).toString('utf8'), at: Date.now() }
      received.push(reception)
      receiver.answer(req, res, reception)
    })
  })
  server.on('connection', () => void receiver.connections++)
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  receiver.port = (server.address() as AddressInfo).port
  receiver.url = `http://127.0.0.1:${receiver.port}${path}`
  after(() => receiver.close())
  return receiver
}
