import Type from 'typebox'
import { findUser } from '../accounts/queries.js'
import { freshProofMembers, requireFreshProof } from '../auth/current-password.js'
import { withdrawFactor } from '../auth/mfa/withdraw.js'
import { originOf } from '../auth/origin.js'
import { notFound } from '../core/http/problem.js'
import { defineRoute } from '../core/http/route.js'
import { compileValidator } from '../core/http/validate.js'

// An admin takes a user's second factor away (the user lost the device and
// the recovery codes): a step-up act, and the end of every credential of that
// user, since whoever held the factor may hold the account.

const ProofBody = Type.Object(freshProofMembers("the admin's"), { additionalProperties: false })

export const factorRemovalRoute = defineRoute({
  method: 'DELETE',
  path: '/users/{id}/mfa',
  operationId: 'removeUserFactor',
  errorStatuses: [403, 404],
  noStore: true,
  summary: "An admin removes a user's second factor (fresh proof): every session, JWT and API key of that user ends",
  responses: { 204: { description: 'Removed, or there was none' } },
  access: { kind: 'protected', scope: 'users:write', who: 'admin', interactive: true },
  body: { kind: 'json', validator: compileValidator(ProofBody), optional: true },
  async handle({ body, params, principal, client, requestId, services }) {
    if (principal.kind !== 'user') throw new Error('unreachable: a protected route')
    await requireFreshProof(principal, body ?? {}, { services, client, requestId })
    const user = await findUser(services.sql, params.id!)
    if (!user) throw notFound()
    const origin = originOf(principal, requestId)
    const removed = await services.sql.begin((tx) => withdrawFactor(tx, user.id, origin, true))
    if (removed) await services.credentialChanges.caughtUp()
    return { status: 204 }
  },
})
