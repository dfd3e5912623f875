import type { Sql, TransactionSql } from 'postgres'

/** Where statements run: the pool, or a transaction a caller holds (a batch's, src/core/http/batch.ts). */
export type Db = Sql | TransactionSql

/**
 * Runs `work` in a transaction: its own on the pool, or a savepoint of the
 * transaction `db` is, so that work written for a request alone keeps its
 * meaning inside a batch (what it undoes on failure is its own part only; the
 * batch then decides about the rest).
 */
export function transaction<T>(db: Db, work: (tx: TransactionSql) => Promise<T>): Promise<T> {
  return ('savepoint' in db ? db.savepoint(work) : db.begin(work)) as Promise<T>
}
