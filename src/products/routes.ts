import { listCollection } from '../collections/list-query.js'
import { etagFor } from '../http/conditional.js'
import { notFound } from '../http/problem.js'
import { defineRoute, type HandlerContext, type Reply } from '../http/route.js'
import { compileValidator } from '../http/validate.js'
import { changedMembers, checkEchoedId, lockForWrite } from '../resources/common.js'
import { productsCollection } from './collection.js'
import { deleteProduct, findProduct, insertProduct, presentProduct, updateProduct, type ProductRow, type ProductWrite } from './queries.js'
import { Product, ProductCreate, ProductPage, ProductPatch, ProductReplace, productDefaults } from './schemas.js'

const createBody = { kind: 'json' as const, validator: compileValidator(ProductCreate) }
const replaceBody = { kind: 'json' as const, validator: compileValidator(ProductReplace) }
const patchBody = { kind: 'merge-patch' as const, validator: compileValidator(ProductPatch) }

const productReply = (status: number, row: ProductRow, extra: Record<string, string> = {}): Reply => ({
  status,
  headers: { etag: etagFor(row.version), ...extra },
  body: presentProduct(row),
})

/** A full product from a create or replace body: members left out get their defaults. */
const withDefaults = (body: ProductCreate): ProductWrite => ({
  sku: body.sku,
  name: body.name,
  description: body.description ?? productDefaults.description,
  price: body.price,
  currency: body.currency,
  stock: body.stock ?? productDefaults.stock,
})

async function writeProduct(ctx: HandlerContext<unknown, ProductReplace | ProductPatch>, next: Partial<ProductWrite>): Promise<Reply> {
  checkEchoedId(ctx.body, ctx.params.id!)
  const row = await ctx.deps.sql.begin(async (tx) => {
    const current = await lockForWrite<ProductRow>(tx, 'products', ctx.params.id!, ctx.headers['if-match'])
    const changes = changedMembers(current, next)
    return Object.keys(changes).length ? updateProduct(tx, current.id, changes) : current
  })
  return productReply(200, row)
}

export const productRoutes = [
  defineRoute({
    method: 'GET',
    path: '/products',
    summary: 'List products: filter, sort, page, select',
    responses: { 200: { description: 'A page of products', schema: ProductPage, headers: ['link', 'x-total-count'] } },
    access: { kind: 'protected', scope: 'products:read', who: 'any' },
    query: productsCollection.queryValidator,
    handle: ({ query, deps }) =>
      listCollection(productsCollection, query, {
        deps,
      }),
  }),

  defineRoute({
    method: 'POST',
    path: '/products',
    summary: 'Create a product',
    responses: { 201: { description: 'The created product', schema: Product, headers: ['etag', 'location'] } },
    access: { kind: 'protected', scope: 'products:write', who: 'admin' },
    idempotent: true,
    body: createBody,
    async handle({ body, deps }) {
      const row = await insertProduct(deps.sql, withDefaults(body))
      return productReply(201, row, { location: `${deps.config.apiPrefix}/products/${row.id}` })
    },
  }),

  defineRoute({
    method: 'GET',
    path: '/products/{id}',
    summary: 'Read a product',
    responses: { 200: { description: 'The product', schema: Product, headers: ['etag'] } },
    access: { kind: 'protected', scope: 'products:read', who: 'any' },
    async handle({ params, deps }) {
      const row = await findProduct(deps.sql, params.id!)
      if (!row) throw notFound()
      return productReply(200, row)
    },
  }),

  defineRoute({
    method: 'PUT',
    path: '/products/{id}',
    summary: 'Replace a product',
    responses: { 200: { description: 'The product', schema: Product, headers: ['etag'] } },
    access: { kind: 'protected', scope: 'products:write', who: 'admin' },
    requiresIfMatch: true,
    body: replaceBody,
    handle: (ctx) => writeProduct(ctx, withDefaults(ctx.body)),
  }),

  defineRoute({
    method: 'PATCH',
    path: '/products/{id}',
    summary: 'Change a product (JSON merge patch)',
    responses: { 200: { description: 'The product', schema: Product, headers: ['etag'] } },
    access: { kind: 'protected', scope: 'products:write', who: 'admin' },
    requiresIfMatch: true,
    body: patchBody,
    handle: (ctx) => {
      const { sku, name, description, price, currency, stock } = ctx.body
      // RFC 7396: null removes a member; for one with a default, that is the default.
      return writeProduct(ctx, {
        sku, name, price, currency,
        description: description === null ? productDefaults.description : description,
        stock: stock === null ? productDefaults.stock : stock,
      })
    },
  }),

  defineRoute({
    method: 'DELETE',
    path: '/products/{id}',
    summary: 'Delete a product',
    responses: { 204: { description: 'Deleted' } },
    access: { kind: 'protected', scope: 'products:write', who: 'admin' },
    requiresIfMatch: true,
    async handle({ params, headers, deps }) {
      await deps.sql.begin(async (tx) => {
        const current = await lockForWrite<ProductRow>(tx, 'products', params.id!, headers['if-match'])
        await deleteProduct(tx, current.id)
      })
      return { status: 204 }
    },
  }),
]
