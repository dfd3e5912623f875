import Type from 'typebox'
import { isAdmin, type Principal } from '../auth/principal.js'
import { isScope } from '../auth/scopes.js'
import { displayPrefix, hashSecret, newSecret } from '../auth/tokens.js'
import { listCollection } from '../collections/list-query.js'
import { HttpError, notFound, validationFailed } from '../http/problem.js'
import { defineRoute } from '../http/route.js'
import { compileValidator } from '../http/validate.js'
import { NameSchema } from '../resources/common.js'
import { apiKeysCollection } from './collection.js'
import { deleteApiKey, findApiKey, insertApiKey, presentApiKey, type ApiKeyRow } from './queries.js'

const ApiKeyCreate = Type.Object(
  {
    name: NameSchema,
    scopes: Type.Array(Type.String({ maxLength: 64 }), { minItems: 1, maxItems: 6, uniqueItems: true }),
    expires_at: Type.Optional(Type.Union([Type.String({ format: 'date-time', description: 'an RFC 3339 timestamp in the future' }), Type.Null()])),
  },
  { additionalProperties: false },
)

const userIdOf = (p: Principal) => (p.kind === 'user' ? p.userId : '')

export const apiKeyRoutes = [
  defineRoute({
    method: 'GET',
    path: '/api-keys',
    access: { kind: 'protected', scope: 'api_keys:read', who: 'any' },
    query: apiKeysCollection.queryValidator,
    handle({ query, principal, deps }) {
      // Everyone lists their own keys; an admin lists anyone's, or one user's with ?user_id=.
      if (!isAdmin(principal) && query.user_id !== undefined && query.user_id !== userIdOf(principal)) {
        throw new HttpError(403, 'forbidden', 'Only an admin may list the keys of another user.')
      }
      return listCollection(apiKeysCollection, query, {
        sql: deps.sql,
        cursorKeys: deps.cursorKeys,
        basePath: `${deps.config.apiPrefix}/api-keys`,
        present: (row) => presentApiKey(row as unknown as ApiKeyRow),
        fixedFilters: isAdmin(principal) ? {} : { user_id: userIdOf(principal) },
      })
    },
  }),

  defineRoute({
    method: 'POST',
    path: '/api-keys',
    access: { kind: 'protected', scope: 'api_keys:write', who: 'any' },
    body: { kind: 'json', validator: compileValidator(ApiKeyCreate) },
    async handle({ body, principal, deps }) {
      if (principal.kind !== 'user') throw new Error('unreachable: protected route')
      const unknown = body.scopes.findIndex((s) => !isScope(s))
      if (unknown !== -1) throw validationFailed([{ path: `/scopes/${unknown}`, message: 'is not a scope' }])
      // A key can never do more than the credential that created it.
      const beyond = body.scopes.filter((s) => !principal.scopes.has(s as never))
      if (beyond.length) throw new HttpError(403, 'insufficient_scope', `A key cannot have scopes its creator lacks: ${beyond.join(' ')}.`)
      const expiresAt = body.expires_at ? new Date(body.expires_at) : null
      if (expiresAt && expiresAt.getTime() <= Date.now()) throw validationFailed([{ path: '/expires_at', message: 'must be in the future' }])
      const key = newSecret('apiKey')
      const row = await insertApiKey(deps.sql, {
        user_id: Number(principal.userId), name: body.name, prefix: displayPrefix(key), key_hash: hashSecret(key), scopes: body.scopes, expires_at: expiresAt,
      })
      return {
        status: 201,
        headers: { location: `${deps.config.apiPrefix}/api-keys/${row.id}`, 'cache-control': 'no-store' },
        body: { ...presentApiKey(row), key },
      }
    },
  }),

  defineRoute({
    method: 'GET',
    path: '/api-keys/{id}',
    access: { kind: 'protected', scope: 'api_keys:read', who: 'any' },
    async handle({ params, principal, deps }) {
      const row = await findApiKey(deps.sql, params.id!, isAdmin(principal) ? undefined : userIdOf(principal))
      if (!row) throw notFound()
      return { status: 200, body: presentApiKey(row) }
    },
  }),

  defineRoute({
    method: 'DELETE',
    path: '/api-keys/{id}',
    access: { kind: 'protected', scope: 'api_keys:write', who: 'any' },
    async handle({ params, principal, deps }) {
      const row = await findApiKey(deps.sql, params.id!, isAdmin(principal) ? undefined : userIdOf(principal))
      if (!row) throw notFound()
      await deleteApiKey(deps.sql, row.id)
      return { status: 204 }
    },
  }),
]
