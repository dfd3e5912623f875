import { defineCollection } from '../collections/declaration.js'

export const productsCollection = defineCollection({
  table: 'products',
  path: '/products',
  members: {
    id: { type: 'integer', minimum: 1, maximum: 9223372036854775807 },
    sku: { type: 'text' },
    name: { type: 'text' },
    price: { type: 'integer', minimum: 0, maximum: 1_000_000_000_000 },
    currency: { type: 'text' },
    stock: { type: 'integer', minimum: 0, maximum: 2_147_483_647 },
    created_at: { type: 'timestamp' },
    updated_at: { type: 'timestamp' },
  },
  searchColumns: ['name', 'sku', 'description'],
  outputMembers: ['id', 'sku', 'name', 'description', 'price', 'currency', 'stock', 'created_at', 'updated_at'],
})
