import Type from 'typebox'
import { publicAccess } from '../auth/access.js'
import { defineRoute, type AnyRoute } from '../core/http/route.js'

/** GET /openapi.json: the document built at start-up from `documented` (this route included). */
export function openApiRoute(document: () => unknown): AnyRoute {
  return defineRoute({
    method: 'GET',
    path: '/openapi.json',
    operationId: 'getOpenApiDocument',
    access: publicAccess,
    database: 'none',
    summary: 'This API described as OpenAPI 3.1',
    responses: {
      200: { description: 'The OpenAPI document', schema: Type.Object({ openapi: Type.Literal('3.1.0') }) },
    },
    handle: async () => ({ status: 200, headers: { 'cache-control': 'public, max-age=300' }, body: document() }),
  })
}
