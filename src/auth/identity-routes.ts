import Type from 'typebox'
import { HttpError } from '../core/http/problem.js'
import { defineRoute } from '../core/http/route.js'
import { compileValidator } from '../core/http/validate.js'
import { invalidToken, providerUnavailable } from './credentials.js'
import { freshProofMembers, requireFreshProof } from './current-password.js'
import { InvalidTokenError } from './jwt.js'
import { linkIdentity } from './oidc/explicit-links.js'
import { ProviderUnavailable } from './oidc/key-set.js'
import type { ProviderClaims } from './oidc/provider-token.js'
import { originOf } from './origin.js'
import { sessionOf } from './principal.js'

// POST /auth/identities: a local user links an account of the identity
// provider to itself, the provider's token in the body. A step-up act
// (lasting authority: that account's tokens act as this user from then on),
// so only from a login here, with a fresh proof; the only way an account of
// the provider becomes a local admin that exists (a token's address never
// links one, src/auth/oidc/identities.ts). It stands above oidc/, beside
// the proof of the current password it asks for.

const LinkBody = Type.Object(
  {
    token: Type.String({
      minLength: 1,
      maxLength: 8192,
      description: 'an access token of the identity provider (OIDC_ISSUER) for the account to link',
    }),
    ...freshProofMembers("the caller's"),
  },
  { additionalProperties: false },
)

const Identity = Type.Object(
  {
    issuer: Type.String({ description: 'the identity provider (OIDC_ISSUER)' }),
    subject: Type.String({ description: "the account's sub at the provider" }),
    user_id: Type.Integer({ minimum: 1 }),
    linked_at: Type.String({ format: 'date-time' }),
  },
  { additionalProperties: false },
)

const invalidIdentityToken = (why: string) =>
  new HttpError('invalid_identity_token', `The token in the body is no valid token of the identity provider: ${why}.`)

const refusals = {
  taken: 'This account of the identity provider is linked to another user.',
  deleted:
    'The user of this account of the identity provider was deleted; it is not linked again (with ' +
    'OIDC_REPROVISION=true a sign-in of its own makes a new user).',
  linked: 'You are linked to another account of this identity provider already.',
} as const

export const identityRoutes = [
  defineRoute({
    method: 'POST',
    path: '/auth/identities',
    operationId: 'linkIdentity',
    errorStatuses: [404],
    noStore: true,
    summary: "Link an account of the identity provider to the caller's (its token in the body; needs a fresh proof)",
    responses: {
      201: { description: 'Linked: its tokens are the caller from now on', schema: Identity },
      200: { description: 'Linked already, to the caller', schema: Identity },
    },
    access: { kind: 'protected', scope: null, who: 'any', interactive: true },
    body: { kind: 'json', validator: compileValidator(LinkBody) },
    // The proof waits for a password-hash slot, and the token may wait for the provider's keys: neither holds a place
    // under database admission.
    database: 'statements',
    async handle(ctx) {
      const { body, principal, requestId, bounded, services } = ctx
      const provider = services.identityProvider
      if (!provider) throw new HttpError('not_found', 'No identity provider is configured (OIDC_ISSUER is not set).')
      if (principal.kind !== 'user') throw new Error('unreachable: a protected route')
      const { credential } = principal
      // A provider token proves the provider's account, not the local one it would be linked to.
      if (credential.type !== 'jwt' && credential.type !== 'token')
        throw new HttpError('forbidden', 'Link an account from a login here (a JWT or an access token of ours).')
      // Before the token is looked at: a stolen access token alone learns nothing here.
      await requireFreshProof(principal, body, ctx)
      let claims: ProviderClaims
      try {
        claims = await provider.verify(body.token)
      } catch (err) {
        if (err instanceof ProviderUnavailable) throw providerUnavailable(err)
        if (err instanceof InvalidTokenError) throw invalidIdentityToken('invalid, expired, or not for this API')
        throw err
      }
      // A person's account, as a user made from a token must be: a program's token (client credentials) is not one.
      if (claims.verifiedEmail === undefined)
        throw invalidIdentityToken('it carries no verified e-mail address (email with email_verified true)')
      const outcome = await bounded(() =>
        linkIdentity(
          services.sql,
          provider.settings.issuer,
          claims.subject,
          {
            userId: Number(principal.userId),
            epoch: credential.type === 'jwt' ? credential.epoch : undefined,
            sessionId: sessionOf(credential),
          },
          originOf(principal, requestId),
        ),
      )
      if ('refused' in outcome) {
        if (outcome.refused === 'gone') throw invalidToken()
        throw new HttpError('identity_already_linked', refusals[outcome.refused])
      }
      return { status: outcome.created ? 201 : 200, body: outcome.linked }
    },
  }),
]
