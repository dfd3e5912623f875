import type { AnyRoute } from '../http/route.js'

// PLACEHOLDER, filled in by the SSE work: GET /events/stream.
export const eventStreamRoutes: AnyRoute[] = []
