import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { after, test } from 'node:test'
import { allRoutes } from '../src/app.js'
import { loadConfig } from '../src/config.js'
import { createLogger } from '../src/core/log.js'
import type { AnyRoute } from '../src/core/http/route.js'
import type { Registry } from '../src/registry.js'
import { createService } from '../src/service.js'
import { categoriesRegistry } from './helpers/categories.js'
import { applicationRegistry } from './helpers/registry.js'

// The docs' tables of routes, scopes, event types and problem codes are
// written by hand for their readers, and held here against the registry the
// service builds: a route, scope, event type or code added to the service and
// not to the docs (or documented and gone) fails, naming it.

const doc = (name: string) => readFileSync(new URL(`../docs/${name}`, import.meta.url), 'utf8')
const routes = allRoutes(applicationRegistry, '')

/**
 * docs/auth.md's access table: each row's endpoints as `METHOD /path`, and
 * its scope. A cell lists endpoints separated by commas; methods before a
 * path all apply to it, and a path without methods takes the previous ones
 * ("GET /products, /products/{id}", "PUT, PATCH, DELETE /users/{id}").
 */
function accessTable(markdown: string): Map<string, string> {
  const table = new Map<string, string>()
  for (const line of markdown.split('\n')) {
    const cells = line.split('|').map((c) => c.trim())
    if (cells.length !== 5 || !/^(GET|POST|PUT|PATCH|DELETE)\b/.test(cells[1]!)) continue
    const scope = cells[3]!
    let methods: string[] = []
    let pending: string[] = []
    for (const item of cells[1]!.split(/,\s*/)) {
      const [first, path] = item.split(' ')
      if (first!.startsWith('/')) {
        for (const method of methods) table.set(`${method} ${first}`, scope)
      } else if (path === undefined) pending.push(first!)
      else {
        methods = [...pending, first!]
        pending = []
        for (const method of methods) table.set(`${method} ${path}`, scope)
      }
    }
  }
  return table
}

test('the access table reader reads a cell of several endpoints as the docs write it', () => {
  const table = accessTable(
    '| POST /products, PUT, PATCH, DELETE /products/{id}, /things | admin | products:write |\n| GET /a | any | |\n',
  )
  assert.deepEqual(
    [...table],
    [
      ['POST /products', 'products:write'],
      ['PUT /products/{id}', 'products:write'],
      ['PATCH /products/{id}', 'products:write'],
      ['DELETE /products/{id}', 'products:write'],
      ['PUT /things', 'products:write'],
      ['PATCH /things', 'products:write'],
      ['DELETE /things', 'products:write'],
      ['GET /a', ''],
    ],
  )
})

test(
  "docs/auth.md's access table has every route that needs a credential, with its scope; what else it lists " + 'exists',
  () => {
    const table = accessTable(doc('auth.md'))
    const scopeOf = new Map(
      routes.map((r) => [`${r.method} ${r.path}`, r.access.kind === 'protected' ? (r.access.scope ?? '') : '']),
    )
    const needed = routes.filter((r) => r.access.kind === 'protected').map((r) => `${r.method} ${r.path}`)
    const wrong = needed.filter((route) => table.get(route) !== scopeOf.get(route))
    assert.deepEqual(
      wrong.map((route) => `${route}: ${scopeOf.get(route) || 'no scope'} (docs: ${table.get(route) ?? 'missing'})`),
      [],
    )
    assert.deepEqual(
      [...table].filter(([route, scope]) => scopeOf.get(route) !== scope).map(([route]) => route),
      [],
      'documented, but no such route, or another scope',
    )
  },
)

/** docs/auth.md's scope list, as written. */
const listedScopes = /^Scopes: `([^`]+)`/m.exec(doc('auth.md'))?.[1]?.split(/\s+/) ?? []

test('docs/auth.md lists every scope, and no other', () => {
  assert.deepEqual([...listedScopes].sort(), [...applicationRegistry.scopes.all].sort())
})

test("docs/auth.md's example login of an admin shows every scope an admin gets", () => {
  const shown = /^ "scope":"([^"]+)"/m.exec(doc('auth.md'))?.[1]
  assert.equal(shown, [...applicationRegistry.scopes.byRole.admin].sort().join(' '))
})

const eventsDoc = doc('events.md')
/** The event types docs/events.md does not name. */
const unnamedEventTypes = (registry: Registry) =>
  registry.eventTypes.filter((type) => !eventsDoc.includes(`\`${type}\``))

test('docs/events.md names every event type a webhook may subscribe to', () => {
  assert.deepEqual(unnamedEventTypes(applicationRegistry), [])
})

const problemDocs = ['api.md', 'auth.md', 'events.md', 'operations.md', 'security.md'].map(doc).join('\n')
/** The problem codes no page of docs/ names. */
const unnamedProblems = (registry: Registry) =>
  Object.keys(registry.problems).filter((code) => !problemDocs.includes(`\`${code}\``))

test('every problem code the service may answer with is documented in docs/', () => {
  assert.deepEqual(unnamedProblems(applicationRegistry), [])
})

/** README.md's endpoint table: each row's methods and paths ("GET, PUT | /a, /a/{id}"), as written. */
function endpointRows(markdown: string): Array<{ methods: string[]; paths: string[] }> {
  return markdown.split('\n').flatMap((line) => {
    const cells = line.split('|').map((c) => c.trim())
    if (cells.length < 4 || !/^(GET|POST|PUT|PATCH|DELETE)\b/.test(cells[1]!)) return []
    return [{ methods: cells[1]!.split(/,\s*/), paths: cells[2]!.split(/,\s*/) }]
  })
}

const readmeRows = endpointRows(readFileSync(new URL('../README.md', import.meta.url), 'utf8'))
/** The routes README.md's endpoint table has no row for, as `METHOD /path`. */
const rowlessRoutes = (all: readonly AnyRoute[]) =>
  all
    .filter((r) => !readmeRows.some((row) => row.methods.includes(r.method) && row.paths.includes(r.path)))
    .map((r) => `${r.method} ${r.path}`)

test("README.md's endpoint table has a row for every route, and every row names a route", () => {
  assert.ok(readmeRows.length > 10, `only ${readmeRows.length} rows read`)
  assert.deepEqual(rowlessRoutes(routes), [])
  const paths = new Set(routes.map((r) => r.path))
  assert.deepEqual(
    readmeRows.flatMap((r) => r.paths).filter((p) => !paths.has(p)),
    [],
    'a path in the table that no route has',
  )
})

/**
 * What a registry's service has that the docs do not name: routes (README.md, docs/auth.md), scopes, event types,
 * problem codes.
 */
function undocumented(registry: Registry): string[] {
  const all = allRoutes(registry, '')
  const access = accessTable(doc('auth.md'))
  return [
    ...rowlessRoutes(all).map((route) => `README.md: ${route}`),
    ...all
      .filter((r) => r.access.kind === 'protected' && !access.has(`${r.method} ${r.path}`))
      .map((r) => `docs/auth.md: ${r.method} ${r.path}`),
    ...registry.scopes.all.filter((s) => !listedScopes.includes(s)).map((s) => `docs/auth.md: scope ${s}`),
    ...unnamedEventTypes(registry).map((type) => `docs/events.md: ${type}`),
    ...unnamedProblems(registry).map((code) => `docs/: problem ${code}`),
  ]
}

test('a module added to the service (the test-only categories) is asked for in every docs table, row by row', () => {
  assert.deepEqual(undocumented(applicationRegistry), [])
  assert.deepEqual(undocumented(categoriesRegistry), [
    'README.md: GET /categories',
    'README.md: POST /categories',
    'README.md: GET /categories/{id}',
    'README.md: PUT /categories/{id}',
    'README.md: PATCH /categories/{id}',
    'README.md: DELETE /categories/{id}',
    'README.md: POST /categories/{id}/restore',
    'docs/auth.md: GET /categories',
    'docs/auth.md: POST /categories',
    'docs/auth.md: GET /categories/{id}',
    'docs/auth.md: PUT /categories/{id}',
    'docs/auth.md: PATCH /categories/{id}',
    'docs/auth.md: DELETE /categories/{id}',
    'docs/auth.md: POST /categories/{id}/restore',
    'docs/auth.md: scope categories:read',
    'docs/auth.md: scope categories:write',
    'docs/events.md: category.created',
    'docs/events.md: category.updated',
    'docs/events.md: category.deleted',
    'docs/events.md: category.restored',
    'docs/events.md: category.purged',
    'docs/: problem category_name_taken',
  ])
})

/** The first backticked name of each row of the docs/architecture.md table whose header starts with `header`. */
function tableNames(markdown: string, header: string): Array<{ names: string[]; row: string }> {
  const start = markdown.indexOf(`\n${header}`)
  assert.ok(start >= 0, `no table "${header}"`)
  const lines = markdown.slice(start + 1).split('\n')
  const rows = lines.slice(
    2,
    lines.findIndex((l, i) => i > 0 && !l.startsWith('|')),
  )
  return rows.map((row) => ({
    row,
    names: [...(row.split('|')[header.startsWith('| order') ? 2 : 1] ?? '').matchAll(/`([a-z.-]+)`/g)].map(
      (m) => m[1]!,
    ),
  }))
}

/**
 * A service as src/start.ts makes one, with every optional part (an
 * identity provider); it opens nothing, as it never listens.
 */
const service = createService(
  {
    ...loadConfig({
      JWT_SECRETS: 'docs:0123456789abcdef0123456789abcdef',
      OIDC_ISSUER: 'https://idp.example.com',
      OIDC_AUDIENCE: 'api',
    }),
    databaseUrl: 'postgres://nobody@127.0.0.1:9/none',
    databasePooler: 'none',
  },
  { log: createLogger('error', () => {}) },
)
after(() => service.close())

test("docs/architecture.md's component table lists the service's components in the order they start", async () => {
  const documented = tableNames(doc('architecture.md'), '| order | component |').map((r) => r.names[0])
  assert.deepEqual(documented, service.lifecycle.names)
})

test(
  "docs/architecture.md's job table lists every job of the service, and no other (TLS's only with " + 'TLS)',
  async () => {
    const rows = tableNames(doc('architecture.md'), '| job | period |')
    const documented = rows.flatMap((r) => (/with TLS only/.test(r.row) ? [] : r.names))
    assert.deepEqual([...documented].sort(), service.scheduler.specs.map((s) => s.name).sort())
    assert.ok(rows.some((r) => r.names.includes('tls.certificate-reload')))
  },
)
