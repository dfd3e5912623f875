import type { IncomingMessage } from 'node:http'
import { HttpError } from './problem.js'
import { parseStrictJson, JsonSyntaxError } from './strict-json.js'

export type BodyKind = 'json' | 'merge-patch'

// RFC 7396 merge patches may come as their own type or as plain JSON.
const acceptedTypes: Record<BodyKind, string[]> = {
  json: ['application/json'],
  'merge-patch': ['application/merge-patch+json', 'application/json'],
}

const utf8 = new TextDecoder('utf-8', { fatal: true })

/** Checks Content-Type before a byte is read, so a wrong type costs nothing. */
export function checkContentType(req: IncomingMessage, kind: BodyKind): void {
  const header = req.headers['content-type']
  const [essence = '', ...params] = (header ?? '').split(';')
  const type = essence.trim().toLowerCase()
  const charset = params.map((p) => p.trim().toLowerCase()).find((p) => p.startsWith('charset='))
  const accepted = acceptedTypes[kind]
  if (!accepted.includes(type) || (charset && !/^charset="?utf-8"?$/.test(charset))) {
    throw new HttpError('unsupported_media_type', `Content-Type must be ${accepted.join(' or ')} (UTF-8).`)
  }
}

/**
 * Reads the whole body up to `limit` bytes. A declared Content-Length over the
 * limit is refused before reading. Up to twice the limit, the connection stays
 * open and Node reads the rest of the body and throws it away: closing a
 * socket with unread data resets it, and a proxy still sending the body (nginx
 * lets through twice BODY_LIMIT, deploy/nginx.conf) would lose the 413 and
 * answer 502. Beyond that, and for a chunked body the moment it passes the
 * limit, the reply carries `Connection: close` and the rest is never read.
 */
export async function readJsonBody(req: IncomingMessage, limit: number): Promise<unknown> {
  const tooLarge = (close: boolean) =>
    new HttpError(
      'payload_too_large',
      `The body must not exceed ${limit} bytes.`,
      close ? { headers: { connection: 'close' } } : {},
    )
  const declared = req.headers['content-length']
  if (declared !== undefined && Number(declared) > limit) throw tooLarge(Number(declared) > 2 * limit)

  const body = await new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = []
    let size = 0
    const onData = (chunk: Buffer) => {
      size += chunk.length
      if (size <= limit) return void chunks.push(chunk)
      // Stop reading but keep the socket: the 413 still has to be written.
      cleanup()
      req.pause()
      reject(tooLarge(true))
    }
    const onEnd = () => (cleanup(), resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)))
    // An aborted upload: nobody is left to read an answer, but the pipeline still logs one.
    const onError = () => (
      cleanup(),
      reject(
        new HttpError('invalid_request', 'The request body could not be read.', { headers: { connection: 'close' } }),
      )
    )
    const cleanup = () => {
      req.off('data', onData)
      req.off('end', onEnd)
      req.off('error', onError)
    }
    req.on('data', onData)
    req.on('end', onEnd)
    req.on('error', onError)
  })

  let text: string
  try {
    text = utf8.decode(body)
  } catch {
    throw new HttpError('malformed_json', 'The body is not valid UTF-8.')
  }
  if (text.length === 0) throw new HttpError('malformed_json', 'The body is empty; a JSON object is required.')
  try {
    return parseStrictJson(text)
  } catch (err) {
    if (err instanceof JsonSyntaxError)
      throw new HttpError('malformed_json', `The body is not valid JSON: ${err.message}.`)
    throw err
  }
}
