import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { connect as netConnect, type Socket } from 'node:net'
import { describe, test } from 'node:test'
import { startServer, type TestResponse, type TestServer } from './helpers/server.js'
import { waitUntil } from './helpers/wait.js'

// The request pipeline as a client sees it: ids and headers on every answer,
// problem bodies, routing answers, content types, body limits, strict JSON,
// query strings, conditional GET, the API prefix, and the log line of each
// request. Requests fetch cannot express go through a raw socket.

const api = await startServer()
const small = await startServer({ BODY_LIMIT: '1024' })
const prefixed = await startServer({ API_PREFIX: '/v1' })

// ---------------------------------------------------------------- helpers

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/
const PROBLEM_TYPE = 'application/problem+json; charset=utf-8'
const JSON_TYPE = 'application/json; charset=utf-8'
// What a Node or V8 stack trace looks like in any serialization.
const STACK_TRACE = /\n\s+at |\bat [^\s]+ \(|node:internal|\.ts:[0-9]+:[0-9]+|\.js:[0-9]+:[0-9]+/

let serial = 0
const uniqueEmail = () => `user${++serial}.${randomBytes(4).toString('hex')}@example.com`
const newUser = () => ({ name: 'Ann Lee', email: uniqueEmail() })

async function createUser(server: TestServer, prefix = ''): Promise<{ id: number; etag: string; location: string }> {
  const res = await server.request('POST', `${prefix}/users`, { body: newUser() })
  assert.equal(res.status, 201, res.text)
  return { id: res.body.id, etag: res.headers.get('etag')!, location: res.headers.get('location')! }
}

const countUsers = async (server: TestServer) =>
  (await server.sql<Array<{ n: number }>>`SELECT count(*)::int AS n FROM users`)[0]!.n

/** Asserts what every response carries, and for problems the RFC 9457 body. */
function assertCommon(res: { status: number; headers: Headers; text: string }): void {
  assert.ok(res.headers.get('x-request-id'), 'X-Request-Id is missing')
  assert.equal(res.headers.get('x-content-type-options'), 'nosniff')
  assert.doesNotMatch(res.text, STACK_TRACE, 'the response contains a stack trace')
}

function assertProblem(res: TestResponse, status: number, code: string, instance?: string): void {
  assertCommon(res)
  assert.equal(res.status, status, res.text)
  assert.equal(res.headers.get('content-type'), PROBLEM_TYPE)
  const body = res.body as Record<string, unknown>
  assert.equal(body.code, code, res.text)
  assert.equal(body.status, status)
  assert.equal(body.type, `tag:users-products-api,2026:${code}`)
  assert.equal(typeof body.title, 'string')
  assert.ok((body.title as string).length > 0)
  assert.equal(typeof body.detail, 'string')
  assert.equal(body.request_id, res.headers.get('x-request-id'))
  if (instance !== undefined) assert.equal(body.instance, instance)
  else assert.equal(typeof body.instance, 'string')
  for (const key of Object.keys(body)) {
    assert.ok(
      ['type', 'title', 'status', 'code', 'detail', 'instance', 'request_id', 'errors'].includes(key),
      `unexpected problem member ${key}`,
    )
  }
}

/** The error paths of a problem, for `errors` assertions. */
const errorPaths = (res: TestResponse): string[] =>
  ((res.body?.errors ?? []) as Array<{ path: string }>).map((e) => e.path)

/** The server's log line for a request id; waits briefly, since it is written on `finish`. */
async function logLine(server: TestServer, requestId: string): Promise<Record<string, unknown>> {
  for (let i = 0; i < 100; i++) {
    const line = server.logs.find((l) => l.msg === 'request' && l.request_id === requestId)
    if (line) return line
    await new Promise((r) => setTimeout(r, 10))
  }
  assert.fail(`no request log line with request_id ${requestId}`)
}

interface RawResponse {
  status: number
  headers: Record<string, string>
  body: string
}

/**
 * Writes bytes on a fresh socket (each chunk separately, `pauseMs` apart) and
 * collects everything until the server closes it. Requests should ask for
 * `Connection: close`. Fails if the server keeps the socket open past `timeoutMs`.
 */
function rawExchange(
  server: TestServer,
  rawChunks: Array<string | Buffer>,
  { pauseMs = 0, timeoutMs = 5000 } = {},
): Promise<Buffer> {
  const { port } = new URL(server.url)
  // Every raw request acts as the file's admin, like api.request does.
  const chunks = rawChunks.map((c) =>
    typeof c === 'string'
      ? c.replaceAll('\r\nHost: x\r\n', `\r\nHost: x\r\nAuthorization: Bearer ${server.admin.token}\r\n`)
      : c,
  )
  return new Promise((resolve, reject) => {
    const socket = netConnect(Number(port), '127.0.0.1')
    const received: Buffer[] = []
    const timer = setTimeout(() => {
      socket.destroy()
      reject(
        new Error(
          `the server did not close the connection ` +
            `within ${timeoutMs} ms; received ${JSON.stringify(Buffer.concat(received).toString('latin1'))}`,
        ),
      )
    }, timeoutMs)
    socket.on('data', (d: Buffer) => received.push(d))
    // A reset after the answer (the server closes while we still send) is fine: what was received counts.
    socket.on('error', () => {})
    socket.on('close', () => {
      clearTimeout(timer)
      resolve(Buffer.concat(received))
    })
    socket.on('connect', async () => {
      for (const chunk of chunks) {
        if (!socket.writable) break
        socket.write(chunk)
        if (pauseMs) await new Promise((r) => setTimeout(r, pauseMs))
      }
    })
  })
}

/** Splits a byte stream into responses, by Content-Length (HEAD answers: none has a body). */
function parseResponses(data: Buffer, { head = false } = {}): RawResponse[] {
  const out: RawResponse[] = []
  let rest = data
  while (rest.length) {
    const end = rest.indexOf('\r\n\r\n')
    assert.ok(end !== -1, `incomplete response head: ${JSON.stringify(rest.toString('latin1'))}`)
    const [statusLine, ...lines] = rest.subarray(0, end).toString('latin1').split('\r\n')
    const status = Number(/^HTTP\/1\.1 ([0-9]{3}) /.exec(statusLine!)?.[1])
    const headers: Record<string, string> = {}
    for (const line of lines) {
      const colon = line.indexOf(':')
      headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim()
    }
    const length = head ? 0 : Number(headers['content-length'] ?? 0)
    out.push({ status, headers, body: rest.subarray(end + 4, end + 4 + length).toString('utf8') })
    rest = rest.subarray(end + 4 + length)
  }
  return out
}

async function raw(
  server: TestServer,
  chunks: Array<string | Buffer>,
  options?: { pauseMs?: number; head?: boolean },
): Promise<RawResponse> {
  const responses = parseResponses(await rawExchange(server, chunks, options), { head: options?.head })
  assert.equal(responses.length, 1, `expected one response, got ${responses.length}`)
  return responses[0]!
}

const chunk = (text: string) => `${Buffer.byteLength(text).toString(16)}\r\n${text}\r\n`

// ---------------------------------------------------------------- every response

describe('headers on every response', () => {
  const cases: Array<[string, string, string, { body?: unknown; headers?: Record<string, string> }?]> = [
    ['200', 'GET', '/healthz'],
    ['201', 'POST', '/users', { body: { name: 'Common Headers', email: 'common.headers@example.com' } }],
    ['204', 'OPTIONS', '/users'],
    ['400', 'POST', '/users', { body: '{' }],
    ['404', 'GET', '/nowhere'],
    ['405', 'DELETE', '/users'],
    ['415', 'POST', '/users', { body: '{}', headers: { 'content-type': 'text/plain' } }],
    ['422', 'POST', '/users', { body: {} }],
  ]
  for (const [status, method, path, options] of cases) {
    test(`a ${status} answer to ${method} ${path} carries X-Request-Id, nosniff and no stack trace`, async () => {
      const res = await api.request(method, path, options)
      assert.equal(res.status, Number(status), res.text)
      assertCommon(res)
      assert.match(res.headers.get('x-request-id')!, UUID)
      if (res.status >= 400) assertProblem(res, res.status, res.body.code, path)
      else if (res.text) assert.equal(res.headers.get('content-type'), JSON_TYPE)
    })
  }

  test('a 304 and a 413 carry X-Request-Id and nosniff too', async () => {
    const user = await createUser(api)
    const notModified = await api.request('GET', `/users/${user.id}`, { headers: { 'if-none-match': user.etag } })
    assert.equal(notModified.status, 304)
    assertCommon(notModified)
    const tooLarge = await small.request('POST', '/users', { body: { name: 'x'.repeat(2000), email: uniqueEmail() } })
    assertProblem(tooLarge, 413, 'payload_too_large', '/users')
  })
})

// ---------------------------------------------------------------- request ids and logs

describe('request ids and the log line', () => {
  const kept = ['abc', 'A-Za-z0-9._:-', 'trace:4bf92f3577b34da6.a3ce929d0e0e4736', 'x'.repeat(128)]
  for (const id of kept) {
    test(
      `keeps a client X-Request-Id ` +
        `of ${id.length} allowed characters ` +
        `(${JSON.stringify(id.slice(0, 20))}) in the header, problem body and log line`,
      async () => {
        const res = await api.request('GET', '/users/999999', { headers: { 'x-request-id': id } })
        assertProblem(res, 404, 'not_found', '/users/999999')
        assert.equal(res.headers.get('x-request-id'), id)
        assert.equal(res.body.request_id, id)
        const line = await logLine(api, id)
        assert.equal(line.status, 404)
      },
    )
  }

  const replaced = [
    ['129 characters', 'x'.repeat(129)],
    ['a space', 'abc def'],
    ['a slash', 'abc/def'],
    ['a quote', 'abc"def'],
    ['a semicolon', 'a;b'],
  ] as const
  for (const [what, id] of replaced) {
    test(`replaces a client X-Request-Id with ${what} by a fresh UUID, used in the body and log line`, async () => {
      const res = await api.request('GET', '/nowhere', { headers: { 'x-request-id': id } })
      assertProblem(res, 404, 'not_found')
      const given = res.headers.get('x-request-id')!
      assert.notEqual(given, id)
      assert.match(given, UUID)
      assert.equal(res.body.request_id, given)
      await logLine(api, given)
      assert.equal(
        api.logs.some((l) => l.request_id === id),
        false,
        'the refused id reached the log',
      )
    })
  }

  test('replaces a repeated X-Request-Id header (which Node joins with ", ")', async () => {
    const res = await raw(api, [
      `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: one\r\nX-Request-Id: two\r\nConnection: close\r\n\r\n`,
    ])
    assert.equal(res.status, 200)
    assert.match(res.headers['x-request-id']!, UUID)
  })

  test('replaces a client X-Request-Id with a non-ASCII byte', async () => {
    const res = await raw(api, [
      Buffer.concat([
        Buffer.from('GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: caf'),
        Buffer.from([0xe9]),
        Buffer.from('\r\nConnection: close\r\n\r\n'),
      ]),
    ])
    assert.equal(res.status, 200)
    assert.match(res.headers['x-request-id']!, UUID)
  })

  test('generates a different id for each request without one', async () => {
    const ids = await Promise.all(
      [1, 2, 3].map(async () => (await api.request('GET', '/healthz')).headers.get('x-request-id')),
    )
    assert.equal(new Set(ids).size, 3)
  })

  test('logs the route template, method, status and duration, not the concrete path', async () => {
    const user = await createUser(api)
    const id = `log-template-${user.id}`
    const res = await api.request('GET', `/users/${user.id}`, { headers: { 'x-request-id': id } })
    assert.equal(res.status, 200)
    const line = await logLine(api, id)
    assert.equal(line.level, 'info')
    assert.equal(line.route, '/users/{id}')
    assert.equal(line.method, 'GET')
    assert.equal(line.status, 200)
    assert.equal(typeof line.duration_ms, 'number')
    assert.ok((line.duration_ms as number) >= 0)
    assert.doesNotMatch(JSON.stringify(line), new RegExp(`/users/${user.id}\\b`))
  })

  test('logs the user id of the caller, null for an anonymous one, and the client address', async () => {
    await api.request('GET', `/users/${api.admin.id}`, { headers: { 'x-request-id': 'log-user' } })
    await api.request('GET', '/healthz', { auth: null, headers: { 'x-request-id': 'log-anonymous' } })
    const [user, anonymous] = [await logLine(api, 'log-user'), await logLine(api, 'log-anonymous')]
    assert.deepEqual([user.status, user.user_id, user.client], [200, String(api.admin.id), '127.0.0.1'])
    assert.deepEqual([anonymous.status, anonymous.user_id, anonymous.client], [200, null, '127.0.0.1'])
  })

  test('logs route null for a path no route matches', async () => {
    await api.request('GET', '/users/abc', { headers: { 'x-request-id': 'log-unmatched' } })
    const line = await logLine(api, 'log-unmatched')
    assert.equal(line.route, null)
    assert.equal(line.status, 404)
  })

  test('logs the 405 with the template of the path', async () => {
    await api.request('PATCH', '/users', { headers: { 'x-request-id': 'log-405' } })
    const line = await logLine(api, 'log-405')
    assert.deepEqual([line.method, line.route, line.status], ['PATCH', '/users', 405])
  })

  test('still logs a request whose client aborted the upload', async () => {
    const socket = netConnect(Number(new URL(api.url).port), '127.0.0.1')
    await new Promise((resolve) => socket.on('connect', resolve))
    socket.write(
      `POST /users HTTP/1.1\r\nHost: x\r\nAuthorization: ` +
        `Bearer ${api.admin.token}\r\nX-Request-Id: aborted-upload\r\nContent-Type: ` +
        `application/json\r\nContent-Length: 100\r\n\r\n{"name":`,
    )
    await new Promise((resolve) => setTimeout(resolve, 50))
    socket.destroy()
    const line = await logLine(api, 'aborted-upload')
    assert.deepEqual([line.method, line.route], ['POST', '/users'])
    assert.equal(line.status, 400)
  })
})

// ---------------------------------------------------------------- routing answers

describe('routing', () => {
  test('answers 404 not_found for an unknown path, with the path as instance', async () => {
    assertProblem(await api.request('GET', '/nowhere/at/all?x=1'), 404, 'not_found', '/nowhere/at/all')
  })

  for (const path of ['/users/', '//users', '/Users', '/users/1/2', '/users%2F1']) {
    test(`answers 404 for the near miss ${path}`, async () => {
      assertProblem(await api.request('GET', path), 404, 'not_found')
    })
  }

  for (const id of ['abc', '0', '-1', '1.5', '01', '12345678901234567890', '9223372036854775808']) {
    test(`answers 404 not_found for GET /users/${id}`, async () => {
      assertProblem(await api.request('GET', `/users/${id}`), 404, 'not_found', `/users/${id}`)
    })
  }

  test('answers 404 (not 500) for the largest bigint id, which exists nowhere', async () => {
    for (const method of ['GET', 'DELETE']) {
      assertProblem(await api.request(method, '/users/9223372036854775807'), 404, 'not_found')
    }
    assertProblem(await api.request('PATCH', '/users/9223372036854775807', { body: { name: 'X' } }), 404, 'not_found')
  })

  const notAllowed: Array<[string, string, string[]]> = [
    ['DELETE', '/users', ['GET', 'HEAD', 'OPTIONS', 'POST']],
    ['POST', '/users/1', ['DELETE', 'GET', 'HEAD', 'OPTIONS', 'PATCH', 'PUT']],
    ['PUT', '/products', ['GET', 'HEAD', 'OPTIONS', 'POST']],
    ['POST', '/healthz', ['GET', 'HEAD', 'OPTIONS']],
  ]
  for (const [method, path, allow] of notAllowed) {
    test(`answers 405 method_not_allowed with Allow for ${method} ${path}`, async () => {
      const res = await api.request(method, path)
      assertProblem(res, 405, 'method_not_allowed', path)
      assert.deepEqual(res.headers.get('allow')!.split(', ').sort(), allow)
    })
  }

  test('answers 405 for a method no route has at all', async () => {
    const res = await raw(api, ['PROPFIND /users HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'])
    assert.equal(res.status, 405)
    assert.equal(JSON.parse(res.body).code, 'method_not_allowed')
    assert.ok(res.headers.allow)
  })

  test('answers 405 before reading or checking the body', async () => {
    const before = await countUsers(api)
    const res = await api.request('PUT', '/users', { body: newUser() })
    assertProblem(res, 405, 'method_not_allowed')
    assert.equal(await countUsers(api), before)
  })

  for (const [path, allow] of [
    ['/users/1', ['DELETE', 'GET', 'HEAD', 'OPTIONS', 'PATCH', 'PUT']],
    ['/users', ['GET', 'HEAD', 'OPTIONS', 'POST']],
    ['/healthz', ['GET', 'HEAD', 'OPTIONS']],
  ] as const) {
    test(`answers OPTIONS ${path} with 204, Allow and no body`, async () => {
      const res = await api.request('OPTIONS', path)
      assert.equal(res.status, 204)
      assertCommon(res)
      assert.deepEqual(res.headers.get('allow')!.split(', ').sort(), allow)
      assert.equal(res.text, '')
      assert.equal(res.headers.get('content-type'), null)
    })
  }

  test('answers OPTIONS on an unknown path or invalid id with 404', async () => {
    assertProblem(await api.request('OPTIONS', '/nowhere'), 404, 'not_found')
    assertProblem(await api.request('OPTIONS', '/users/0'), 404, 'not_found')
  })

  test('answers HEAD like GET, with the same headers and Content-Length, and sends no body', async () => {
    const user = await createUser(api)
    const get = await api.request('GET', `/users/${user.id}`)
    const head = await api.request('HEAD', `/users/${user.id}`)
    assert.equal(head.status, 200)
    assertCommon(head)
    for (const name of ['content-type', 'content-length', 'etag'])
      assert.equal(head.headers.get(name), get.headers.get(name), name)
    assert.equal(Number(head.headers.get('content-length')), Buffer.byteLength(get.text))
    assert.equal(head.text, '')
    // On the wire: nothing follows the head, although Content-Length is not 0.
    const bytes = await rawExchange(api, [`HEAD /users/${user.id} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`])
    const text = bytes.toString('latin1')
    assert.ok(text.endsWith('\r\n\r\n'), `bytes after the head: ${JSON.stringify(text)}`)
    assert.match(text, /^HTTP\/1\.1 200 /)
  })

  test('answers HEAD of a missing resource like GET: 404 with the problem length and no body', async () => {
    const get = await api.request('GET', '/users/999999', { headers: { 'x-request-id': 'same-id' } })
    const head = await api.request('HEAD', '/users/999999', { headers: { 'x-request-id': 'same-id' } })
    assert.equal(head.status, 404)
    assert.equal(head.headers.get('content-type'), PROBLEM_TYPE)
    assert.equal(head.headers.get('content-length'), get.headers.get('content-length'))
    assert.equal(head.text, '')
  })

  test('answers /healthz with 200 ok and /readyz with 200 ready, neither cached', async () => {
    const health = await api.request('GET', '/healthz')
    assert.equal(health.status, 200)
    assert.deepEqual(health.body, { status: 'ok' })
    assert.equal(health.headers.get('content-type'), JSON_TYPE)
    assert.equal(health.headers.get('cache-control'), 'no-store')
    const ready = await api.request('GET', '/readyz')
    assert.equal(ready.status, 200)
    assert.deepEqual(ready.body, { status: 'ready', credentials: 'remembered' })
    assert.equal(ready.headers.get('cache-control'), 'no-store')
  })
})

// ---------------------------------------------------------------- content types

describe('content types', () => {
  const refused: Array<[string, Record<string, string>]> = [
    ['text/plain', { 'content-type': 'text/plain' }],
    ['application/x-www-form-urlencoded', { 'content-type': 'application/x-www-form-urlencoded' }],
    ['application/jsonx', { 'content-type': 'application/jsonx' }],
    ['application/merge-patch+json (for POST)', { 'content-type': 'application/merge-patch+json' }],
    ['charset=iso-8859-1', { 'content-type': 'application/json; charset=iso-8859-1' }],
    ['charset=utf-16', { 'content-type': 'application/json; charset=utf-16' }],
  ]
  for (const [what, headers] of refused) {
    test(`answers POST /users with ${what} with 415 and creates nothing`, async () => {
      const before = await countUsers(api)
      assertProblem(
        await api.request('POST', '/users', { body: JSON.stringify(newUser()), headers }),
        415,
        'unsupported_media_type',
        '/users',
      )
      assert.equal(await countUsers(api), before)
    })
  }

  test('answers POST /users without Content-Type with 415 and creates nothing', async () => {
    const before = await countUsers(api)
    const body = JSON.stringify(newUser())
    const res = await raw(api, [
      `POST /users HTTP/1.1\r\nHost: ` +
        `x\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    ])
    assert.equal(res.status, 415)
    assert.equal(res.headers['content-type'], PROBLEM_TYPE)
    assert.equal(JSON.parse(res.body).code, 'unsupported_media_type')
    assert.equal(await countUsers(api), before)
  })

  for (const type of [
    'application/json; charset=utf-8',
    'application/json;charset=UTF-8',
    'application/json; charset="utf-8"',
    'Application/JSON',
  ]) {
    test(`accepts POST /users with Content-Type ${type}`, async () => {
      const res = await api.request('POST', '/users', {
        body: JSON.stringify(newUser()),
        headers: { 'content-type': type },
      })
      assert.equal(res.status, 201, res.text)
    })
  }

  test('refuses application/merge-patch+json for PUT with 415', async () => {
    const user = await createUser(api)
    const res = await api.request('PUT', `/users/${user.id}`, {
      body: newUser(),
      headers: { 'content-type': 'application/merge-patch+json' },
    })
    assertProblem(res, 415, 'unsupported_media_type')
  })

  for (const type of [
    'application/merge-patch+json',
    'application/json',
    'application/merge-patch+json; charset=utf-8',
  ]) {
    test(`accepts PATCH with ${type}`, async () => {
      const user = await createUser(api)
      const res = await api.request('PATCH', `/users/${user.id}`, {
        body: { name: 'Patched Name' },
        headers: { 'content-type': type },
      })
      assert.equal(res.status, 200, res.text)
      assert.equal(res.body.name, 'Patched Name')
      const [row] = await api.sql<Array<{ name: string }>>`SELECT name FROM users WHERE id = ${user.id}`
      assert.equal(row!.name, 'Patched Name')
    })
  }

  test('refuses PATCH with text/plain with 415 and changes nothing', async () => {
    const user = await createUser(api)
    assertProblem(
      await api.request('PATCH', `/users/${user.id}`, {
        body: JSON.stringify({ name: 'Nope' }),
        headers: { 'content-type': 'text/plain' },
      }),
      415,
      'unsupported_media_type',
    )
    const [row] = await api.sql<Array<{ name: string }>>`SELECT name FROM users WHERE id = ${user.id}`
    assert.equal(row!.name, 'Ann Lee')
  })

  test('keeps a keep-alive connection usable after a 415 that left the body unread', async () => {
    const body = JSON.stringify(newUser())
    const bytes = await rawExchange(api, [
      `POST /users HTTP/1.1\r\nHost: x\r\nContent-Type: ` +
        `text/plain\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}` +
        `GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`,
    ])
    const responses = parseResponses(bytes)
    assert.deepEqual(
      responses.map((r) => r.status),
      [415, 200],
    )
    assert.deepEqual(JSON.parse(responses[1]!.body), { status: 'ok' })
  })
})

// ---------------------------------------------------------------- body size

describe('body limit (BODY_LIMIT=1024)', () => {
  /** A valid user body of exactly `size` bytes. */
  const bodyOfSize = (size: number) => {
    const base = JSON.stringify({ name: '', email: uniqueEmail() })
    const text = JSON.stringify({ name: 'n'.repeat(size - Buffer.byteLength(base)), email: JSON.parse(base).email })
    assert.equal(Buffer.byteLength(text), size)
    return text
  }

  test('accepts a body of exactly BODY_LIMIT bytes', async () => {
    const body = bodyOfSize(1024)
    // The name rule caps names at 200 characters; what matters here is that the body was read: 422, not 413.
    const res = await small.request('POST', '/users', { body })
    assertProblem(res, 422, 'validation_failed')
    assert.deepEqual(errorPaths(res), ['/name'])
  })

  test(
    'answers 413 payload_too_large for a declared Content-Length one byte over, creates nothing, and reads the ' +
      'body away: the connection goes on',
    async () => {
      const before = await countUsers(small)
      const body = bodyOfSize(1025)
      // Closing with the body unread would reset the connection under a proxy still sending it (a 502 there).
      const [tooLarge, next, ...rest] = parseResponses(
        await rawExchange(small, [
          `POST /users HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1025\r\n\r\n${body}`,
          'GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n',
        ]),
      )
      assert.equal(tooLarge?.status, 413)
      assert.notEqual(tooLarge?.headers.connection, 'close')
      assert.equal(tooLarge?.headers['content-type'], PROBLEM_TYPE)
      assert.equal(JSON.parse(tooLarge!.body).code, 'payload_too_large')
      assert.equal(next?.status, 200, 'the next request on the connection is answered')
      assert.deepEqual(rest, [])
      assert.equal(await countUsers(small), before)
    },
  )

  test('answers 413 and closes for a declared Content-Length over twice the limit, without reading it', async () => {
    const res = await raw(small, [
      `POST /users HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ` +
        `2049\r\n\r\n${'x'.repeat(2049)}`,
    ])
    assert.equal(res.status, 413)
    assert.equal(res.headers.connection, 'close')
  })

  test('answers 413 for a declared length over the limit before the body is sent', async () => {
    // Only the head: the answer must come without waiting for a single body byte.
    const res = await raw(small, [
      `POST /users HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n`,
    ])
    assert.equal(res.status, 413)
    assert.equal(JSON.parse(res.body).code, 'payload_too_large')
  })

  test('answers 413 through fetch as well', async () => {
    const before = await countUsers(small)
    assertProblem(
      await small.request('POST', '/users', { body: { name: 'x'.repeat(2000), email: uniqueEmail() } }),
      413,
      'payload_too_large',
      '/users',
    )
    assert.equal(await countUsers(small), before)
  })

  test(
    'answers 413 for a chunked body of no declared length that passes the limit, creates nothing and ' + 'closes',
    async () => {
      const before = await countUsers(small)
      const body = JSON.stringify({ name: 'x'.repeat(3000), email: uniqueEmail() })
      const head =
        `POST /users HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: ` +
        `chunked\r\nX-Request-Id: chunked-413\r\n\r\n`
      const res = await raw(
        small,
        [head, chunk(body.slice(0, 600)), chunk(body.slice(600, 1200)), chunk(body.slice(1200)), '0\r\n\r\n'],
        { pauseMs: 20 },
      )
      assert.equal(res.status, 413)
      assert.equal(res.headers.connection, 'close')
      assert.equal(JSON.parse(res.body).code, 'payload_too_large')
      assert.equal(JSON.parse(res.body).request_id, 'chunked-413')
      assert.equal(await countUsers(small), before)
      assert.equal((await logLine(small, 'chunked-413')).status, 413)
    },
  )

  test('answers 413 for a chunked body that never ends, without waiting for it', async () => {
    const head =
      `POST /users HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: ` + `chunked\r\n\r\n`
    // 2 KiB in chunks and no terminating chunk: the server must answer once the limit is passed.
    const res = await raw(small, [head, chunk('['), ...Array.from({ length: 8 }, () => chunk('1,'.repeat(128)))], {
      pauseMs: 5,
    })
    assert.equal(res.status, 413)
  })

  test('accepts a chunked body under the limit', async () => {
    const body = JSON.stringify(newUser())
    const head =
      `POST /users HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: ` +
      `chunked\r\nConnection: close\r\n\r\n`
    const res = await raw(small, [head, chunk(body.slice(0, 10)), chunk(body.slice(10)), '0\r\n\r\n'])
    assert.equal(res.status, 201, res.body)
  })
})

// ---------------------------------------------------------------- JSON syntax and validation

describe('request bodies', () => {
  const malformed: Array<[string, string | Buffer]> = [
    ['truncated JSON', '{"name":"Ann"'],
    ['an empty body', ''],
    ['white space only', '  \n'],
    [
      'invalid UTF-8 bytes',
      Buffer.concat([Buffer.from('{"name":"Ann'), Buffer.from([0xff, 0xfe]), Buffer.from('","email":"a@b.co"}')]),
    ],
    [
      'an overlong UTF-8 encoding',
      Buffer.concat([Buffer.from('{"name":"'), Buffer.from([0xc0, 0xaf]), Buffer.from('","email":"a@b.co"}')]),
    ],
    [
      'a UTF-8 encoded surrogate',
      Buffer.concat([Buffer.from('{"name":"'), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from('","email":"a@b.co"}')]),
    ],
    ['duplicate member names', '{"name":"Ann","email":"a@example.com","email":"b@example.com"}'],
    ['a __proto__ member', '{"name":"Ann","email":"p@example.com","__proto__":{"role":"admin"}}'],
    ['trailing data', '{"name":"Ann","email":"t@example.com"} {}'],
    ['single quotes', "{'name':'Ann'}"],
    ['NaN', '{"name":"Ann","email":"n@example.com","role":NaN}'],
    ['a leading zero', '{"name":"Ann","email":"z@example.com","role":01}'],
    ['a raw control character in a string', '{"name":"A\u0001nn","email":"c@example.com"}'],
    ['a bad escape', '{"name":"A\\xnn","email":"e@example.com"}'],
    ['100000 nested arrays', '['.repeat(100_000)],
    ['65 nested objects', '{"a":'.repeat(64) + '{}' + '}'.repeat(64)],
  ]
  for (const [what, body] of malformed) {
    test(`answers 400 malformed_json for ${what} and creates nothing`, async () => {
      const before = await countUsers(api)
      const res = await api.request('POST', '/users', { body, headers: { 'content-type': 'application/json' } })
      assertProblem(res, 400, 'malformed_json', '/users')
      assert.equal(await countUsers(api), before)
    })
  }

  for (const [what, body] of [
    ['an array', '[]'],
    ['a string', '"Ann"'],
    ['null', 'null'],
    ['a number', '42'],
    ['true', 'true'],
  ] as const) {
    test(`answers 422 validation_failed for a JSON body that is ${what}`, async () => {
      const res = await api.request('POST', '/users', { body, headers: { 'content-type': 'application/json' } })
      assertProblem(res, 422, 'validation_failed', '/users')
      assert.ok(Array.isArray(res.body.errors) && res.body.errors.length > 0)
    })
  }

  const unstorable: Array<[string, string, string]> = [
    ['NUL in a value', String.raw`{"name":"A\u0000nn","email":"nul@example.com"}`, '/name'],
    ['a lone high surrogate in a value', String.raw`{"name":"A\ud800nn","email":"sur@example.com"}`, '/name'],
    ['a lone low surrogate in a value', String.raw`{"name":"Ann","email":"x\udc00@example.com"}`, '/email'],
    ['NUL in a member name', String.raw`{"name":"Ann","email":"mn@example.com","a\u0000b":1}`, '/a\u0000b'],
  ]
  for (const [what, body, path] of unstorable) {
    test(`answers 422 with the JSON Pointer of ${what}`, async () => {
      const before = await countUsers(api)
      const res = await api.request('POST', '/users', { body, headers: { 'content-type': 'application/json' } })
      assertProblem(res, 422, 'validation_failed')
      assert.deepEqual(errorPaths(res), [path])
      assert.equal(await countUsers(api), before)
    })
  }

  test('answers 422 naming an unknown member in errors[].path, and does not create the user', async () => {
    const before = await countUsers(api)
    const res = await api.request('POST', '/users', { body: { ...newUser(), is_admin: true } })
    assertProblem(res, 422, 'validation_failed')
    assert.ok(errorPaths(res).includes('/is_admin'), res.text)
    assert.match(res.body.detail, /is_admin/)
    assert.equal(await countUsers(api), before)
  })

  test('escapes member names in JSON Pointer paths', async () => {
    const res = await api.request('POST', '/users', { body: { ...newUser(), 'a/b~c': 1 } })
    assertProblem(res, 422, 'validation_failed')
    assert.ok(errorPaths(res).includes('/a~1b~0c'), res.text)
  })

  test('answers 422 for 1e400 given as an integer (it parses to Infinity)', async () => {
    const before = (await api.sql<Array<{ n: number }>>`SELECT count(*)::int AS n FROM products`)[0]!.n
    const body = '{"sku":"BIG-1","name":"Huge","price":1e400,"currency":"EUR"}'
    const res = await api.request('POST', '/products', { body, headers: { 'content-type': 'application/json' } })
    assertProblem(res, 422, 'validation_failed')
    assert.deepEqual(errorPaths(res), ['/price'])
    assert.equal((await api.sql<Array<{ n: number }>>`SELECT count(*)::int AS n FROM products`)[0]!.n, before)
  })

  test('ignores a UTF-8 byte order mark before the body (RFC 8259 §8.1 allows it)', async () => {
    const body = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(JSON.stringify(newUser()))])
    const res = await api.request('POST', '/users', { body, headers: { 'content-type': 'application/json' } })
    assert.equal(res.status, 201, res.text)
  })

  test('stores non-ASCII text as sent', async () => {
    const res = await api.request('POST', '/users', { body: { name: 'Zoë 😀 Łukasz', email: uniqueEmail() } })
    assert.equal(res.status, 201, res.text)
    const [row] = await api.sql<Array<{ name: string }>>`SELECT name FROM users WHERE id = ${res.body.id}`
    assert.equal(row!.name, 'Zoë 😀 Łukasz')
  })
})

// ---------------------------------------------------------------- query strings

describe('query strings', () => {
  for (const [path, name] of [
    ['/users/1?foo=1', 'foo'],
    ['/healthz?verbose', 'verbose'],
    ['/users?limt=5', 'limt'],
    ['/users/1?x=1&y=2', 'x'],
  ] as const) {
    test(`answers 400 unknown_parameter naming ${name} for ${path}`, async () => {
      const res = await api.request('GET', path)
      assertProblem(res, 400, 'unknown_parameter', path.slice(0, path.indexOf('?')))
      assert.deepEqual(errorPaths(res), [name])
      assert.match(res.body.detail, new RegExp(`^${name}:`))
    })
  }

  test('answers 400 unknown_parameter for a parameter on a POST, and creates nothing', async () => {
    const before = await countUsers(api)
    const res = await api.request('POST', '/users?role=admin', { body: newUser() })
    assertProblem(res, 400, 'unknown_parameter')
    assert.deepEqual(errorPaths(res), ['role'])
    assert.equal(await countUsers(api), before)
  })

  for (const path of ['/users?limit=1&limit=2', '/users?limit=1&limit=1', '/users?q=a&%71=b']) {
    test(`answers 400 invalid_parameter for a repeated parameter (${path})`, async () => {
      const res = await api.request('GET', path)
      assertProblem(res, 400, 'invalid_parameter', '/users')
      assert.deepEqual(errorPaths(res), [path.includes('limit') ? 'limit' : 'q'])
    })
  }

  for (const query of ['q=%zz', 'q=%', 'q=abc%2', 'q=%ff', 'q=%ed%a0%80', 'q=%c0%af']) {
    test(`answers 400 invalid_parameter for bad percent-encoding (${query})`, async () => {
      const res = await api.request('GET', `/users?${query}`)
      assertProblem(res, 400, 'invalid_parameter', '/users')
      assert.deepEqual(errorPaths(res), ['q'])
    })
  }

  test('answers 400 invalid_parameter for a control character in a value', async () => {
    const res = await api.request('GET', '/users?q=a%00b')
    assertProblem(res, 400, 'invalid_parameter')
    assert.deepEqual(errorPaths(res), ['q'])
  })

  test('answers 400 invalid_parameter naming a badly encoded parameter name', async () => {
    assertProblem(await api.request('GET', '/users?%zz=1'), 400, 'invalid_parameter')
  })
})

// ---------------------------------------------------------------- conditional GET

describe('conditional GET', () => {
  test('answers If-None-Match with the current ETag by 304 with the ETag and no body', async () => {
    const user = await createUser(api)
    const get = await api.request('GET', `/users/${user.id}`)
    const etag = get.headers.get('etag')!
    assert.match(etag, /^"[^"]+"$/)
    assert.equal(etag, user.etag)
    for (const header of [etag, `W/${etag}`, `"nope", ${etag}`, '*']) {
      const res = await api.request('GET', `/users/${user.id}`, { headers: { 'if-none-match': header } })
      assert.equal(res.status, 304, header)
      assert.equal(res.headers.get('etag'), etag)
      assert.equal(res.text, '')
      assert.equal(res.headers.get('content-type'), null)
      assertCommon(res)
    }
    const head = await api.request('HEAD', `/users/${user.id}`, { headers: { 'if-none-match': etag } })
    assert.equal(head.status, 304)
  })

  test('answers 200 with the body when If-None-Match names another version', async () => {
    const user = await createUser(api)
    const old = user.etag
    const patched = await api.request('PATCH', `/users/${user.id}`, { body: { name: 'Changed' } })
    assert.equal(patched.status, 200)
    assert.notEqual(patched.headers.get('etag'), old)
    const res = await api.request('GET', `/users/${user.id}`, { headers: { 'if-none-match': old } })
    assert.equal(res.status, 200)
    assert.equal(res.body.name, 'Changed')
    assert.equal(res.headers.get('etag'), patched.headers.get('etag'))
  })

  test('ignores If-None-Match on a missing resource: still 404', async () => {
    assertProblem(await api.request('GET', '/users/999998', { headers: { 'if-none-match': '*' } }), 404, 'not_found')
  })
})

// ---------------------------------------------------------------- API_PREFIX

describe('API_PREFIX=/v1', () => {
  test('serves under the prefix, with Location including it', async () => {
    const res = await prefixed.request('POST', '/v1/users', { body: newUser() })
    assert.equal(res.status, 201, res.text)
    const location = res.headers.get('location')!
    assert.equal(location, `/v1/users/${res.body.id}`)
    const get = await prefixed.request('GET', location)
    assert.equal(get.status, 200)
    assert.equal(get.body.id, res.body.id)
    const [row] = await prefixed.sql<Array<{ email: string }>>`SELECT email FROM users WHERE id = ${res.body.id}`
    assert.equal(row!.email, res.body.email)
  })

  for (const path of ['/users', '/users/1', '/healthz', '/v1', '/v1/', '/v1x/users', '/V1/users', '/v1/v1/users']) {
    test(`answers 404 for ${path} outside the prefixed routes`, async () => {
      assertProblem(await prefixed.request('GET', path), 404, 'not_found', path)
    })
  }

  test('answers /v1/healthz and /v1/readyz', async () => {
    assert.equal((await prefixed.request('GET', '/v1/healthz')).status, 200)
    assert.equal((await prefixed.request('GET', '/v1/readyz')).status, 200)
  })

  test('reports the full path, prefix included, as the problem instance', async () => {
    assertProblem(await prefixed.request('GET', '/v1/users/0'), 404, 'not_found', '/v1/users/0')
    const res = await prefixed.request('DELETE', '/v1/users')
    assertProblem(res, 405, 'method_not_allowed', '/v1/users')
  })

  test('logs the template without the prefix', async () => {
    await prefixed.request('GET', '/v1/users/123456', { headers: { 'x-request-id': 'prefixed-log' } })
    const line = await logLine(prefixed, 'prefixed-log')
    assert.equal(line.route, '/users/{id}')
  })
})

// ---------------------------------------------------------------- unexpected errors

describe('unexpected errors', () => {
  test('answers 500 internal_error without a stack trace or database detail, and logs the stack', async () => {
    // Break this file's own database: the query fails in a way no mapping knows.
    await api.sql`ALTER TABLE users RENAME TO users_hidden`
    try {
      const res = await api.request('GET', '/users/1', { headers: { 'x-request-id': 'boom-500' } })
      assertProblem(res, 500, 'internal_error', '/users/1')
      assert.match(res.body.detail, /boom-500/)
      assert.doesNotMatch(res.text, /users_hidden|relation|does not exist|postgres/i)
      const error = api.logs.find((l) => l.level === 'error' && l.request_id === 'boom-500')
      assert.ok(error, 'no error log line')
      assert.equal(error.route, '/users/{id}')
      assert.match(String(error.stack), /\n\s+at /)
      assert.equal((await logLine(api, 'boom-500')).status, 500)
    } finally {
      await api.sql`ALTER TABLE users_hidden RENAME TO users`
    }
    assert.equal((await api.request('GET', '/users/1')).status === 500, false)
  })
})

describe('requests Node refuses before the pipeline', () => {
  // Each code has one status: a 431 has a code of its own.
  const cases: Array<[string, string, number, string]> = [
    [
      'Content-Length together with Transfer-Encoding',
      'POST /users HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
      400,
      'invalid_request',
    ],
    [
      'two different Content-Length headers',
      'POST /users HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}',
      400,
      'invalid_request',
    ],
    [
      'headers over 16 KiB',
      `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`,
      431,
      'headers_too_large',
    ],
  ]
  for (const [name, request, status, code] of cases) {
    test(`${name} gets ${status} as a problem with a request id, and the connection closes`, async () => {
      const res = await raw(api, [request])
      assert.equal(res.status, status)
      assert.equal(res.headers['content-type'], 'application/problem+json; charset=utf-8')
      assert.equal(res.headers['x-content-type-options'], 'nosniff')
      assert.equal(res.headers.connection, 'close')
      const body = JSON.parse(res.body)
      assert.equal(body.code, code)
      assert.equal(body.status, status)
      assert.equal(body.request_id, res.headers['x-request-id'])
    })
  }

  test(
    'an HTTP/1.1 request without Host gets 400 invalid_request as a problem through the pipeline, logged; ' +
      'HTTP/1.0 needs none',
    async () => {
      const res = await raw(api, ['GET /users HTTP/1.1\r\nConnection: close\r\n\r\n'])
      assert.equal(res.status, 400)
      assert.equal(res.headers['content-type'], 'application/problem+json; charset=utf-8')
      assert.equal(res.headers['x-content-type-options'], 'nosniff')
      const body = JSON.parse(res.body)
      assert.equal(body.code, 'invalid_request')
      assert.match(body.detail, /Host/)
      assert.equal(body.request_id, res.headers['x-request-id'])
      assert.equal((await logLine(api, body.request_id)).status, 400)
      const old = parseResponses(await rawExchange(api, ['GET /healthz HTTP/1.0\r\n\r\n']))
      assert.equal(old[0]?.status, 200)
    },
  )

  test(
    "an Expect other than 100-continue is ignored, as RFC 9110 allows: the request is served (not Node's empty " +
      '417)',
    async () => {
      const res = await raw(api, ['GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: foo\r\nConnection: close\r\n\r\n'])
      assert.equal(res.status, 200, res.body)
      assert.ok(res.headers['x-request-id'])
      const created = await raw(api, [
        `POST /users HTTP/1.1\r\nHost: x\r\nExpect: foo\r\nAuthorization: ` +
          `Bearer ${api.admin.token}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: ` +
          `close\r\n\r\n{}`,
      ])
      assert.equal(created.status, 422, 'the body was read and checked')
    },
  )

  test(
    'CONNECT gets 400 invalid_request as a problem with a request id, and the server closes the connection ' +
      'itself, even from a client that keeps its side open',
    async () => {
      const res = await raw(api, ['CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n'])
      assert.equal(res.status, 400)
      assert.equal(res.headers['content-type'], 'application/problem+json; charset=utf-8')
      assert.equal(res.headers.connection, 'close')
      const body = JSON.parse(res.body)
      assert.equal(body.code, 'invalid_request')
      assert.match(body.detail, /CONNECT/)
      assert.equal(body.request_id, res.headers['x-request-id'])
      const line = await logLine(api, body.request_id)
      assert.deepEqual([line.method, line.status], ['CONNECT', 400])

      // Node hands a CONNECT's socket over outside its time-outs and its tracking: one left half-open would hold a
      // connection slot, and the shutdown, for good.
      const accepted: Array<{ socket: Socket; port: number | undefined }> = []
      api.onConnection((s) => accepted.push({ socket: s, port: s.remotePort }))
      const socket = netConnect({ port: Number(new URL(api.url).port), host: '127.0.0.1', allowHalfOpen: true })
      socket.on('error', () => {})
      socket.resume()
      const answered = new Promise<void>((resolve, reject) => {
        socket.once('end', resolve)
        setTimeout(() => reject(new Error('no answer to CONNECT within 5 s')), 5000).unref()
      })
      socket.write('CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n')
      await answered
      try {
        const ours = accepted.find((a) => a.port === socket.localPort)?.socket
        assert.ok(ours, 'the server side of the connection')
        await waitUntil("the server to let go of the CONNECT's half-open connection", () => ours.destroyed, 2000)
      } finally {
        socket.destroy()
      }
    },
  )

  test('a client that resets its connection right after CONNECT does not take the process down', async () => {
    for (let i = 0; i < 5; i++) {
      const socket = netConnect(Number(new URL(api.url).port), '127.0.0.1')
      socket.on('error', () => {})
      await new Promise<void>((resolve) => socket.once('connect', resolve))
      socket.write('CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n')
      socket.resetAndDestroy()
    }
    await new Promise((r) => setTimeout(r, 200))
    assert.equal((await api.request('GET', '/healthz')).status, 200)
  })
})

describe('the Host header (RFC 9112 §3.2)', () => {
  /** A request to GET /healthz with these header lines (and Connection: close). */
  const withHost = (lines: string, version = '1.1') =>
    Buffer.from(`GET /healthz HTTP/${version}\r\n${lines}Connection: close\r\n\r\n`, 'latin1')

  function assertBadRequest(res: RawResponse, name: string): Record<string, unknown> {
    assert.equal(res.status, 400, `${name}: ${res.body}`)
    assert.equal(res.headers['content-type'], PROBLEM_TYPE, name)
    assert.equal(res.headers['x-content-type-options'], 'nosniff', name)
    const body = JSON.parse(res.body) as Record<string, unknown>
    assert.equal(body.code, 'invalid_request', name)
    assert.equal(body.type, 'tag:users-products-api,2026:invalid_request', name)
    assert.equal(body.status, 400, name)
    assert.equal(body.request_id, res.headers['x-request-id'], name)
    return body
  }

  test('more than one Host line, whatever their case, values or order, gets 400 invalid_request', async () => {
    const cases: Record<string, string> = {
      'two different': 'Host: x\r\nHost: evil.example\r\n',
      'the same twice': 'Host: x\r\nHost: x\r\n',
      'in other cases': 'host: x\r\nHOST: evil.example\r\n',
      'an empty one after': 'Host: x\r\nHost:\r\n',
      'an empty one before': 'Host:\r\nHost: x\r\n',
      'apart, other headers between': 'Host: x\r\nAccept: */*\r\nHost: evil.example\r\n',
    }
    for (const [name, lines] of Object.entries(cases)) {
      const body = assertBadRequest(await raw(api, [withHost(lines)]), name)
      assert.equal(body.detail, 'A request must carry one Host header, not more.', name)
      assert.equal(body.instance, '/healthz', name)
    }
    assertBadRequest(await raw(api, [withHost('Host: x\r\nHost: y\r\n', '1.0')]), 'HTTP/1.0 too')
  })

  test('a Host that is not uri-host[:port] gets 400 invalid_request, and its value is not echoed', async () => {
    const cases: Record<string, string> = {
      'a space': 'a b',
      'a tab': 'a\tb',
      'a byte over 127': 'caf\xe9.example',
      'user information': 'user@evil.example',
      'a path': 'evil.example/x',
      'a query': 'evil.example?x',
      'a fragment': 'evil.example#x',
      'a letter in the port': 'example.com:8o',
      'a port over 65535': 'example.com:65536',
      'a port of six digits': 'example.com:000080',
      'two ports': 'example.com:80:80',
      'a bad percent-escape': 'ex%zzample.com',
      'an unclosed IPv6 literal': '[::1',
      'an invalid IPv6 literal': '[::g]:80',
      'an IPv6 address without brackets': '::1',
      'a list': 'a.example, b.example',
      'a quoted string': '"example.com"',
      'a backslash': 'evil.example\\@x',
    }
    for (const [name, value] of Object.entries(cases)) {
      const res = await raw(api, [withHost(`Host: ${value}\r\n`)])
      const body = assertBadRequest(res, name)
      assert.equal(body.detail, 'The Host header must be a host name or address and an optional port.', name)
      assert.equal(res.body.includes(value), false, `${name}: the value is echoed`)
    }
    // Control characters Node's parser refuses itself (the same problem, from src/app.ts).
    for (const [name, value] of Object.entries({ 'a control character': 'a\x01b', DEL: 'a\x7fb' })) {
      const body = assertBadRequest(await raw(api, [withHost(`Host: ${value}\r\n`)]), name)
      assert.equal(body.detail, 'The request could not be read.', name)
    }
  })

  test('a duplicated Host does not reach the handler: nothing is created', async () => {
    const before = await countUsers(api)
    const payload = JSON.stringify(newUser())
    const res = await raw(api, [
      `POST /users HTTP/1.1\r\nHost: x\r\nHost: evil.example\r\nContent-Type: application/json\r\n` +
        `Content-Length: ${Buffer.byteLength(payload)}\r\nConnection: close\r\n\r\n${payload}`,
    ])
    assertBadRequest(res, 'POST /users')
    assert.equal(await countUsers(api), before)
  })

  test('one valid Host is served: names, addresses, ports, an empty value; HTTP/1.0 without one', async () => {
    const valid = [
      'x',
      'api.example.com',
      'api.example.com:443',
      'api.example.com:',
      '127.0.0.1:8080',
      '[::1]',
      '[::1]:8080',
      '[2001:db8::7]:443',
      '[v1.fe80::a+en1]',
      'xn--caf-dma.example',
      'under_score.example',
      'ex%41mple.com',
      '',
    ]
    for (const value of valid) {
      const res = await raw(api, [withHost(`Host: ${value}\r\n`)])
      assert.equal(res.status, 200, `Host: ${value}: ${res.body}`)
    }
    assert.equal((await raw(api, [withHost('', '1.0')])).status, 200)
  })
})
