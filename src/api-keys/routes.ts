import Type from 'typebox'
import { challenge } from '../auth/credentials.js'
import { isAdmin, type Principal } from '../auth/principal.js'
import { isScope } from '../auth/scopes.js'
import { displayPrefix, hashSecret, newSecret } from '../auth/tokens.js'
import { listCollection } from '../collections/list-query.js'
import { HttpError, notFound, validationFailed } from '../http/problem.js'
import { defineRoute } from '../http/route.js'
import { compileValidator } from '../http/validate.js'
import { NameSchema } from '../resources/common.js'
import { apiKeysCollection } from './collection.js'
import { deleteApiKey, findApiKey, insertApiKey, presentApiKey } from './queries.js'

const ApiKeyCreate = Type.Object(
  {
    name: NameSchema,
    scopes: Type.Array(Type.String({ maxLength: 64 }), { minItems: 1, maxItems: 6, uniqueItems: true }),
    expires_at: Type.Optional(Type.Union([Type.String({ format: 'date-time', description: 'an RFC 3339 timestamp in the future' }), Type.Null()])),
  },
  { additionalProperties: false },
)

/** An API key as listed: never its secret. */
const ApiKey = Type.Object({
  id: Type.Integer({ minimum: 1 }),
  name: Type.String(),
  prefix: Type.String(),
  scopes: Type.Array(Type.String()),
  created_at: Type.String({ format: 'date-time' }),
  expires_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
  last_used_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
  user_id: Type.Integer({ minimum: 1 }),
}, { additionalProperties: false })
/** The answer to its creation, the one time the secret `key` is shown. */
const ApiKeyCreated = Type.Object({ ...ApiKey.properties, key: Type.String() }, { additionalProperties: false })

const userIdOf = (p: Principal) => (p.kind === 'user' ? p.userId : '')

export const apiKeyRoutes = [
  defineRoute({
    method: 'GET',
    path: '/api-keys',
    summary: 'List API keys: one\'s own, or anyone\'s for an admin',
    responses: { 200: { description: 'A page of keys', schema: Type.Array(Type.Partial(ApiKey)), headers: ['link', 'x-total-count'] } },
    access: { kind: 'protected', scope: 'api_keys:read', who: 'any' },
    query: apiKeysCollection.queryValidator,
    handle({ query, principal, deps }) {
      // Everyone lists their own keys; an admin lists anyone's, or one user's with ?user_id=.
      if (!isAdmin(principal) && query.user_id !== undefined && query.user_id !== userIdOf(principal)) {
        throw new HttpError('forbidden', 'Only an admin may list the keys of another user.')
      }
      return listCollection(apiKeysCollection, query, {
        deps,
        fixedFilters: isAdmin(principal) ? {} : { user_id: userIdOf(principal) },
      })
    },
  }),

  defineRoute({
    method: 'POST',
    path: '/api-keys',
    summary: 'Create an API key; the secret is in this answer only',
    responses: { 201: { description: 'The key, with its secret', schema: ApiKeyCreated, headers: ['location'] } },
    access: { kind: 'protected', scope: 'api_keys:write', who: 'any' },
    // Not idempotent on purpose: a replay would have to store the secret, and
    // only its hash may be stored. A retried POST creates a second key; delete the spare.
    body: { kind: 'json', validator: compileValidator(ApiKeyCreate) },
    async handle({ body, principal, deps }) {
      if (principal.kind !== 'user') throw new Error('unreachable: protected route')
      const unknown = body.scopes.findIndex((s) => !isScope(s))
      if (unknown !== -1) throw validationFailed([{ path: `/scopes/${unknown}`, message: 'is not a scope' }])
      // A key can never do more than the credential that created it.
      const beyond = body.scopes.filter((s) => !principal.scopes.has(s as never))
      // With the challenge every other insufficient_scope answer carries (RFC 6750 §3.1), naming what is missing.
      if (beyond.length) {
        throw new HttpError('insufficient_scope', `A key cannot have scopes its creator lacks: ${beyond.join(' ')}.`, {
          headers: { 'www-authenticate': challenge.scope(beyond.join(' ')) },
        })
      }
      const expiresAt = body.expires_at ? new Date(body.expires_at) : null
      if (expiresAt && expiresAt.getTime() <= Date.now()) throw validationFailed([{ path: '/expires_at', message: 'must be in the future' }])
      const key = newSecret('apiKey')
      const row = await insertApiKey(deps.sql, {
        user_id: Number(principal.userId), name: body.name, prefix: displayPrefix(key), key_hash: hashSecret(key), scopes: body.scopes, expires_at: expiresAt,
      }, deps.config.maxApiKeysPerUser)
      // The user was deleted while this request ran: the credential is good for nothing now.
      if (row === 'gone') throw new HttpError('invalid_token', 'The user of this credential no longer exists.', { headers: { 'www-authenticate': challenge.invalid } })
      if (row === 'limit') {
        throw new HttpError('api_key_limit', `This user already holds ${deps.config.maxApiKeysPerUser} live API keys (MAX_API_KEYS_PER_USER); delete one first.`)
      }
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
    summary: 'Read an API key (without its secret)',
    responses: { 200: { description: 'The key', schema: ApiKey } },
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
    summary: 'Revoke an API key at once',
    responses: { 204: { description: 'Deleted' } },
    access: { kind: 'protected', scope: 'api_keys:write', who: 'any' },
    async handle({ params, principal, deps }) {
      const row = await findApiKey(deps.sql, params.id!, isAdmin(principal) ? undefined : userIdOf(principal))
      if (!row) throw notFound()
      await deleteApiKey(deps.sql, row.id)
      // Answer once this instance has heard the revocation: it never serves the key to a client told it is gone (src/auth/credential-changes.ts).
      await deps.credentialChanges.caughtUp()
      return { status: 204 }
    },
  }),
]
