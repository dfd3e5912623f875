import type { IncomingHttpHeaders, ServerResponse } from 'node:http'
import type { TransactionSql } from 'postgres'
import type { TSchema } from 'typebox'
import type { Db } from '../db/transaction.js'
import type { BodyKind } from './body.js'
import type { CoreServices } from './services.js'
import type { Validator } from './validate.js'

export type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE'

/** What a handler returns; `writeReply` is the only code that writes to the socket, but for a `stream`'s body. */
export interface Reply {
  status: number
  headers?: Record<string, string>
  /** Sent as JSON, unless `text` is given. */
  body?: unknown
  /**
   * Writes `body` as JSON in place of JSON.stringify: a representation's
   * compiled serializer (src/core/resources/serializer.ts). It may write only some
   * of the body's members (a page's `fields=`).
   */
  serialize?: (body: any) => string
  /** A non-JSON body (Prometheus text) with its Content-Type. */
  text?: { contentType: string; content: string }
  /** A body written over time (Server-Sent Events) in place of `body` and `text`. */
  stream?: StreamBody
}

/**
 * A body that outlives the handler: `writeReply` writes the head (status,
 * headers, `contentType`, no length: chunked) and hands the response to
 * `start`, which owns it from then on. A stream that is never started (a
 * HEAD request, a client gone before the answer) is `cancel`led instead, so
 * that whatever the handler reserved for it is given back.
 */
export interface StreamBody {
  contentType: string
  start(res: ServerResponse): void
  cancel(): void
}

/**
 * What the application adds to every route's declaration (who may call it),
 * by declaration merging in one application file (src/app-context.ts), the
 * way fastify's TypeScript plugins add to its types. Core never reads these
 * members: it hands the route to the application's stages as it is.
 */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type
export interface RouteExtensions {}

/**
 * What the application adds to every handler's context beyond core's own
 * members (the caller), merged in src/app-context.ts and filled by the
 * application's stages (src/core/http/stages.ts).
 */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type
export interface ContextExtensions {}

/**
 * What the application's services add to core's in `ctx.services` (the same
 * object, which the application builds whole), merged in src/app-context.ts.
 */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type
export interface ServiceExtensions {}

export interface HandlerContext<Query, Body> extends ContextExtensions {
  params: Record<string, string>
  query: Query
  body: Body
  headers: IncomingHttpHeaders
  requestId: string
  /** The client's address, as TRUST_PROXY allows it to be known (src/core/http/client-address.ts). */
  client: string
  /**
   * Runs database work under database admission (src/core/db/admission.ts),
   * for a route whose `database` is 'statements'; elsewhere it runs the work
   * as it is (the whole handler is bounded, or touches no database).
   */
  bounded: <T>(work: () => Promise<T>) => Promise<T>
  /** The service instance's dependencies: core's (src/core/http/services.ts) and the application's. */
  services: CoreServices & ServiceExtensions
  /**
   * Where the request's own reads and writes run: the pool, or the transaction of the batch the request is an
   * operation of (src/core/http/batch.ts). Bookkeeping that must stand even when the batch is undone (a counted
   * password guess) runs on `services.sql`.
   */
  db: Db
  /**
   * Work that must wait until the request's changes are committed (hearing that a revocation reached this instance):
   * run at once for a request alone, after the commit for an operation of a batch.
   */
  onCommit(work: () => Promise<void>): Promise<void>
  /**
   * For a route that `runsOperations` (POST /batch): runs one operation as the pipeline runs a request of the same
   * caller, on the batch's transaction.
   */
  runOperation?(operation: BatchOperation, scope: OperationScope): Promise<Reply>
  /** For a route that `runsOperations`: whether the caller may run the operation now (its route and access). */
  checkOperation?(operation: BatchOperation): void
}

/** One operation of a batch as its client wrote it (src/core/http/batch.ts). */
export interface BatchOperation {
  method: Method
  /** The path as a request would have it (API prefix included), with its query string. */
  path: string
  body?: unknown
  if_match?: string
}

/**
 * Where an operation of a batch runs: the batch's transaction, and the queue of its after-commit work. `counted`: the
 * batch's own request already counted against the rate window for this operation (the first).
 */
export interface OperationScope {
  db: TransactionSql
  onCommit(work: () => Promise<void>): Promise<void>
  counted: boolean
}

/**
 * How a route's work waits for the database: 'handler' (the default): the
 * whole handler runs under database admission; 'statements': the
 * handler waits on something else too (a password-hash slot) and bounds its
 * statements itself with `ctx.bounded`; 'none': it never touches the database.
 */
export type DatabaseUse = 'handler' | 'statements' | 'none'

/**
 * A route is data: who may call it and what it accepts are declared here, and
 * the pipeline enforces them before the handler runs, so handlers only see
 * checked, typed input.
 */
export interface Route<Query = Record<string, never>, Body = undefined> extends RouteExtensions {
  method: Method
  /** A template such as `/users/{id}`; `{id}` only matches a positive bigint. */
  path: string
  /** Query string schema (all values arrive as strings); none means no parameters at all. */
  query?: Validator<Query>
  /**
   * `optional`: a request with no body at all is accepted and the handler gets undefined. `limitFactor`: the body
   * may be this many times BODY_LIMIT (a batch's, which carries many bodies); default 1.
   */
  body?: { kind: BodyKind; validator: Validator<Body>; optional?: boolean; limitFactor?: number }
  handle(ctx: HandlerContext<Query, Body>): Promise<Reply>
  /** A creating POST: honours Idempotency-Key. */
  idempotent?: boolean
  /**
   * An operation a batch may run (POST /batch): a resource's read or write, whose answer may be stored with the
   * batch's under its Idempotency-Key.
   */
  batchable?: true
  /** Runs other routes as the operations of a batch: its handler gets `ctx.runOperation`. */
  runsOperations?: true
  /**
   * Before a stored answer is replayed for an Idempotency-Key: throws when this caller may not have it now (a batch,
   * whose own access says nothing of its operations', checks each of them again).
   */
  beforeReplay?(ctx: HandlerContext<unknown, unknown>, answer: unknown): void
  /** A write of a versioned resource: 428 without If-Match when REQUIRE_IF_MATCH=true. */
  requiresIfMatch?: boolean
  /**
   * Every answer, errors included, carries `Cache-Control: no-store`: answers
   * about credentials must not be stored by any cache (RFC 6749 §5.1). OPTIONS
   * and 405 answers on the route's path carry it too (src/core/http/router.ts).
   */
  noStore?: true
  /** Default 'handler': everything that touches the database waits under database admission, unless it says why not. */
  database?: DatabaseUse
  /**
   * For the OpenAPI document: the operation's name in generated clients (default: method and path, e.g. postAuthLogin).
   */
  operationId?: string
  /** For the OpenAPI document: what the operation does. */
  summary?: string
  /**
   * The success answers, for the OpenAPI document (error answers are derived
   * from the route's other declarations). `schema` undefined: no body.
   */
  responses?: Record<
    number,
    { description: string; schema?: TSchema; headers?: ResponseHeader[]; contentType?: string }
  >
  /** For the OpenAPI document: schemas of this route to document once by name (components.schemas), by their name. */
  components?: Record<string, TSchema>
  /** For the OpenAPI document: error statuses the handler answers beyond those its other declarations imply. */
  errorStatuses?: readonly number[]
}

/** Headers a success answer carries beyond the ones every answer has. */
export type ResponseHeader = 'etag' | 'location' | 'link' | 'x-total-count' | 'idempotent-replayed'

// Erases the generics so that routes of different shapes fit in one table
// while each definition stays fully typed where it is written.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type AnyRoute = Route<any, any>
export const defineRoute = <Query = Record<string, never>, Body = undefined>(route: Route<Query, Body>): AnyRoute =>
  route
