import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { test } from 'node:test'
import { Validator } from '@seriousme/openapi-schema-validator'
import { allRoutes } from '../src/app.js'
import { applicationRegistry } from './helpers/registry.js'
import { startServer } from './helpers/server.js'

// The document itself: valid OpenAPI 3.1 by an independent validator, and
// complete for every route. (That every answer matches it is checked on every
// request the suite makes, by test/helpers/contract-check.ts.)

const api = await startServer({ API_PREFIX: '/v1' })
const res = await api.request('GET', '/v1/openapi.json', { auth: null })
const doc = res.body

test('GET /openapi.json is public JSON', () => {
  assert.equal(res.status, 200)
  assert.match(res.headers.get('content-type')!, /^application\/json/)
})

test('the document is valid OpenAPI 3.1 according to an independent validator', async () => {
  const validator = new Validator()
  const result = await validator.validate(structuredClone(doc))
  assert.equal(result.valid, true, JSON.stringify(result.errors, null, 1)?.slice(0, 2000))
  assert.equal(validator.version, '3.1')
})

test('info.version is the package version and the server URL carries API_PREFIX', () => {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }
  assert.equal(doc.info.version, pkg.version)
  assert.deepEqual(doc.servers, [{ url: '/v1' }])
})

test('every route is an operation with a summary, a success answer and problem answers', () => {
  for (const route of allRoutes(applicationRegistry, '')) {
    const op = doc.paths[route.path]?.[route.method.toLowerCase()]
    assert.ok(op, `${route.method} ${route.path} missing`)
    assert.ok(op.summary, `${route.method} ${route.path} has no summary`)
    const statuses = Object.keys(op.responses).map(Number)
    assert.ok(
      statuses.some((s) => s >= 200 && s < 300),
      `${route.method} ${route.path} declares no success`,
    )
    assert.ok(statuses.includes(500))
    assert.equal(op.responses['500'].content['application/problem+json'].schema.$ref, '#/components/schemas/Problem')
  }
  // eslint-disable-line @typescript-eslint/no-explicit-any
  const ids = Object.values(doc.paths).flatMap((p: any) => Object.values(p).map((o: any) => o.operationId))
  assert.equal(new Set(ids).size, ids.length, 'operationIds are unique')
})

test('collections document their filter operators, sort, paging and count parameters', () => {
  const names = doc.paths['/products'].get.parameters.map((p: { name: string }) => p.name)
  for (const n of [
    'price',
    'price[gte]',
    'price[in]',
    'currency[ne]',
    'q',
    'sort',
    'limit',
    'cursor',
    'offset',
    'count',
    'fields',
  ])
    assert.ok(names.includes(n), n)
  assert.deepEqual(
    Object.keys(doc.paths['/products'].get.responses['200'].headers).sort(),
    ['Link', 'RateLimit-Limit', 'RateLimit-Remaining', 'RateLimit-Reset', 'X-Request-Id', 'X-Total-Count'].sort(),
  )
})

test('writes document If-Match and creates document Idempotency-Key, with their answers', () => {
  const patch = doc.paths['/users/{id}'].patch
  assert.ok(patch.parameters.some((p: { name: string; in: string }) => p.name === 'If-Match' && p.in === 'header'))
  assert.ok(patch.responses['412'] && patch.responses['428'])
  assert.deepEqual(Object.keys(patch.requestBody.content).sort(), ['application/json', 'application/merge-patch+json'])
  const post = doc.paths['/products'].post
  assert.ok(post.parameters.some((p: { name: string }) => p.name === 'Idempotency-Key'))
  assert.ok(post.responses['201'].headers.Location && post.responses['201'].headers.ETag)
})

test('request bodies are the validating schemas: strict, with the contract bounds', () => {
  const { $ref } = doc.paths['/users'].post.requestBody.content['application/json'].schema
  assert.equal($ref, '#/components/schemas/UserCreate')
  const schema = doc.components.schemas.UserCreate
  assert.equal(schema.additionalProperties, false)
  assert.deepEqual(schema.required.sort(), ['email', 'name'])
  assert.equal(schema.properties.name.maxLength, 200)
})

test("security: our bearer tokens, the identity provider's and API keys, with the scope each operation needs", () => {
  assert.deepEqual(Object.keys(doc.components.securitySchemes).sort(), [
    'apiKeyAuth',
    'bearerAuth',
    'identityProviderAuth',
  ])
  assert.equal(doc.components.securitySchemes.identityProviderAuth.bearerFormat, 'JWT')
  assert.deepEqual(doc.paths['/products'].post.security, [
    { bearerAuth: ['products:write'] },
    { identityProviderAuth: ['products:write'] },
    { apiKeyAuth: ['products:write'] },
  ])
  // Session management is for a person: no API key.
  assert.deepEqual(doc.paths['/auth/sessions'].get.security, [{ bearerAuth: [] }, { identityProviderAuth: [] }])
  assert.deepEqual(doc.paths['/healthz'].get.security, [])
  assert.deepEqual(doc.paths['/auth/login'].post.security, [])
})

test('operations have the names generated clients will use, and resources named component schemas', () => {
  const id = (path: string, method: string) => doc.paths[path][method].operationId
  assert.deepEqual(
    [
      id('/users', 'get'),
      id('/users', 'post'),
      id('/users/{id}', 'get'),
      id('/users/{id}', 'put'),
      id('/users/{id}', 'patch'),
      id('/users/{id}', 'delete'),
    ],
    ['listUsers', 'createUser', 'getUser', 'replaceUser', 'updateUser', 'deleteUser'],
  )
  assert.deepEqual(
    [id('/auth/login', 'post'), id('/auth/refresh', 'post'), id('/api-keys', 'post'), id('/healthz', 'get')],
    ['login', 'refreshTokens', 'createApiKey', 'getHealth'],
  )
  for (const name of [
    'User',
    'UserPage',
    'UserCreate',
    'UserReplace',
    'UserPatch',
    'Product',
    'ProductPage',
    'ApiKey',
    'ApiKeyCreate',
    'ApiKeyCreated',
  ])
    assert.ok(doc.components.schemas[name], name)
  // API keys are never replaced or patched: no body schemas for operations that do not exist.
  assert.equal(doc.components.schemas.ApiKeyPatch, undefined)
  assert.equal(
    doc.paths['/api-keys'].post.responses['201'].content['application/json'].schema.$ref,
    '#/components/schemas/ApiKeyCreated',
  )
  // A secret member is never part of a representation.
  assert.equal(doc.components.schemas.User.properties.password, undefined)
  assert.ok(doc.components.schemas.UserCreate.properties.password)
})
