import type { ServerResponse } from 'node:http'
import type { Reply } from './route.js'

const JSON_TYPE = 'application/json; charset=utf-8'
const PROBLEM_TYPE = 'application/problem+json; charset=utf-8'

/** The one place that writes a response. HEAD gets the GET headers, Content-Length included, and no body. */
export function writeReply(res: ServerResponse, reply: Reply, opts: { requestId: string; head: boolean; problem?: boolean }): void {
  // Kept as a string: Node writes it to the socket as it is, where a Buffer
  // would be one more copy of every body, allocated outside the V8 heap.
  const payload = reply.text ? reply.text.content : reply.body === undefined ? undefined : JSON.stringify(reply.body)
  res.statusCode = reply.status
  res.setHeader('x-request-id', opts.requestId)
  res.setHeader('x-content-type-options', 'nosniff')
  for (const [name, value] of Object.entries(reply.headers ?? {})) res.setHeader(name, value)
  if (payload !== undefined) {
    res.setHeader('content-type', reply.text?.contentType ?? (opts.problem ? PROBLEM_TYPE : JSON_TYPE))
    res.setHeader('content-length', Buffer.byteLength(payload))
  } else if (reply.status !== 204 && reply.status !== 304) {
    res.setHeader('content-length', 0)
  }
  res.end(opts.head ? undefined : payload)
}
