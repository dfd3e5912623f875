import type { Sql, TransactionSql } from 'postgres'

export interface ProductRow {
  id: number
  sku: string
  name: string
  description: string
  price: number
  currency: string
  stock: number
  version: number
  created_at: Date
  updated_at: Date
}

export type ProductWrite = Pick<ProductRow, 'sku' | 'name' | 'description' | 'price' | 'currency' | 'stock'>

export function presentProduct(row: ProductRow) {
  const { id, sku, name, description, price, currency, stock, created_at, updated_at } = row
  return { id, sku, name, description, price, currency, stock, created_at, updated_at }
}

export async function findProduct(db: Sql | TransactionSql, id: string): Promise<ProductRow | undefined> {
  const [row] = await db<ProductRow[]>`SELECT * FROM products WHERE id = ${id}`
  return row
}

export async function insertProduct(db: Sql | TransactionSql, product: ProductWrite): Promise<ProductRow> {
  const [row] = await db<ProductRow[]>`INSERT INTO products ${db(product)} RETURNING *`
  return row!
}

export async function updateProduct(db: TransactionSql, id: number, changes: Partial<ProductWrite>): Promise<ProductRow> {
  const [row] = await db<ProductRow[]>`
    UPDATE products SET ${db(changes, Object.keys(changes) as Array<keyof ProductWrite>)}, version = version + 1,
        -- now() is the start of the transaction, which may predate the previous write if we waited on its lock.
        updated_at = greatest(clock_timestamp(), updated_at + interval '1 millisecond')
    WHERE id = ${id} RETURNING *`
  return row!
}

export async function deleteProduct(db: TransactionSql, id: number): Promise<void> {
  await db`DELETE FROM products WHERE id = ${id}`
}
