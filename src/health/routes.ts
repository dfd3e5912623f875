import Type from 'typebox'
import { publicAccess } from '../auth/access.js'
import { HttpError } from '../core/http/problem.js'
import { defineRoute } from '../core/http/route.js'

export const healthRoutes = [
  // Liveness: the process answers. No database access, so a database outage
  // never makes an orchestrator restart healthy instances.
  defineRoute({
    method: 'GET',
    path: '/healthz',
    operationId: 'getHealth',
    summary: 'Liveness: the process answers (no database access)',
    responses: { 200: { description: 'Alive', schema: Type.Object({ status: Type.Literal('ok') }) } },
    access: publicAccess,
    unlimited: true,
    database: 'none',
    handle: async () => ({ status: 200, headers: { 'cache-control': 'no-store' }, body: { status: 'ok' } }),
  }),

  // Readiness: send traffic here only if the database answers and we are not
  // draining. An instance that cannot prove it hears credential changes is
  // still ready (it reads credentials from the database instead of memory,
  // slower but right), and says so: `credentials` names the reason. The
  // database's answer is shared for a second (src/health/readiness.ts);
  // draining is not: it shows at once.
  defineRoute({
    method: 'GET',
    path: '/readyz',
    operationId: 'getReadiness',
    summary: 'Readiness: the database answers and the service is not draining',
    responses: {
      200: {
        description: 'Ready',
        schema: Type.Object({
          status: Type.Literal('ready'),
          credentials: Type.String({
            description:
              '"remembered": revocations are heard and credentials checked in memory; otherwise why they are read ' +
              'from the database',
          }),
        }),
      },
    },
    access: publicAccess,
    unlimited: true,
    // Not ready: the database does not answer, or the service is stopping: draining, or
    // still serving for SHUTDOWN_DELAY so that load balancers stop routing here before the drain.
    errorStatuses: [503],
    async handle({ services }) {
      const { drainsAt, draining } = services.stopping
      if (draining) {
        throw new HttpError('shutting_down', 'The service is shutting down.', { headers: { 'retry-after': '1' } })
      }
      if (drainsAt !== undefined) {
        const seconds = Math.max(0, Math.ceil((drainsAt - performance.now()) / 1000))
        throw new HttpError(
          'shutting_down',
          `The service is shutting down: it still serves ` +
            `for ${seconds} s (SHUTDOWN_DELAY) while load balancers stop sending requests here, then drains.`,
          { headers: { 'retry-after': '1' } },
        )
      }
      await services.readiness.database()
      const distrust = services.credentialChanges.distrustReason
      const credentials = distrust === undefined ? 'remembered' : `read from the database: ${distrust}`
      return { status: 200, headers: { 'cache-control': 'no-store' }, body: { status: 'ready', credentials } }
    },
  }),
]
