import Type from 'typebox'
import { findUser } from '../accounts/queries.js'
import { userGone } from '../auth/credentials.js'
import { defineRoute } from '../core/http/route.js'
import { users } from './resource.js'

// GET /auth/me: the caller's user, as the users resource presents it, and the
// credential it called with. It lives with the users resource, whose
// representation it answers with; auth only says who the caller is.

const Me = Type.Object(
  {
    user: users.schemas.representation,
    credential: Type.Object(
      {
        type: Type.Union([Type.Literal('jwt'), Type.Literal('token'), Type.Literal('api_key'), Type.Literal('oidc')], {
          description:
            'jwt and token: a login here; api_key; oidc: an access token of the identity provider (OIDC_ISSUER)',
        }),
        scopes: Type.Array(Type.String()),
        expires_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
        issuer: Type.Optional(
          Type.String({ description: 'with type oidc: the identity provider that issued the token' }),
        ),
        amr: Type.Optional(
          Type.Array(Type.String(), {
            description: 'how the login proved the user (RFC 8176: pwd, otp; a provider token: its amr); not for keys',
          }),
        ),
        auth_time: Type.Optional(
          Type.Union([Type.Integer(), Type.Null()], {
            description: 'when that login was, in seconds since the epoch (null: a provider token that does not say)',
          }),
        ),
      },
      { additionalProperties: false },
    ),
  },
  { additionalProperties: false },
)

export const meRoute = defineRoute({
  method: 'GET',
  path: '/auth/me',
  operationId: 'getMe',
  noStore: true,
  summary: 'The caller and its credential',
  responses: { 200: { description: 'The caller', schema: Me } },
  // Open to a login MFA_REQUIRED holds back: it says what the login proved.
  access: { kind: 'protected', scope: null, who: 'any', enrolment: true },
  async handle({ principal, services }) {
    if (principal.kind !== 'user') throw new Error('unreachable: /auth/me is protected')
    const user = await findUser(services.sql, principal.userId)
    // A JWT may outlive its user; the token is then no longer good for anything.
    if (!user) throw userGone()
    const { credential } = principal
    const { type, expiresAt } = credential
    const issuer = credential.type === 'oidc' ? { issuer: credential.issuer } : {}
    const proof =
      credential.type === 'oidc'
        ? { amr: [...credential.amr], auth_time: credential.authenticatedAt ?? null }
        : credential.type === 'api_key'
          ? {}
          : { amr: [...credential.proof.amr], auth_time: credential.proof.authTime }
    return {
      status: 200,
      body: {
        user: users.present(user),
        credential: { type, scopes: [...principal.scopes].sort(), expires_at: expiresAt, ...issuer, ...proof },
      },
    }
  },
})
