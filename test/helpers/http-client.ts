import { request as httpRequest, type Agent, type IncomingHttpHeaders } from 'node:http'
import { request as httpsRequest } from 'node:https'

// A client for tests that go through a proxy: node:http (node:https for an
// https:// base) rather than fetch, because a request must be able to leave
// from an address of its own on the loopback network (127.0.0.2, 127.0.0.3,
// ...) or through a keep-alive agent bound to one, so that the client, the
// proxy and the service are three addresses. It never throws: a failed request is status 0 with the error.

export interface Answer {
  status: number
  headers: IncomingHttpHeaders
  body: any // eslint-disable-line @typescript-eslint/no-explicit-any
  error?: string
}

export interface CallOptions {
  /** A keep-alive agent (its own localAddress applies); without one, a new connection from `from`. */
  agent?: Agent
  from?: string
  headers?: Record<string, string>
  /** Sent as JSON (a string as it is). */
  body?: unknown
  /** How long the connection may be silent before the request fails; default 20 s. */
  timeoutMs?: number
  /** For an https:// base: the certificate to trust (the server's own, self-signed). */
  ca?: string
}

export function call(base: string, method: string, path: string, options: CallOptions = {}): Promise<Answer> {
  const body =
    options.body === undefined
      ? undefined
      : typeof options.body === 'string'
        ? options.body
        : JSON.stringify(options.body)
  const type = method === 'PATCH' ? 'application/merge-patch+json' : 'application/json'
  const headers: Record<string, string> = {
    ...(body !== undefined ? { 'content-type': type } : {}),
    ...options.headers,
  }
  return new Promise((resolve) => {
    const failed = (err: Error) => resolve({ status: 0, headers: {}, body: undefined, error: err.message })
    const request = base.startsWith('https:') ? httpsRequest : httpRequest
    const req = request(
      base + path,
      {
        method,
        headers,
        agent: options.agent,
        localAddress: options.agent ? undefined : options.from,
        timeout: options.timeoutMs ?? 20_000,
        ca: options.ca,
      },
      (res) => {
        let text = ''
        res.setEncoding('utf8').on('data', (chunk: string) => (text += chunk))
        res.on('end', () =>
          resolve({
            status: res.statusCode!,
            headers: res.headers,
            body: /json/.test(res.headers['content-type'] ?? '') && text ? JSON.parse(text) : text,
          }),
        )
        res.on('error', failed)
      },
    )
    req.on('timeout', () => req.destroy(new Error('timed out')))
    req.on('error', failed)
    req.end(body)
  })
}

/** How many answers had each status (or error). */
export const tally = (answers: readonly Answer[]): Record<string, number> =>
  answers.reduce<Record<string, number>>((t, a) => {
    const key = a.status ? String(a.status) : `error: ${a.error}`
    t[key] = (t[key] ?? 0) + 1
    return t
  }, {})

/** `call` on `base` as the holder of `token` (a JWT, an opaque token or an API key; none: anonymous). */
export const callAs =
  (base: string, token?: string) =>
  (method: string, path: string, options: CallOptions = {}): Promise<Answer> =>
    call(base, method, path, {
      ...options,
      headers: { ...(token ? { authorization: `Bearer ${token}` } : {}), ...options.headers },
    })
