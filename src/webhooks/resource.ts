import Type from 'typebox'
import { originOf } from '../auth/origin.js'
import { validationFailed } from '../core/http/problem.js'
import { idMember, timestampMember } from '../core/resources/common.js'
import { member } from '../core/resources/member.js'
import { defineResource } from '../core/resources/resource.js'
import type { ResourceContext, ResourceHooks } from '../core/resources/routes.js'
import type { Resource } from '../core/resources/resource.js'
import { routeExtensionsOf } from '../resource-module.js'
import { resourceRoutes } from '../core/resources/routes.js'
import { conflictOf, insertRow } from '../core/resources/store.js'
import { hostOf } from '../core/http/outbound.js'
import { refusalOfAddresses, refusalOfUrl, type Resolver, type UrlPolicy } from './address-policy.js'
import { newSigningSecret } from '../core/http/standard-webhooks.js'
import { sealSecret } from './secret.js'
import { wakeWorkers } from './wake.js'
import { withDeadline } from '../core/lib/settled-by.js'

// A webhook subscription: a URL, the event types it wants, and a signing
// secret made here, shown once and stored sealed (secret.ts). Listed, read,
// changed (pause and resume by `status`) and deleted like any resource; its
// writes record webhook.created, webhook.updated and webhook.deleted. It
// belongs to an admin (owner_id) and is disabled when that admin is demoted
// or deleted (sql/010).

/** Single-line text without control characters or spaces; the scheme and host are checked by address-policy.ts. */
const urlSchema = () =>
  Type.String({
    minLength: 1,
    maxLength: 2048,
    pattern: '^[Hh][Tt][Tt][Pp][Ss]?://[^\\u0000-\\u0020\\u007f-\\u009f]+$',
    description: 'an https URL of at most 2048 characters (http too when WEBHOOK_ALLOW_PRIVATE=true)',
  })

const descriptionSchema = () =>
  Type.String({
    maxLength: 500,
    pattern: '^[^\\u0000-\\u001f\\u007f-\\u009f]*$',
    description: 'a single line of at most 500 characters',
  })

export const webhookStatuses = ['active', 'paused', 'disabled'] as const

/**
 * The webhook declaration for a registry's event types (src/registry.ts):
 * the only member that depends on them is event_types. Storage, events and
 * representation are the same for every registry.
 */
export const defineWebhooks = (subscribableEventTypes: readonly string[]) =>
  defineResource({
    name: 'Webhook',
    path: '/webhooks',
    table: 'webhooks',
    access: { read: 'admin', write: 'admin' },
    // The secret kept signing after a rotation, and since when deliveries
    // fail (not shown: failures would change the ETag).
    serverColumns: ['previous_secret_sealed', 'previous_secret_expires_at', 'failing_since'],
    members: {
      id: idMember(),
      url: member(urlSchema()),
      // An enum rather than a union of literals: TypeBox reports at most eight errors, and a value
      // failing a union of more literals than that would be reported without the union's own error.
      event_types: member(
        Type.Array(
          Type.Enum([...subscribableEventTypes], { description: `one of ${subscribableEventTypes.join(', ')}` }),
          { minItems: 1, maxItems: 50, uniqueItems: true },
        ),
      ),
      description: member(descriptionSchema(), { default: '', nullable: true }),
      // 'disabled' is the service's to set (after failing for a day, or when its owner is no longer an admin); an admin
      // sets active or paused.
      status: member(Type.Union(webhookStatuses.map((s) => Type.Literal(s))), { default: 'active', sort: true }),
      last_error: member(
        Type.Union([
          Type.String({
            description:
              'why the service disabled this webhook: the receiver kept failing, or its owner is no longer an admin',
          }),
          Type.Null(),
        ]),
        { write: 'server' },
      ),
      secret_sealed: member(Type.String(), { write: 'server', secret: true }),
      created_by: member(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()]), { write: 'server' }),
      // Whose authority it runs on (sql/010): its creator, then the admin who last re-enabled it.
      owner_id: member(
        Type.Union([
          Type.Integer({
            minimum: 1,
            description: 'the admin whose authority it runs on: its creator, or the admin who last re-enabled it',
          }),
          Type.Null(),
        ]),
        { write: 'server' },
      ),
      created_at: timestampMember(),
      updated_at: timestampMember(),
    },
  })

/** The answer to a creation or a rotation: the one time the secret is shown. */
export const webhookWithSecret = (webhooks: Resource) =>
  Type.Object(
    {
      ...webhooks.schemas.representation.properties,
      secret: Type.String({
        description: 'whsec_ and the base64 of 32 random bytes: keep it, it is never shown again',
      }),
    },
    { additionalProperties: false },
  )

const DNS_TIMEOUT_MS = 5000

/**
 * Refuses (422 on /url) a URL a delivery would refuse: wrong scheme,
 * userinfo, a forbidden literal address, or a name that resolves to one.
 * A name that does not resolve (yet) is refused too: a webhook that cannot be
 * delivered is better known now than after a day of failures.
 */
export async function checkWebhookUrl(raw: string, policy: UrlPolicy, resolve: Resolver): Promise<void> {
  const refuse = (message: string) => validationFailed([{ path: '/url', message }])
  let url: URL
  try {
    url = new URL(raw)
  } catch {
    throw refuse('must be a valid absolute URL')
  }
  const refusal = refusalOfUrl(url, policy)
  if (refusal) throw refuse(refusal)
  if (policy.webhookAllowPrivate) return
  const host = hostOf(url)
  const addresses = await withDeadline(
    resolve(host).catch(() => []),
    DNS_TIMEOUT_MS,
    () => [],
  )
  const refused = refusalOfAddresses(host, addresses)
  if (refused) throw refuse(`must name a host that resolves to public addresses only (${refused})`)
}

const checkUrlOf = (ctx: ResourceContext, url: unknown) =>
  typeof url === 'string'
    ? checkWebhookUrl(url, ctx.services.config, ctx.services.webhooks.settings.resolve)
    : undefined

const hooksOf = (webhooks: Resource): ResourceHooks => ({
  async prepare({ ctx }) {
    if (ctx.body.status === 'disabled')
      throw validationFailed([
        { path: '/status', message: 'must be "active" or "paused" (only the service disables a webhook)' },
      ])
    await checkUrlOf(ctx, ctx.body.url)
  },
  // A status given may re-enable the webhook, which makes the caller its owner: sql/010 reads the caller's
  // row under a share lock, taken here before the webhook's, as the lock order says (delivery-queries.ts).
  async beforeLock(tx, { ctx }) {
    if (ctx.body.status !== undefined && ctx.principal.kind === 'user')
      await tx`SELECT 1 FROM users WHERE id = ${ctx.principal.userId} FOR SHARE`
  },
  async inTransaction(tx, { ctx, current, changes }) {
    // A webhook re-enabled, or pointed elsewhere, starts with a clean record: the day of failures counts afresh.
    if ((current.status === 'disabled' && changes.status !== undefined) || changes.url !== undefined) {
      if (current.last_error !== null) changes.last_error = null
      changes.failing_since = null
    }
    // Re-enabling is the one act that takes ownership: the webhook runs on the authority of whoever
    // brings it back (sql/010 keeps it disabled if that is no admin by commit). Other changes leave the owner.
    if (current.status === 'disabled' && changes.status !== undefined && ctx.principal.kind === 'user') {
      const caller = Number(ctx.principal.userId)
      if (current.owner_id !== caller) changes.owner_id = caller
    }
    // Resumed: what waited is due; the workers hear it at commit.
    if (changes.status === 'active') await wakeWorkers(tx)
  },
  async insert(ctx, values) {
    if (ctx.principal.kind !== 'user') throw new Error('unreachable: protected route')
    const secret = newSigningSecret()
    const row = await insertRow(
      ctx.services.sql,
      webhooks,
      {
        ...values,
        secret_sealed: sealSecret(secret, ctx.services.config.jwtSecrets),
        created_by: Number(ctx.principal.userId),
        owner_id: Number(ctx.principal.userId),
      },
      originOf(ctx.principal, ctx.requestId),
    ).catch((err: unknown) => Promise.reject(conflictOf(webhooks, err)))
    return { row, body: { secret } }
  },
})

/** The six operations of a webhooks declaration but replace, as routes. */
export const webhookResourceRoutes = (webhooks: Resource, withSecret: ReturnType<typeof webhookWithSecret>) =>
  resourceRoutes(webhooks, {
    operations: ['list', 'create', 'read', 'update', 'delete'],
    routes: routeExtensionsOf(webhooks),
    hooks: hooksOf(webhooks),
    summaries: {
      create: 'Register a webhook; its signing secret is in this answer only',
      update:
        'Change a webhook (JSON merge patch): URL, event types, description; pause with status "paused", resume or ' +
        're-enable with "active"',
    },
    // Not idempotent: a replay would have to store the secret in the idempotency record.
    idempotentCreate: false,
    // Nor in a batch, whose answer is stored under its Idempotency-Key.
    batchable: false,
    created: { name: 'WebhookWithSecret', schema: withSecret },
    noStore: ['create'],
  })
