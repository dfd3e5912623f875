import Type from 'typebox'
import { originOf } from '../auth/origin.js'
import { etagFor } from '../core/http/conditional.js'
import { defineRoute } from '../core/http/route.js'
import { compileValidator } from '../core/http/validate.js'
import { lockRow, updateRow } from '../core/resources/store.js'
import type { Resource } from '../core/resources/resource.js'
import { accessOf } from '../resource-module.js'
import type { webhookWithSecret } from './resource.js'
import { newSigningSecret } from '../core/http/standard-webhooks.js'
import { sealSecret } from './secret.js'

// POST /webhooks/{id}/rotate-secret: a new signing secret, shown once. The
// old one may keep signing beside it for a while (Standard Webhooks sends
// several signatures separated by spaces, and a receiver accepts any that
// verifies), so a receiver can switch without losing a delivery.

const MAX_OVERLAP_SECONDS = 7 * 24 * 3600

const RotateSecret = Type.Object(
  {
    keep_previous_for: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_OVERLAP_SECONDS,
        description:
          `seconds (0 ` + `to ${MAX_OVERLAP_SECONDS}) during which the previous secret still signs too; default 0`,
      }),
    ),
  },
  { additionalProperties: false },
)

export const rotateSecretRoute = (webhooks: Resource, withSecret: ReturnType<typeof webhookWithSecret>) =>
  defineRoute<Record<string, never>, { keep_previous_for?: number } | undefined>({
    method: 'POST',
    path: '/webhooks/{id}/rotate-secret',
    operationId: 'rotateWebhookSecret',
    summary: "Replace a webhook's signing secret; the new one is in this answer only",
    responses: { 200: { description: 'The webhook and its new secret', schema: withSecret, headers: ['etag'] } },
    access: accessOf(webhooks).write,
    noStore: true,
    body: { kind: 'json', validator: compileValidator(RotateSecret), optional: true },
    components: { RotateSecret },
    async handle(ctx) {
      const keep = ctx.body?.keep_previous_for ?? 0
      const secret = newSigningSecret()
      const row = await ctx.services.sql.begin(async (tx) => {
        const current = await lockRow(tx, webhooks, ctx.params.id!, ctx.headers['if-match'])
        // By the database's clock, which the worker compares it with (the end of the overlap is stored, not this
        // instance's guess).
        const [until] = keep ? await tx<[{ at: string }]>`SELECT now() + make_interval(secs => ${keep}) AS at` : []
        return updateRow(
          tx,
          webhooks,
          current.id,
          {
            secret_sealed: sealSecret(secret, ctx.services.config.jwtSecrets),
            previous_secret_sealed: keep ? current.secret_sealed : null,
            previous_secret_expires_at: until?.at ?? null,
          },
          originOf(ctx.principal, ctx.requestId),
        )
      })
      return { status: 200, headers: { etag: etagFor(row.version) }, body: { ...webhooks.present(row), secret } }
    },
  })
