import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { allRoutes } from '../src/app.js'
import { applicationRegistry } from './helpers/registry.js'

const appRoutes = allRoutes(applicationRegistry, '')
import { publicAccess } from '../src/auth/access.js'
import { defineRoute, type AnyRoute, type Method } from '../src/core/http/route.js'
import { createRouter, isBigintId, type Match } from '../src/core/http/router.js'

// The router alone, no server: how templates compile, what `{id}` accepts,
// and which kind of match each method gets.

const route = (method: Method, path: string): AnyRoute =>
  defineRoute({ method, path, access: publicAccess, handle: async () => ({ status: 200, body: { method, path } }) })

const table = [
  route('GET', '/things'),
  route('POST', '/things'),
  route('GET', '/things/{id}'),
  route('PUT', '/things/{id}'),
  route('DELETE', '/things/{id}'),
  route('POST', '/things/{id}/archive'),
  route('GET', '/things/latest'),
  route('POST', '/only-post'),
]
const router = createRouter(table)

/** Allow as a sorted list, so the test does not depend on the order methods were declared in. */
const allowOf = (m: Match) => {
  assert.ok(m.kind === 'options' || m.kind === 'method_not_allowed', `expected an Allow list, got ${m.kind}`)
  return m.allow
    .split(',')
    .map((s) => s.trim())
    .sort()
}

describe('route table compilation', () => {
  test('compiles the application route table without throwing', () => {
    const compiled = createRouter(appRoutes)
    assert.equal(compiled.routes.length, appRoutes.length)
    const users = compiled.match('GET', '/users/1')
    assert.equal(users.kind, 'found')
    assert.equal(users.kind === 'found' && users.template, '/users/{id}')
  })

  const malformed = [
    ['empty', ''],
    ['no leading slash', 'things'],
    ['trailing slash', '/things/'],
    ['root only', '/'],
    ['empty segment', '/things//x'],
    ['upper case', '/Things'],
    ['unclosed brace', '/things/{id'],
    ['text after a parameter', '/things/{id}x'],
    ['upper-case parameter name', '/things/{ID}'],
    ['unknown parameter name', '/things/{name}'],
    ['space', '/things/a b'],
    ['query string', '/things?x=1'],
  ] as const
  for (const [what, path] of malformed) {
    test(`refuses a malformed template at construction (${what}: ${JSON.stringify(path)})`, () => {
      assert.throws(
        () => createRouter([route('GET', path)]),
        (err: Error) => {
          assert.match(err.message, /malformed|unknown parameter/)
          return true
        },
      )
    })
  }

  test('refuses the same method and template defined twice, naming them', () => {
    assert.throws(
      () => createRouter([route('GET', '/things/{id}'), route('PUT', '/things/{id}'), route('GET', '/things/{id}')]),
      /GET \/things\/\{id\} is defined twice/,
    )
  })

  test('accepts the same template with different methods', () => {
    assert.doesNotThrow(() => createRouter([route('GET', '/things/{id}'), route('PUT', '/things/{id}')]))
  })
})

describe('{id} parameter', () => {
  const rejected = [
    ['letters', 'abc'],
    ['zero', '0'],
    ['negative', '-1'],
    ['decimal', '1.5'],
    ['leading zero', '01'],
    ['exponent', '1e3'],
    ['plus sign', '+1'],
    ['percent-encoded digit', '%31'],
    ['trailing space', '1 '],
    ['empty', ''],
    ['20 digits', '12345678901234567890'],
    ['bigint max + 1', '9223372036854775808'],
    ['19 nines', '9999999999999999999'],
  ] as const
  for (const [what, id] of rejected) {
    test(`does not match /things/{id} with ${what} (${JSON.stringify(id)})`, () => {
      assert.equal(isBigintId(id), false)
      assert.deepEqual(router.match('GET', `/things/${id}`), { kind: 'not_found' })
    })
  }

  for (const id of ['1', '42', '9223372036854775807']) {
    test(`matches /things/{id} with ${id} and passes it on as a string`, () => {
      assert.equal(isBigintId(id), true)
      const m = router.match('GET', `/things/${id}`)
      assert.equal(m.kind, 'found')
      assert.deepEqual(m.kind === 'found' && m.params, { id })
    })
  }
})

describe('matching', () => {
  test('finds the route for its method and reports the template, not the path', () => {
    const m = router.match('PUT', '/things/7')
    assert.equal(m.kind, 'found')
    if (m.kind !== 'found') return
    assert.equal(m.route.method, 'PUT')
    assert.equal(m.template, '/things/{id}')
  })

  test('matches nested templates', () => {
    const m = router.match('POST', '/things/7/archive')
    assert.equal(m.kind === 'found' && m.template, '/things/{id}/archive')
    assert.deepEqual(m.kind === 'found' && m.params, { id: '7' })
  })

  test('prefers a literal segment over {id}, whatever the declaration order', () => {
    const m = router.match('GET', '/things/latest')
    assert.equal(m.kind === 'found' && m.template, '/things/latest')
  })

  const notFound = [
    '/nothing',
    '/things/',
    '/things/1/',
    '//things',
    '/things/1/2',
    'things',
    '',
    '/THINGS',
    '/things/1/archive/x',
  ]
  for (const path of notFound) {
    test(`answers not_found for ${JSON.stringify(path)}`, () => {
      assert.deepEqual(router.match('GET', path), { kind: 'not_found' })
    })
  }

  test('answers method_not_allowed with the Allow list for a known path and another method', () => {
    const m = router.match('PATCH', '/things/1')
    assert.equal(m.kind, 'method_not_allowed')
    assert.deepEqual(allowOf(m), ['DELETE', 'GET', 'HEAD', 'OPTIONS', 'PUT'])
    assert.equal(m.kind === 'method_not_allowed' && m.template, '/things/{id}')
  })

  test('lists HEAD only where GET exists', () => {
    assert.deepEqual(allowOf(router.match('GET', '/only-post')), ['OPTIONS', 'POST'])
    assert.deepEqual(allowOf(router.match('PUT', '/things')), ['GET', 'HEAD', 'OPTIONS', 'POST'])
  })

  test('HEAD falls back to the GET route', () => {
    const m = router.match('HEAD', '/things/3')
    assert.equal(m.kind, 'found')
    assert.equal(m.kind === 'found' && m.route.method, 'GET')
  })

  test('HEAD on a path without GET is method_not_allowed', () => {
    assert.equal(router.match('HEAD', '/only-post').kind, 'method_not_allowed')
  })

  test('OPTIONS on a known path answers with its Allow list', () => {
    const m = router.match('OPTIONS', '/things')
    assert.equal(m.kind, 'options')
    assert.deepEqual(allowOf(m), ['GET', 'HEAD', 'OPTIONS', 'POST'])
  })

  test('OPTIONS on an unknown path or an id that is not one is not_found', () => {
    assert.deepEqual(router.match('OPTIONS', '/nothing'), { kind: 'not_found' })
    assert.deepEqual(router.match('OPTIONS', '/things/0'), { kind: 'not_found' })
  })

  test('an unknown method name is method_not_allowed, not a crash', () => {
    assert.equal(router.match('PROPFIND', '/things').kind, 'method_not_allowed')
  })
})

describe('noStore', () => {
  const secret = defineRoute({
    method: 'POST',
    path: '/secret',
    access: publicAccess,
    noStore: true,
    handle: async () => ({ status: 204 }),
  })
  const plain = defineRoute({
    method: 'GET',
    path: '/secret',
    access: publicAccess,
    handle: async () => ({ status: 204 }),
  })
  const withSecret = createRouter([...table, secret, plain])
  const noStoreOf = (m: Match) => (m.kind === 'not_found' ? undefined : m.noStore)

  test('a found route carries its own declaration', () => {
    assert.equal(noStoreOf(withSecret.match('POST', '/secret')), true)
    assert.equal(noStoreOf(withSecret.match('GET', '/secret')), false)
    assert.equal(noStoreOf(withSecret.match('GET', '/things')), false)
  })

  test('OPTIONS and 405 on a path where any route declares it carry it too', () => {
    assert.equal(noStoreOf(withSecret.match('OPTIONS', '/secret')), true)
    assert.equal(noStoreOf(withSecret.match('DELETE', '/secret')), true)
    assert.equal(noStoreOf(withSecret.match('OPTIONS', '/things')), false)
    assert.equal(noStoreOf(withSecret.match('DELETE', '/things')), false)
  })

  test('every route of the service under /auth/ declares it', () => {
    const auth = appRoutes.filter((r) => r.path.startsWith('/auth/'))
    assert.ok(auth.length > 0)
    assert.deepEqual(
      auth.filter((r) => !r.noStore).map((r) => `${r.method} ${r.path}`),
      [],
    )
  })
})
