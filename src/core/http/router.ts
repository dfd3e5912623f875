import type { AnyRoute, Method } from './route.js'

// Path templates are compiled once, at start-up, into segment lists; a
// request's path is split once and compared segment by segment. A malformed
// or duplicate route throws here, so it fails start-up rather than a request.

// `noStore`: the answer must not be stored by a cache. A route declares it
// for itself; an OPTIONS or 405 answer is about the path, so it is no-store
// when any route of the path is (every answer under /auth/ is, errors included).
export type Match =
  | { kind: 'found'; route: AnyRoute; params: Record<string, string>; template: string; noStore: boolean }
  | { kind: 'options'; allow: string; template: string; noStore: boolean }
  | { kind: 'method_not_allowed'; allow: string; template: string; noStore: boolean }
  | { kind: 'not_found' }

// The only parameter kind the API has: a positive integer that fits bigint.
// Anything else (`abc`, `0`, `-1`, `1.5`, 20 digits) cannot name a resource: 404.
const MAX_BIGINT = 9223372036854775807n
export function isBigintId(segment: string): boolean {
  return /^[1-9][0-9]{0,18}$/.test(segment) && BigInt(segment) <= MAX_BIGINT
}

interface CompiledPath {
  template: string
  /** A literal segment, or the name of a parameter. */
  segments: Array<{ literal: string } | { param: string }>
  methods: Map<Method, AnyRoute>
  allow: string
  /** Some route of the path declares noStore. */
  noStore: boolean
}

export interface Router {
  match(method: string, path: string): Match
  routes: readonly AnyRoute[]
}

export function createRouter(routes: readonly AnyRoute[]): Router {
  const byTemplate = new Map<string, CompiledPath>()
  for (const route of routes) {
    if (!/^(\/([a-z0-9._-]+|\{[a-z]+\}))+$/.test(route.path))
      throw new Error(`Route ${route.method} ${route.path}: malformed path template`)
    let compiled = byTemplate.get(route.path)
    if (!compiled) {
      const segments = route.path
        .slice(1)
        .split('/')
        .map((s) => {
          if (!s.startsWith('{')) return { literal: s }
          const param = s.slice(1, -1)
          if (param !== 'id') throw new Error(`Route ${route.method} ${route.path}: unknown parameter {${param}}`)
          return { param }
        })
      compiled = { template: route.path, segments, methods: new Map(), allow: '', noStore: false }
      byTemplate.set(route.path, compiled)
    }
    if (compiled.methods.has(route.method)) throw new Error(`Route ${route.method} ${route.path} is defined twice`)
    compiled.methods.set(route.method, route)
    if (route.noStore) compiled.noStore = true
  }
  for (const compiled of byTemplate.values()) {
    const methods = [...compiled.methods.keys()]
    if (methods.includes('GET')) methods.push('HEAD' as Method)
    compiled.allow = [...methods, 'OPTIONS'].join(', ')
  }
  // Literal paths before templated ones, so `/users/me` would win over `/users/{id}`.
  const paths = [...byTemplate.values()].sort((a, b) => countParams(a) - countParams(b))

  return {
    routes,
    match(method, path) {
      const parts = path.split('/')
      if (parts[0] !== '') return { kind: 'not_found' }
      for (const candidate of paths) {
        const params = matchSegments(candidate, parts)
        if (!params) continue
        if (method === 'OPTIONS')
          return { kind: 'options', allow: candidate.allow, template: candidate.template, noStore: candidate.noStore }
        const route = candidate.methods.get((method === 'HEAD' ? 'GET' : method) as Method)
        if (!route)
          return {
            kind: 'method_not_allowed',
            allow: candidate.allow,
            template: candidate.template,
            noStore: candidate.noStore,
          }
        return { kind: 'found', route, params, template: candidate.template, noStore: route.noStore === true }
      }
      return { kind: 'not_found' }
    },
  }
}

const countParams = (c: CompiledPath) => c.segments.filter((s) => 'param' in s).length

function matchSegments(candidate: CompiledPath, parts: string[]): Record<string, string> | undefined {
  if (parts.length !== candidate.segments.length + 1) return undefined
  const params: Record<string, string> = {}
  for (let i = 0; i < candidate.segments.length; i++) {
    const segment = candidate.segments[i]!
    const part = parts[i + 1]!
    if ('literal' in segment) {
      if (segment.literal !== part) return undefined
    } else {
      if (!isBigintId(part)) return undefined
      params[segment.param] = part
    }
  }
  return params
}
