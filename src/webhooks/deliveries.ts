import Type from 'typebox'
import { defineCollection, type ListQuery } from '../core/collections/declaration.js'
import { listCollection } from '../core/collections/list-query.js'
import { notFound } from '../core/http/problem.js'
import { defineRoute } from '../core/http/route.js'
import { compileSerializer } from '../core/resources/serializer.js'
import { findRow } from '../core/resources/store.js'
import type { Resource } from '../core/resources/resource.js'
import { accessOf } from '../resource-module.js'
import { DELIVERIES_CHANNEL } from './wake.js'

// GET /webhooks/{id}/deliveries: a webhook's deliveries, newest first, each
// with its latest attempts; the generic collection over a view
// (webhook_delivery_feed, sql/007), as GET /events is. And the manual retry
// of one delivery.

const BIGINT = { minimum: 1, maximum: 9223372036854775807 }
const nullable = <T extends Parameters<typeof Type.Union>[0][number]>(schema: T) => Type.Union([schema, Type.Null()])
const deliveryStatuses = ['pending', 'succeeded', 'failed'] as const

export const WebhookAttempt = Type.Object(
  {
    attempted_at: Type.String({ format: 'date-time' }),
    status: nullable(Type.Integer({ description: "the receiver's HTTP status; null when there was no answer" })),
    duration_ms: Type.Integer({ minimum: 0 }),
    error: nullable(Type.String({ description: 'why the attempt failed (or what was cut short)' })),
  },
  { additionalProperties: false },
)

export const WebhookDelivery = Type.Object(
  {
    id: Type.Integer({ minimum: 1 }),
    webhook_id: Type.Integer({ minimum: 1 }),
    event_id: Type.Integer({
      minimum: 1,
      description: 'the event delivered; also the webhook-id header of every attempt',
    }),
    event_type: Type.String(),
    status: Type.Union(deliveryStatuses.map((s) => Type.Literal(s))),
    attempt_count: Type.Integer({ minimum: 0 }),
    created_at: Type.String({ format: 'date-time' }),
    next_attempt_at: nullable(Type.String({ format: 'date-time', description: 'when a pending delivery is next due' })),
    last_attempt_at: nullable(Type.String({ format: 'date-time' })),
    last_status: nullable(Type.Integer()),
    last_error: nullable(Type.String()),
    attempts: Type.Array(WebhookAttempt, { description: 'the latest 50 attempts, newest first' }),
  },
  { additionalProperties: false },
)

const serializer = compileSerializer(WebhookDelivery)

export const deliveries = defineCollection({
  table: 'webhook_delivery_feed',
  path: '/webhooks/{id}/deliveries',
  members: { id: { type: 'integer', ...BIGINT } },
  filterOnly: {
    webhook_id: { type: 'integer', ...BIGINT },
    event_id: { type: 'integer', ...BIGINT },
    event_type: { type: 'text' },
    status: { type: 'enum', values: deliveryStatuses },
  },
  searchColumns: [],
  outputMembers: Object.keys(WebhookDelivery.properties),
  serializePage: serializer.page,
})

/** A webhook's deliveries are read and retried by whoever may read and change the webhook. */
export const deliveryRoutes = (webhooks: Resource, { read, write } = accessOf(webhooks)) => [
  defineRoute<ListQuery, undefined>({
    method: 'GET',
    path: '/webhooks/{id}/deliveries',
    operationId: 'listWebhookDeliveries',
    summary:
      "A webhook's deliveries with their attempts, newest first (sort=id for oldest first); filter by status, " +
      'event_type, event_id',
    responses: {
      200: {
        description: 'A page of deliveries',
        schema: Type.Array(Type.Partial(WebhookDelivery)),
        headers: ['link', 'x-total-count'],
      },
    },
    access: read,
    query: deliveries.queryValidator,
    components: { WebhookDelivery, WebhookAttempt },
    async handle({ params, query, services }) {
      if (!(await findRow(services.sql, webhooks, params.id!))) throw notFound()
      // The path of the Link header is this webhook's; the sort defaults to newest first.
      const collection = { ...deliveries, path: `/webhooks/${params.id}/deliveries` }
      return listCollection(
        collection,
        { ...query, sort: query.sort ?? '-id' },
        { services, fixedFilters: { webhook_id: params.id! } },
      )
    },
  }),

  defineRoute({
    method: 'POST',
    // The router knows one path parameter, {id}; a delivery's id is unique across webhooks.
    path: '/webhook-deliveries/{id}/retry',
    operationId: 'retryWebhookDelivery',
    summary: 'Make a delivery due now, a failed or succeeded one too; it is sent once its webhook is active',
    responses: { 200: { description: 'The delivery, pending and due', schema: WebhookDelivery } },
    access: write,
    async handle({ params, services }) {
      // A delivery in flight (its lease running) is left to that attempt: making it due would send it twice at once.
      // The notification wakes every instance's worker at commit; the first to claim it sends it.
      const [due] = await services.sql`
        UPDATE webhook_deliveries SET status = 'pending', next_attempt_at = CASE WHEN leased_until > now() THEN
        next_attempt_at ELSE now() END
        WHERE id = ${params.id!} RETURNING id, pg_notify(${DELIVERIES_CHANNEL}, '')`
      if (!due) throw notFound()
      const [row] = await services.sql<
        Array<Record<string, unknown>>
      >`SELECT * FROM webhook_delivery_feed WHERE id = ${params.id!}`
      if (!row) throw notFound()
      return { status: 200, body: row, serialize: serializer.one }
    },
  }),
]
