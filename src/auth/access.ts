import type { Principal } from './principal.js'

// Who may call a route, declared on the route and checked in one place by the
// pipeline before the handler runs.
//
// NOTE (issue 2): credentials do not exist yet, so `authorize` admits every
// caller. The declarations on the routes are already the final ones; the
// authentication issue replaces this function's body, not the routes.

export type Scope = 'users:read' | 'users:write' | 'products:read' | 'products:write' | 'api_keys:read' | 'api_keys:write'

export type Access =
  | { kind: 'public' }
  /** `who`: 'any' authenticated caller, 'admin' only, or 'admin-or-self' for `/users/{id}`. */
  | { kind: 'protected'; scope: Scope; who: 'any' | 'admin' | 'admin-or-self'; signup?: boolean }

export const publicAccess: Access = { kind: 'public' }

export function authorize(_access: Access, _principal: Principal, _params: Record<string, string>): void {}
