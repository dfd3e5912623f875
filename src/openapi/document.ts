import Type, { type TSchema } from 'typebox'
import type { Access } from '../auth/access.js'
import type { AnyRoute, ResponseHeader } from '../core/http/route.js'
import type { ProblemType } from '../core/http/problem.js'

// The OpenAPI 3.1 document, built once at start-up from the route table: the
// request schemas are the very objects that validate requests, and the
// success schemas are declared on the routes, so the document cannot drift
// from the behaviour (the test suite checks every answer against it).

/** The problem body, its `code` one of the service's registered codes. */
const problemSchema = (problems: Readonly<Record<string, ProblemType>>) =>
  Type.Object({
    type: Type.String(),
    title: Type.String(),
    status: Type.Integer(),
    code: Type.Union(Object.keys(problems).map((c) => Type.Literal(c))),
    detail: Type.String(),
    instance: Type.String(),
    request_id: Type.String(),
    errors: Type.Optional(Type.Array(Type.Object({ path: Type.String(), message: Type.String() }))),
    // What some codes add (RFC 9457 extension members), each described with the code it comes with.
    ...Object.fromEntries(
      Object.values(problems).flatMap((p) => Object.entries(p.members ?? {}).map(([m, s]) => [m, Type.Optional(s)])),
    ),
  })

const headerDocs: Record<string, { description: string; schema: TSchema }> = {
  'X-Request-Id': {
    description:
      "The request id: the client's own when valid, else a fresh one. Also in the log line and problem bodies.",
    schema: Type.String(),
  },
  ETag: {
    description: 'Strong entity tag of the resource; send it back in If-Match or If-None-Match.',
    schema: Type.String(),
  },
  Location: { description: 'Address of the created resource.', schema: Type.String() },
  Link: { description: 'RFC 8288 link to the next page (rel="next"); absent on the last page.', schema: Type.String() },
  'X-Total-Count': {
    description: 'Number of items matching the filter; only with count=true.',
    schema: Type.Integer(),
  },
  'Idempotent-Replayed': {
    description: '"true" when this answer is the stored answer to an earlier request with the same Idempotency-Key.',
    schema: Type.String(),
  },
  'RateLimit-Limit': {
    description: 'Requests allowed per minute for this credential or address.',
    schema: Type.Integer(),
  },
  'RateLimit-Remaining': { description: 'Requests left in the current window.', schema: Type.Integer() },
  'RateLimit-Reset': { description: 'Seconds until the window resets.', schema: Type.Integer() },
  'Retry-After': { description: 'Seconds to wait before retrying.', schema: Type.Integer() },
  'WWW-Authenticate': { description: 'RFC 6750 challenge.', schema: Type.String() },
  Allow: { description: 'Methods the path supports.', schema: Type.String() },
}
const successHeaderNames: Record<ResponseHeader, string> = {
  etag: 'ETag',
  location: 'Location',
  link: 'Link',
  'x-total-count': 'X-Total-Count',
  'idempotent-replayed': 'Idempotent-Replayed',
}

const headerRefs = (names: string[]) => Object.fromEntries(names.map((n) => [n, { $ref: `#/components/headers/${n}` }]))
const rateHeaders = ['RateLimit-Limit', 'RateLimit-Remaining', 'RateLimit-Reset']

/**
 * Plain JSON: TypeBox schemas are JSON Schema already; this drops
 * anything that is not (member traits ride on a symbol).
 */
const json = (schema: TSchema): unknown => JSON.parse(JSON.stringify(schema))

/**
 * Schemas with a name in components.schemas, by identity: a route declares the very object, the document refers to it
 * by name.
 */
interface Named {
  names: ReadonlyMap<TSchema, string>
  /** The names some operation refers to: only those go into components. */
  used: Set<string>
}
const schemaOf = (schema: TSchema, named: Named): unknown => {
  const name = named.names.get(schema)
  if (!name) return json(schema)
  named.used.add(name)
  return { $ref: `#/components/schemas/${name}` }
}

/**
 * A query parameter as it travels: a list is comma-separated (form style, not
 * exploded), and an operand read as a BigInt is an integer on the wire (int64
 * bounds are not exact JSON numbers, so the format says them).
 */
function queryParameter(name: string, schema: TSchema) {
  const wire = (s: TSchema): Record<string, unknown> => {
    if (!Type.IsBigInt(s)) return json(s) as Record<string, unknown>
    const { exclusiveMaximum, description } = s as unknown as { exclusiveMaximum: bigint; description: string }
    return { type: 'integer', format: exclusiveMaximum > 2n ** 31n ? 'int64' : 'int32', description }
  }
  if (!Type.IsArray(schema)) {
    const { description, ...rest } = wire(schema)
    return { name, in: 'query', required: false, description, schema: rest }
  }
  const { description: itemDescription, ...items } = wire(schema.items as TSchema)
  const { minItems, maxItems, description } = schema as unknown as {
    minItems: number
    maxItems: number
    description: string
  }
  return {
    name,
    in: 'query',
    required: false,
    style: 'form',
    explode: false,
    description: itemDescription ? `${description}, each ${itemDescription}` : description,
    schema: { type: 'array', minItems, maxItems, items },
  }
}

const errorDescriptions: Record<number, string> = {
  400: 'Malformed request: bad JSON, unknown or invalid query parameter, two credentials.',
  401: 'No credential, or a bad, expired or revoked one.',
  403: 'Authenticated but not allowed, a missing scope, or current_password missing or wrong.',
  404: 'No such resource.',
  405: "The path does not support the method (POST /batch: an operation's; see Allow alone).",
  412: 'If-Match does not match the current ETag; nothing was changed.',
  413: 'Body larger than BODY_LIMIT.',
  415: 'Unsupported Content-Type.',
  422:
    'The body does not satisfy the schema (errors[] has JSON Pointers), or an Idempotency-Key was reused with ' +
    'another body, or (POST /batch) an operation is not one a batch may run.',
  428: 'If-Match is required (REQUIRE_IF_MATCH=true).',
  429: 'Rate limit or login throttle reached; see Retry-After.',
  500: 'Unexpected error; quote the request id.',
  503: 'Database unavailable or the service is shutting down; see Retry-After.',
}

function errorStatuses(route: AnyRoute): number[] {
  const s = new Set([400, 500])
  if (!route.unlimited) s.add(429).add(503)
  if (route.access.kind !== 'public') s.add(401)
  if (route.access.kind === 'protected') s.add(403)
  if (route.path.includes('{id}')) s.add(404)
  if (route.body) s.add(413).add(415).add(422)
  if (route.method !== 'GET' && route.access.kind === 'protected') s.add(409)
  if (route.idempotent) s.add(409).add(422)
  if (route.requiresIfMatch) s.add(412).add(428)
  for (const status of route.errorStatuses ?? []) s.add(status)
  return [...s].sort()
}

function security(access: Access): Array<Record<string, string[]>> | undefined {
  if (access.kind === 'public') return []
  const scopes: string[] = access.kind === 'protected' && access.scope ? [access.scope] : []
  // An interactive route takes the credentials of a login only: no API key.
  const interactive = access.kind === 'protected' && access.interactive
  const bearers: Array<Record<string, string[]>> = [{ bearerAuth: scopes }, { identityProviderAuth: scopes }]
  const required: Array<Record<string, string[]>> = interactive ? bearers : [...bearers, { apiKeyAuth: scopes }]
  return access.kind === 'optional' ? [{}, ...required] : required
}

const operationId = (route: AnyRoute) =>
  route.operationId ??
  route.method.toLowerCase() +
    route.path
      .split('/')
      .filter(Boolean)
      .map((s) => (s === '{id}' ? 'ById' : s.replace(/(^|[-.])([a-z])/g, (_, __, c: string) => c.toUpperCase())))
      .join('')

function operation(route: AnyRoute, named: Named, descriptions: Record<number, string>) {
  const parameters: unknown[] = []
  if (route.path.includes('{id}')) {
    parameters.push({
      name: 'id',
      in: 'path',
      required: true,
      schema: { type: 'integer', format: 'int64', minimum: 1 },
    })
  }
  const queryProps = (route.query?.schema as { properties?: Record<string, TSchema> } | undefined)?.properties ?? {}
  for (const [name, schema] of Object.entries(queryProps)) parameters.push(queryParameter(name, schema))
  if (route.requiresIfMatch)
    parameters.push({
      name: 'If-Match',
      in: 'header',
      required: false,
      description: 'The ETag the change is based on; a mismatch is 412.',
      schema: { type: 'string' },
    })
  if (route.method === 'GET' && route.path.includes('{id}'))
    parameters.push({ name: 'If-None-Match', in: 'header', required: false, schema: { type: 'string' } })
  if (route.idempotent)
    parameters.push({
      name: 'Idempotency-Key',
      in: 'header',
      required: false,
      description:
        '1 to 255 printable ASCII characters; retries with the same key and body get the first answer for 24 hours.',
      schema: { type: 'string', minLength: 1, maxLength: 255 },
    })

  const responses: Record<string, unknown> = {}
  for (const [status, r] of Object.entries(route.responses ?? {})) {
    const headers = [
      'X-Request-Id',
      ...(route.unlimited ? [] : rateHeaders),
      ...(r.headers ?? []).map((h) => successHeaderNames[h]),
    ]
    if (route.idempotent) headers.push('Idempotent-Replayed')
    responses[status] = {
      description: r.description,
      headers: headerRefs([...new Set(headers)]),
      ...(r.schema
        ? { content: { [r.contentType ?? 'application/json']: { schema: schemaOf(r.schema, named) } } }
        : {}),
    }
  }
  if (route.method === 'GET' && route.path.includes('{id}')) {
    responses['304'] = {
      description: 'Not modified: If-None-Match matched the ETag.',
      headers: headerRefs(['X-Request-Id', 'ETag']),
    }
  }
  for (const status of errorStatuses(route)) {
    const headers = [
      'X-Request-Id',
      ...(status === 401 || status === 403 ? ['WWW-Authenticate'] : []),
      ...(status === 429 || status === 503 ? ['Retry-After'] : []),
    ]
    responses[String(status)] = {
      description: descriptions[status],
      headers: headerRefs(headers),
      content: { 'application/problem+json': { schema: { $ref: '#/components/schemas/Problem' } } },
    }
  }

  const body = route.body
    ? {
        requestBody: {
          required: !route.body.optional,
          content: Object.fromEntries(
            (route.body.kind === 'merge-patch'
              ? ['application/merge-patch+json', 'application/json']
              : ['application/json']
            ).map((t) => [t, { schema: schemaOf(route.body!.validator.schema, named) }]),
          ),
        },
      }
    : {}
  return {
    operationId: operationId(route),
    ...(route.summary ? { summary: route.summary } : {}),
    tags: [route.path.split('/')[1]],
    ...(parameters.length ? { parameters } : {}),
    ...body,
    responses,
    security: security(route.access),
  }
}

/**
 * `problems`: every code the service answers with (src/registry.ts);
 * the 409s are named in the description of a conflict.
 */
export function buildOpenApiDocument(
  routes: readonly AnyRoute[],
  info: { version: string; apiPrefix: string; problems: Readonly<Record<string, ProblemType>> },
) {
  const conflicts = Object.values(info.problems)
    .filter((p) => p.status === 409)
    .map((p) => p.title)
  const descriptions = { ...errorDescriptions, 409: `Conflict: ${conflicts.join('; ')}.` }
  // Schemas routes name (a resource's representation, page and bodies) are documented once, and referred to.
  const components: Record<string, TSchema> = Object.assign({}, ...routes.map((r) => r.components ?? {}))
  const named: Named = {
    names: new Map(Object.entries(components).map(([name, schema]) => [schema, name])),
    used: new Set(),
  }
  const paths: Record<string, Record<string, unknown>> = {}
  for (const route of routes) {
    paths[route.path] ??= {}
    paths[route.path]![route.method.toLowerCase()] = operation(route, named, descriptions)
  }
  return {
    openapi: '3.1.0',
    info: {
      title: 'users-products-api',
      version: info.version,
      description:
        'Users and products over HTTP with JSON. Errors are RFC 9457 problems; collections page with Link rel="next".',
    },
    servers: [{ url: info.apiPrefix || '/' }],
    paths,
    components: {
      schemas: {
        Problem: json(problemSchema(info.problems)),
        ...Object.fromEntries(
          Object.entries(components)
            .filter(([name]) => named.used.has(name))
            .map(([name, schema]) => [name, json(schema)]),
        ),
      },
      headers: Object.fromEntries(
        Object.entries(headerDocs).map(([name, h]) => [name, { description: h.description, schema: json(h.schema) }]),
      ),
      securitySchemes: {
        bearerAuth: {
          type: 'http',
          scheme: 'bearer',
          description: 'A JWT or an opaque access token from /auth/login, or an API key (upa_ak_…).',
        },
        identityProviderAuth: {
          type: 'http',
          scheme: 'bearer',
          bearerFormat: 'JWT',
          description:
            'An access token of your identity provider, where the service is configured with OIDC_ISSUER and ' +
            "OIDC_AUDIENCE: a JWT signed RS256, PS256, ES256 or EdDSA with a key of the provider's JWKS, for that " +
            'audience. Its user is the local user linked to its subject, made on first sight from its verified ' +
            "e-mail address; its `scope` narrows what the user's role allows.",
        },
        apiKeyAuth: { type: 'apiKey', in: 'header', name: 'X-API-Key', description: 'An API key from POST /api-keys.' },
      },
    },
  }
}
