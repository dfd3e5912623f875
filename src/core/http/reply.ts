import type { ServerResponse } from 'node:http'
import type { Reply } from './route.js'

const JSON_TYPE = 'application/json; charset=utf-8'
const PROBLEM_TYPE = 'application/problem+json; charset=utf-8'

/** The one place that writes a response. HEAD gets the GET headers, Content-Length included, and no body. */
export function writeReply(
  res: ServerResponse,
  reply: Reply,
  opts: { requestId: string; head: boolean; problem?: boolean },
): void {
  if (reply.stream) return writeStreamHead(res, reply, opts)
  // Kept as a string: Node writes it to the socket as it is, where a Buffer
  // would be one more copy of every body, allocated outside the V8 heap.
  const payload = reply.text ? reply.text.content : jsonBody(reply)
  // One writeHead with a flat [name, value, …] list: Node then validates and
  // serializes the headers once, without keeping a header map per response.
  const headers: Array<string | number> = ['x-request-id', opts.requestId, 'x-content-type-options', 'nosniff']
  for (const name in reply.headers) headers.push(name, reply.headers[name]!)
  if (payload !== undefined) {
    headers.push(
      'content-type',
      reply.text?.contentType ?? (opts.problem ? PROBLEM_TYPE : JSON_TYPE),
      'content-length',
      Buffer.byteLength(payload),
    )
  } else if (reply.status !== 204 && reply.status !== 304) {
    headers.push('content-length', 0)
  }
  res.writeHead(reply.status, headers)
  res.end(opts.head ? undefined : payload)
}

/**
 * A stream's head, without a length (chunked), sent at once; its body is the stream's to write, but for HEAD, which
 * ends here.
 */
function writeStreamHead(res: ServerResponse, reply: Reply, opts: { requestId: string; head: boolean }): void {
  const stream = reply.stream!
  const headers: Array<string | number> = [
    'x-request-id',
    opts.requestId,
    'x-content-type-options',
    'nosniff',
    'content-type',
    stream.contentType,
  ]
  for (const name in reply.headers) headers.push(name, reply.headers[name]!)
  res.writeHead(reply.status, headers)
  if (opts.head) {
    stream.cancel()
    return void res.end()
  }
  res.flushHeaders()
  stream.start(res)
}

/**
 * A reply's JSON body as it goes out (and as an idempotent replay stores it): through its serializer when it has one.
 */
export function jsonBody(reply: Reply): string | undefined {
  if (reply.body === undefined) return undefined
  return reply.serialize ? reply.serialize(reply.body) : JSON.stringify(reply.body)
}
