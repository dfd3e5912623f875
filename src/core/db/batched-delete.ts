import type { PendingQuery, Row, Sql } from 'postgres'

// Purges of old rows: a bounded number of bounded DELETEs, so that a purge
// never holds many row locks at once nor runs for long, whatever piled up.

const BATCH = 1000
const MAX_BATCHES = 10

/** Deletes the rows of `table` (a name from the code, never from input) that `where` selects, a batch at a time; returns how many. */
export async function deleteInBatches(sql: Sql, table: string, where: PendingQuery<Row[]>): Promise<number> {
  let deleted = 0
  for (let batch = 0; batch < MAX_BATCHES; batch++) {
    const { count } = await sql`DELETE FROM ${sql(table)} WHERE ctid IN (SELECT ctid FROM ${sql(table)} WHERE ${where} LIMIT ${BATCH})`
    deleted += count
    if (count < BATCH) break
  }
  return deleted
}
