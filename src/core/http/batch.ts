import Type, { type Static } from 'typebox'
import { HttpError, validationFailed } from './problem.js'
import { defineRoute, type AnyRoute, type BatchOperation, type HandlerContext, type Reply } from './route.js'
import type { RouteExtensions } from './route.js'
import { compileValidator } from './validate.js'

// POST /batch: up to MAX_OPERATIONS operations on the resource routes run in
// order in one transaction, each as the pipeline runs a request of the same
// caller (src/core/http/pipeline.ts, runOperation): authorized, counted,
// validated and answered as it would be alone. All succeed: one commit, their
// events in operation order. One fails: its problem, with `operation` (its
// index), and the transaction is rolled back, so nothing of any operation
// remains (rows, events, queued mail: all are written in the transaction).

export const MAX_OPERATIONS = 100
/** The whole batch may be this many times BODY_LIMIT; each operation's body stays within BODY_LIMIT. */
export const BATCH_BODY_FACTOR = 10
/** The request deadline (STATEMENT_TIMEOUT + 5 s) is multiplied by one for every this many operations begun. */
export const OPERATIONS_PER_DEADLINE = 10
/** The time a batch's COMMIT is given before its deadline. */
const COMMIT_MARGIN_MS = 1000

/**
 * `{2.id}` in an operation's path: the member `id` of the answer of operation
 * 2 of the same batch, which must come before it.
 */
const REFERENCE = /\{([0-9]{1,3})\.([a-z_][a-z0-9_]{0,62})\}/g

const operationSchema = Type.Object(
  {
    method: Type.Union(['GET', 'POST', 'PUT', 'PATCH', 'DELETE'].map((m) => Type.Literal(m))),
    path: Type.String({
      minLength: 1,
      maxLength: 2048,
      pattern: '^/[\\x21-\\x7e]*$',
      description:
        'the path as a request would have it (API prefix and query string included); `{i.member}` stands for a ' +
        'member of the answer of operation i, an earlier one: `/products/{0.id}`',
    }),
    body: Type.Optional(Type.Unknown({ description: "the operation's JSON body, as its request would carry it" })),
    if_match: Type.Optional(
      Type.String({ minLength: 1, maxLength: 1024, description: "the operation's If-Match header" }),
    ),
  },
  { additionalProperties: false },
)

export const batchSchemas = {
  BatchRequest: Type.Object(
    { operations: Type.Array(operationSchema, { minItems: 1, maxItems: MAX_OPERATIONS }) },
    {
      additionalProperties: false,
      examples: [
        {
          operations: [
            { method: 'POST', path: '/products', body: { sku: 'MUG-1', name: 'Mug', price: 900, currency: 'EUR' } },
            { method: 'PATCH', path: '/products/{0.id}', body: { stock: 12 } },
            { method: 'DELETE', path: '/products/7', if_match: '"v3"' },
          ],
        },
      ],
    },
  ),
  BatchResults: Type.Object(
    {
      results: Type.Array(
        Type.Object(
          {
            status: Type.Integer({ description: 'the status the operation alone would have been answered with' }),
            location: Type.Optional(Type.String()),
            etag: Type.Optional(Type.String()),
            body: Type.Optional(Type.Unknown({ description: 'its answer' })),
          },
          { additionalProperties: false },
        ),
      ),
    },
    {
      additionalProperties: false,
      examples: [
        {
          results: [
            {
              status: 201,
              location: '/products/8',
              etag: '"v1"',
              body: { id: 8, sku: 'MUG-1', name: 'Mug', description: '', price: 900, currency: 'EUR', stock: 0 },
            },
            { status: 200, etag: '"v2"', body: { id: 8, sku: 'MUG-1', stock: 12 } },
            { status: 204 },
          ],
        },
      ],
    },
  ),
}

type BatchBody = Static<typeof batchSchemas.BatchRequest>
type BatchResult = Static<typeof batchSchemas.BatchResults>['results'][number]

/** The route of POST /batch, with what the application adds to it (who may call it). */
export function batchRoute(extensions: RouteExtensions): AnyRoute {
  return defineRoute<Record<string, never>, BatchBody>({
    method: 'POST',
    path: '/batch',
    operationId: 'runBatch',
    summary: `Run 1 to ${MAX_OPERATIONS} operations on resources in one transaction: all or nothing`,
    responses: { 200: { description: 'Every operation succeeded', schema: batchSchemas.BatchResults } },
    components: batchSchemas,
    ...extensions,
    idempotent: true,
    runsOperations: true,
    // Under database admission by its own deadline, which grows with its operations (runBatch).
    database: 'statements',
    body: {
      kind: 'json',
      validator: compileValidator(batchSchemas.BatchRequest),
      limitFactor: BATCH_BODY_FACTOR,
    },
    errorStatuses: [403, 404, 405, 409, 412, 413, 428],
    handle: runBatch,
    beforeReplay: checkOperationsAgain,
  })
}

/**
 * A stored batch answer is replayed only to a caller who may run every one of its operations now: the batch's own
 * access is anyone's, and the key is its user's, not its credential's (another key of the same user, with fewer
 * scopes, or the same user since demoted, sends the same key).
 */
function checkOperationsAgain(ctx: HandlerContext<unknown, unknown>, answer: unknown): void {
  const { operations } = ctx.body as BatchBody
  const results = (answer as { results?: BatchResult[] } | undefined)?.results ?? []
  for (const [index, operation] of operations.entries()) {
    try {
      ctx.checkOperation!(resolveReferences(operation, index, results))
    } catch (err) {
      throw ofOperation(err, index)
    }
  }
}

declare module './services.js' {
  interface CoreServices {
    /**
     * Batches in their transaction at once: one connection fewer than the pool has (BatchSlots). An operation may
     * need a second connection beside its batch's (a password guess is counted on the pool, to stand if the batch
     * is undone): with every connection held by a batch waiting for one, none would move.
     */
    batchSlots: BatchSlots
  }
}

/** A count of places, and those waiting for one in arrival order. */
export class BatchSlots {
  private used = 0
  private readonly waiting: Array<() => void> = []
  private readonly size: number
  /** For a pool of `poolMax` connections. */
  constructor(poolMax: number) {
    this.size = Math.max(1, poolMax - 1)
  }
  async hold<T>(work: () => Promise<T>): Promise<T> {
    if (this.used < this.size) this.used++
    else await new Promise<void>((resolve) => this.waiting.push(resolve))
    try {
      return await work()
    } finally {
      const next = this.waiting.shift()
      if (next) next()
      else this.used--
    }
  }
}

async function runBatch(ctx: HandlerContext<Record<string, never>, BatchBody>): Promise<Reply> {
  const { operations } = ctx.body
  const { databaseAdmission, sql, batchSlots } = ctx.services
  const afterCommit: Array<() => Promise<void>> = []
  const deadlineMs = databaseAdmission.deadlineMs * Math.ceil(operations.length / OPERATIONS_PER_DEADLINE)
  const started = performance.now()
  const results = await databaseAdmission.run(
    () =>
      batchSlots.hold(() =>
        sql.begin(async (tx) => {
          const results: BatchResult[] = []
          for (const [index, operation] of operations.entries()) {
            let reply: Reply
            try {
              reply = await ctx.runOperation!(resolveReferences(operation, index, results), {
                db: tx,
                onCommit: async (work) => void afterCommit.push(work),
                counted: index === 0,
              })
            } catch (err) {
              throw ofOperation(err, index)
            }
            results.push(resultOf(reply))
          }
          // Near or past its deadline the client is (or is about to be) answered 503: a batch it was told failed
          // must not commit, so one that leaves its commit less than COMMIT_MARGIN_MS is rolled back instead.
          if (performance.now() - started > deadlineMs - COMMIT_MARGIN_MS)
            throw new Error('the batch passed its deadline')
          return results
        }),
      ),
    deadlineMs,
  )
  for (const work of afterCommit) await work()
  return { status: 200, body: { results } }
}

/** The operation with each `{i.member}` of its path replaced by that member of operation i's answer. */
function resolveReferences(operation: BatchOperation, index: number, results: readonly BatchResult[]): BatchOperation {
  if (!operation.path.includes('{')) return operation
  const path = operation.path.replace(REFERENCE, (_, at: string, member: string) => {
    const earlier = Number(at)
    const value =
      earlier < index ? (results[earlier]?.body as Record<string, unknown> | undefined)?.[member] : undefined
    if (typeof value !== 'string' && typeof value !== 'number') {
      throw validationFailed([
        {
          path: `/operations/${index}/path`,
          message: `{${at}.${member}} names no member of the answer of an earlier operation`,
        },
      ])
    }
    return encodeURIComponent(String(value))
  })
  if (path.includes('{') || path.includes('}'))
    throw validationFailed([{ path: `/operations/${index}/path`, message: 'a reference must be {i.member}' }])
  return { ...operation, path }
}

function resultOf(reply: Reply): BatchResult {
  const { location, etag } = reply.headers ?? {}
  return {
    status: reply.status,
    ...(location !== undefined ? { location } : {}),
    ...(etag !== undefined ? { etag } : {}),
    ...(reply.body !== undefined ? { body: reply.body } : {}),
  }
}

/**
 * The operation's problem, with its index: the batch answers with it as the
 * operation alone would have been answered (keeping Retry-After), and a failure
 * that is no problem (the database's) passes as it is.
 */
function ofOperation(err: unknown, index: number): unknown {
  if (!(err instanceof HttpError)) return err
  const retryAfter = err.options.headers?.['retry-after']
  return new HttpError(err.code, err.detail, {
    ...err.options,
    headers: retryAfter !== undefined ? { 'retry-after': retryAfter } : undefined,
    extensions: { ...err.options.extensions, operation: index },
  })
}
