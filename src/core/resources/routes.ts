import type { TransactionSql } from 'postgres'
import Type, { type TSchema } from 'typebox'
import { listCollection } from '../collections/list-query.js'
import { transaction } from '../db/transaction.js'
import type { ListQuery } from '../collections/declaration.js'
import { etagFor, ifMatchVersions } from '../http/conditional.js'
import { notFound, validationFailed } from '../http/problem.js'
import { compileValidator } from '../http/validate.js'
import { defineRoute, type AnyRoute, type HandlerContext, type Reply, type RouteExtensions } from '../http/route.js'
import type { Resource } from './resource.js'
import {
  conflictOf,
  deleteRow,
  findRow,
  insertRow,
  lockRow,
  purgeRows,
  restoreRow,
  updateIfChanged,
  updateRow,
  type Scope,
  type StoredRow,
} from './store.js'

// The six operations of a declared resource (list, create, read, replace,
// update by merge patch, delete) as routes, and a seventh, restore, for a
// resource with a trash (its DELETE moves a row there; `?trashed=true` lists
// it, `?permanent=true` purges at once). What is particular to a resource
// (a password stored as its hash, the last-admin rule, a key's secret, what a
// purge erases) is a hook; everything else is the same code for every resource.

export type Operation = 'list' | 'create' | 'read' | 'replace' | 'update' | 'delete' | 'restore'
type Body = Record<string, unknown>
export type ResourceContext = HandlerContext<unknown, Body>

/** A create, replace or patch on its way to the database. */
export interface Write {
  op: 'create' | 'replace' | 'update'
  ctx: ResourceContext
  /** Column values set by a hook beyond the body's stored members (a password's hash). */
  columns: Record<string, unknown>
}

/** A replace or patch in its transaction: the locked row and what the write changes. */
export interface LockedWrite extends Write {
  current: StoredRow
  changes: Record<string, unknown>
}

export interface ResourceHooks<State = undefined> {
  /** Equality filters the caller (`ctx`) cannot lift, on list, read and delete (a user sees only its own API keys). */
  scope?(ctx: HandlerContext<unknown, unknown>): Scope | undefined
  /** Checks of a list request that depend on the caller. */
  checkList?(query: ListQuery, ctx: HandlerContext<ListQuery, undefined>): void
  /**
   * Before the transaction of a create, replace or patch: checks of the
   * caller and values for `write.columns`. Slow work (hashing a password)
   * belongs here: a row lock must not wait on it.
   */
  prepare?(write: Write): Promise<State>
  /**
   * In the transaction of a replace or patch, before the row is locked: for the rows that come before
   * it in the application's lock order (a parent's), so that the write never waits for them holding it.
   */
  beforeLock?(tx: TransactionSql, write: Write, state: State): Promise<void>
  /** In the transaction of a replace or patch, the row locked and the changes known; throwing rolls it back. */
  inTransaction?(tx: TransactionSql, write: LockedWrite, state: State): Promise<void>
  /** After a replace or patch committed (waiting until this instance has heard what it revoked). */
  afterCommit?(write: LockedWrite): Promise<void>
  /** Replaces the INSERT of a create (an API key's secret and limit): the row, and what its answer adds. */
  insert?(
    ctx: ResourceContext,
    values: Body,
  ): Promise<{ row: StoredRow; body?: Body; headers?: Record<string, string> }>
  /**
   * Before a delete, outside any transaction: checks of the caller and of the
   * DELETE's body (the resource's deleteBody) that may be slow (a password).
   */
  prepareDelete?(ctx: HandlerContext<unknown, Body | undefined>): Promise<State>
  /**
   * In the transaction of a delete (to the trash, or a purge with `?permanent=true`), the row locked (a trashed one
   * too for a purge: `current.deleted_at` tells); throwing keeps the row.
   */
  beforeDelete?(tx: TransactionSql, current: StoredRow, state: State): Promise<void>
  afterDelete?(ctx: HandlerContext<unknown, Body | undefined>): Promise<void>
  /**
   * In the transaction of a purge (`?permanent=true`, or the retention's, src/core/resources/trash-purge.ts), the
   * rows locked, before they go: what else goes with them (a user's personal data elsewhere).
   */
  beforePurge?(tx: TransactionSql, rows: readonly StoredRow[]): Promise<void>
}

/** The query of a DELETE of a resource with a trash. */
interface DeleteQuery {
  permanent?: boolean
}

export interface ResourceRouteOptions<State> {
  /**
   * What the application adds to each operation's route (RouteExtensions:
   * who may call it), passed through as it is; replace, update and delete
   * share `write`.
   */
  routes: { list: RouteExtensions; create: RouteExtensions; read: RouteExtensions; write: RouteExtensions }
  /** Default: all six. */
  operations?: readonly Operation[]
  hooks?: ResourceHooks<State>
  /** Where an operation needs more words than the default summary. */
  summaries?: Partial<Record<Operation, string>>
  /** Creating POSTs honour Idempotency-Key, unless their answer must not be stored (a secret). Default true. */
  idempotentCreate?: boolean
  /** The schema of a create's answer when a hook adds to it; its OpenAPI name. */
  created?: { name: string; schema: TSchema }
  /** Answers of these operations must not be stored by any cache. */
  noStore?: readonly Operation[]
  /**
   * For a resource with a trash: what the application adds to the restore route (who may call it), and its check of
   * the same rule for the trash's two other doors, `GET ?trashed=true` and `DELETE ?permanent=true`, which share
   * their routes with callers who may not use them (throws the application's problem).
   */
  trash?: { route: RouteExtensions; authorize(ctx: HandlerContext<unknown, unknown>, door: 'list' | 'purge'): void }
  /**
   * Its operations but list may be operations of a batch (POST /batch), whose answer is stored under the batch's
   * Idempotency-Key: not for a resource whose answers hold a secret. Default true.
   */
  batchable?: boolean
}

const permanentQuery = compileValidator(
  Type.Object(
    {
      permanent: Type.Optional(
        Type.Boolean({
          description: 'true: purge it for good at once, live or in the trash (an admin only); false: to the trash',
          examples: [true],
        }),
      ),
    },
    { additionalProperties: false },
  ),
  {
    fromWire: (query) => {
      const { permanent, ...rest } = query as Record<string, string>
      return permanent === 'true'
        ? { ...rest, permanent: true }
        : permanent === 'false'
          ? { ...rest, permanent: false }
          : query
    },
  },
)

export function resourceRoutes<State = undefined>(
  resource: Resource,
  options: ResourceRouteOptions<State>,
): AnyRoute[] {
  const { name, label, path, schemas, bodies, versioned } = resource
  const hooks: ResourceHooks<State> = options.hooks ?? {}
  const trash = resource.trash ? options.trash : undefined
  if (resource.trash && !trash) throw new Error(`${name}: a resource with a trash needs the trash option's access`)
  const { plural } = resource
  const item = `${path}/{id}`
  const etag = versioned ? (['etag'] as const) : []
  const summaries: Record<Operation, string> = {
    list: `List ${label}s: filter, sort, page, select`,
    create: `Create a ${label}`,
    read: `Read a ${label}`,
    replace: `Replace a ${label}`,
    update: `Change a ${label} (JSON merge patch)`,
    delete: resource.trash
      ? `Delete a ${label}: to the trash, or for good with permanent=true (an admin)`
      : `Delete a ${label}`,
    restore: `Restore a ${label} from the trash (an admin)`,
    ...options.summaries,
  }
  const scopeOf = (ctx: HandlerContext<unknown, unknown>) => hooks.scope?.(ctx)
  const noStoreFor = (op: Operation) => (options.noStore?.includes(op) ? { noStore: true as const } : {})
  const reply = (status: number, row: StoredRow, extra?: { body?: Body; headers?: Record<string, string> }): Reply => ({
    status,
    headers: { ...(versioned ? { etag: etagFor(row.version) } : {}), ...extra?.headers },
    ...(extra?.body
      ? { body: { ...resource.present(row), ...extra.body } }
      : { body: resource.present(row), serialize: resource.serializer.one }),
  })

  /**
   * PUT: every stored member from the body; left out, its default, its stored value (keepOnReplace) or NULL (optional).
   */
  const replaced = (body: Body, current: StoredRow): Body => {
    const next: Body = {}
    for (const [member, t] of Object.entries(resource.traits)) {
      if (t.write !== 'client' || t.virtual) continue
      next[member] =
        body[member] !== undefined
          ? body[member]
          : t.keepOnReplace
            ? current[member]
            : t.default !== undefined
              ? t.default
              : null
    }
    return next
  }
  /** PATCH (RFC 7396): members present are set; null removes a member, which for one with a default is the default. */
  const patched = (body: Body): Body => {
    const next: Body = {}
    for (const [member, t] of Object.entries(resource.traits)) {
      if (t.write !== 'client' || t.virtual || body[member] === undefined) continue
      next[member] = body[member] === null ? (t.default ?? null) : body[member]
    }
    return next
  }

  /**
   * A PATCH that needs nothing but its UPDATE (no hook in its transaction): one statement, no BEGIN, lock or COMMIT
   * round trips.
   */
  async function patchInOneStatement(ctx: ResourceContext, next: Body): Promise<StoredRow | undefined> {
    const versions = versioned ? ifMatchVersions(ctx.headers['if-match']) : undefined
    if (Object.keys(next).length === 0 || versions?.length === 0) return undefined
    return updateIfChanged(ctx.db, resource, ctx.params.id!, next, versions, ctx.services.changeOrigin(ctx)).catch(
      (err: unknown) => Promise.reject(conflictOf(resource, err)),
    )
  }

  /**
   * PUT and PATCH: the new state is computed from the locked row, so concurrent writes serialize and If-Match is
   * checked against what is written.
   */
  async function write(ctx: ResourceContext, op: 'replace' | 'update'): Promise<Reply> {
    const body = ctx.body
    if (body.id !== undefined && String(body.id) !== ctx.params.id)
      throw validationFailed([{ path: '/id', message: 'must equal the id in the path' }])
    const pending: Write = { op, ctx, columns: {} }
    const state = (await hooks.prepare?.(pending)) as State
    if (op === 'update' && !hooks.beforeLock && !hooks.inTransaction && !hooks.afterCommit) {
      const row = await patchInOneStatement(ctx, { ...patched(body), ...pending.columns })
      if (row) return reply(200, row)
    }
    let locked: LockedWrite | undefined
    const row = await transaction(ctx.db, async (tx) => {
      await hooks.beforeLock?.(tx, pending, state)
      const current = await lockRow(tx, resource, ctx.params.id!, ctx.headers['if-match'])
      const next = { ...(op === 'replace' ? replaced(body, current) : patched(body)), ...pending.columns }
      locked = { ...pending, current, changes: changedMembers(current, next) }
      await hooks.inTransaction?.(tx, locked, state)
      return Object.keys(locked.changes).length
        ? updateRow(tx, resource, current.id, locked.changes, ctx.services.changeOrigin(ctx))
        : current
    }).catch((err: unknown) => Promise.reject(conflictOf(resource, err)))
    if (hooks.afterCommit) await ctx.onCommit(() => hooks.afterCommit!(locked!))
    return reply(200, row)
  }

  /** PUT and PATCH differ only in their method, body and how the next state is computed (`write`). */
  const writeRoute = (op: 'replace' | 'update') =>
    defineRoute<Record<string, never>, Body>({
      method: op === 'replace' ? 'PUT' : 'PATCH',
      path: item,
      operationId: `${op}${name}`,
      summary: summaries[op],
      responses: { 200: { description: `The ${label}`, schema: schemas.representation, headers: [...etag] } },
      ...options.routes.write,
      requiresIfMatch: versioned,
      body:
        op === 'replace'
          ? { kind: 'json', validator: bodies.replace }
          : { kind: 'merge-patch', validator: bodies.patch },
      handle: (ctx) => write(ctx, op),
    })

  const routes: Record<Operation, () => AnyRoute> = {
    list: () =>
      defineRoute<ListQuery, undefined>({
        method: 'GET',
        path,
        operationId: `list${plural}`,
        summary: summaries.list,
        responses: {
          200: { description: `A page of ${label}s`, schema: schemas.page, headers: ['link', 'x-total-count'] },
        },
        ...options.routes.list,
        query: resource.collection.queryValidator,
        ...noStoreFor('list'),
        handle: (ctx) => {
          if (ctx.query.trashed) trash!.authorize(ctx, 'list')
          hooks.checkList?.(ctx.query, ctx)
          return listCollection(resource.collection, ctx.query, {
            services: ctx.services,
            db: ctx.db,
            fixedFilters: scopeOf(ctx),
          })
        },
      }),

    create: () =>
      defineRoute<Record<string, never>, Body>({
        method: 'POST',
        path,
        operationId: `create${name}`,
        summary: summaries.create,
        responses: {
          201: {
            description: `The created ${label}`,
            schema: options.created?.schema ?? schemas.representation,
            headers: [...etag, 'location'],
          },
        },
        ...options.routes.create,
        idempotent: options.idempotentCreate ?? true,
        ...noStoreFor('create'),
        body: { kind: 'json', validator: bodies.create },
        async handle(ctx) {
          const pending: Write = { op: 'create', ctx, columns: {} }
          await hooks.prepare?.(pending)
          const values: Body = {}
          for (const [member, t] of Object.entries(resource.traits)) {
            if (t.write === 'server' || t.virtual) continue
            const given = ctx.body[member]
            if (given !== undefined) values[member] = given
            else if (t.default !== undefined) values[member] = t.default
          }
          Object.assign(values, pending.columns)
          const created = hooks.insert
            ? await hooks.insert(ctx, values)
            : {
                row: await insertRow(ctx.db, resource, values, ctx.services.changeOrigin(ctx)).catch((err: unknown) =>
                  Promise.reject(conflictOf(resource, err)),
                ),
              }
          return reply(201, created.row, {
            body: created.body,
            headers: { location: `${ctx.services.config.apiPrefix}${path}/${created.row.id}`, ...created.headers },
          })
        },
      }),

    read: () =>
      defineRoute({
        method: 'GET',
        path: item,
        operationId: `get${name}`,
        summary: summaries.read,
        responses: { 200: { description: `The ${label}`, schema: schemas.representation, headers: [...etag] } },
        ...options.routes.read,
        ...noStoreFor('read'),
        async handle(ctx) {
          const row = await findRow(ctx.db, resource, ctx.params.id!, scopeOf(ctx))
          if (!row) throw notFound()
          return reply(200, row)
        },
      }),

    replace: () => writeRoute('replace'),
    update: () => writeRoute('update'),

    delete: () =>
      defineRoute<DeleteQuery, Body | undefined>({
        method: 'DELETE',
        path: item,
        operationId: `delete${name}`,
        summary: summaries.delete,
        responses: { 204: { description: resource.trash ? 'Moved to the trash, or purged' : 'Deleted' } },
        ...options.routes.write,
        requiresIfMatch: versioned,
        ...(trash ? { query: permanentQuery } : {}),
        // Optional: a DELETE without a body stays a plain DELETE.
        ...(bodies.delete ? { body: { kind: 'json' as const, validator: bodies.delete, optional: true } } : {}),
        async handle(ctx) {
          const { params, headers, services, db } = ctx
          const origin = services.changeOrigin(ctx)
          const permanent = ctx.query.permanent === true
          if (permanent) trash!.authorize(ctx, 'purge')
          const state = (await hooks.prepareDelete?.(ctx)) as State
          if (versioned || trash) {
            await transaction(db, async (tx) => {
              const current = await lockRow(tx, resource, params.id!, headers['if-match'], { trashed: permanent })
              await hooks.beforeDelete?.(tx, current, state)
              if (!permanent) return deleteRow(tx, resource, current.id, origin)
              await hooks.beforePurge?.(tx, [current])
              return purgeRows(tx, resource, [current.id], origin)
            })
          } else if (!(await deleteRow(db, resource, params.id!, origin, scopeOf(ctx)))) {
            throw notFound()
          }
          if (hooks.afterDelete) await ctx.onCommit(() => hooks.afterDelete!(ctx))
          return { status: 204 }
        },
      }),

    restore: () =>
      defineRoute({
        method: 'POST',
        path: `${item}/restore`,
        operationId: `restore${name}`,
        summary: summaries.restore,
        responses: {
          200: { description: `The ${label}, live again`, schema: schemas.representation, headers: [...etag] },
        },
        ...trash!.route,
        async handle(ctx) {
          const row = await restoreRow(ctx.db, resource, ctx.params.id!, ctx.services.changeOrigin(ctx)).catch(
            (err: unknown) => Promise.reject(conflictOf(resource, err)),
          )
          if (!row) throw notFound()
          return reply(200, row)
        },
      }),
  }
  const components = {
    ...resource.components(),
    ...(options.created ? { [options.created.name]: options.created.schema } : {}),
  }
  // A list's paging headers have no place in a batch's result.
  const batchable = (op: Operation) =>
    options.batchable !== false && op !== 'list' ? { batchable: true as const } : {}
  const all = (Object.keys(routes) as Operation[]).filter((op) => op !== 'restore' || trash)
  return (options.operations ?? all).map((op) => ({
    ...routes[op](),
    components,
    ...batchable(op),
  }))
}

/**
 * The members a write would change, as the SET list of an UPDATE. PATCH with
 * `{}`, or a PUT of the same content, changes nothing: no new version, no new
 * updated_at, the same ETag.
 */
function changedMembers(current: StoredRow, next: Body): Body {
  const changes: Body = {}
  for (const key of Object.keys(next)) {
    if (next[key] !== undefined && next[key] !== current[key]) changes[key] = next[key]
  }
  return changes
}
