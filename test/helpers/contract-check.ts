import { Compile } from 'typebox/compile'
import type { AnyRoute } from '../../src/core/http/route.js'
import { createRouter, type Router } from '../../src/core/http/router.js'
import { allRoutes } from '../../src/app.js'
import type { Registry } from '../../src/registry.js'
import { applicationRegistry } from './registry.js'

// Every answer the suite receives is checked against what /openapi.json
// declares for its operation and status: an undeclared status, or a JSON body
// that does not match the declared schema, fails the test that received it.
// So the document cannot drift from the behaviour.

type Doc = {
  paths: Record<
    string,
    Record<string, { responses: Record<string, { content?: Record<string, { schema: unknown }> }> }>
  >
  components: { schemas: Record<string, unknown> }
}

const serviceRouter = createRouter(allRoutes(applicationRegistry, ''))

/** The routes a server answers, to find the operation of each answer: the service's, and a test's own. */
export const contractRouter = (registry: Registry, extra?: readonly AnyRoute[]): Router =>
  extra?.length || registry !== applicationRegistry ? createRouter(allRoutes(registry, '', extra)) : serviceRouter
const validators = new Map<string, { Check(v: unknown): boolean; Errors(v: unknown): unknown[] }>()

/** Inlines `#/components/schemas/…` references, the only kind the document uses. */
function resolve(schema: unknown, doc: Doc): unknown {
  if (Array.isArray(schema)) return schema.map((s) => resolve(s, doc))
  if (!schema || typeof schema !== 'object') return schema
  const ref = (schema as { $ref?: string }).$ref
  if (ref?.startsWith('#/components/schemas/')) return resolve(doc.components.schemas[ref.slice(21)], doc)
  return Object.fromEntries(Object.entries(schema).map(([k, v]) => [k, resolve(v, doc)]))
}

export function checkAgainstDocument(
  doc: Doc,
  router: Router,
  method: string,
  pathWithPrefix: string,
  prefix: string,
  status: number,
  contentType: string,
  body: unknown,
): void {
  const fullPath = pathWithPrefix.split('?')[0]!
  if (!fullPath.startsWith(prefix)) return
  const path = fullPath.slice(prefix.length)
  const match = router.match(method === 'HEAD' ? 'GET' : method, path)
  // Unknown paths, unsupported methods and OPTIONS have no operation to check against.
  if (match.kind !== 'found') return
  const operation = doc.paths[match.template]?.[match.route.method.toLowerCase()]
  if (!operation) throw new Error(`contract: ${match.route.method} ${match.template} is not in /openapi.json`)
  const declared = operation.responses[String(status)]
  if (!declared)
    throw new Error(`contract: ${method} ${match.template} answered ${status}, which /openapi.json does not declare`)
  if (body === undefined || method === 'HEAD') return
  const media = contentType.split(';')[0]!.trim()
  const content = declared.content?.[media]
  if (!content) throw new Error(`contract: ${method} ${match.template} ${status} sent ${media}, not declared`)
  const key = `${match.template} ${match.route.method} ${status} ${media}`
  let validator = validators.get(key)
  if (!validator) validators.set(key, (validator = Compile(resolve(content.schema, doc) as never) as never))
  if (!validator!.Check(body)) {
    throw new Error(
      `contract: ${method} ${match.template} ${status} body does not match ` +
        `/openapi.json: ${JSON.stringify(validator!.Errors(body).slice(0, 3))}`,
    )
  }
}
