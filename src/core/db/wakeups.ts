import type { Sql } from 'postgres'
import { backgroundConnection } from './connect.js'

// What a background worker of the outbox kind (webhook deliveries, mail)
// shares: a connection of its own listening for the NOTIFY that a commit
// sends when there is new work (and its stop waits for the work under way
// with settledBy, src/core/lib/settled-by.ts). The table is the truth: a
// wake-up lost is only a delay until the worker's next poll.

/**
 * A connection of its own (not `listenSql`'s, which the credential listener
 * watches) that calls `wake` on every notification on `channel`; `cannot`
 * is told once if listening fails (the worker goes on polling). End it to
 * stop listening (no UNLISTEN: sent to a database that stopped answering,
 * it could wait forever).
 */
export function listenForWork(listenSql: Sql, channel: string, wake: () => void, cannot: (err: unknown) => void): Sql {
  const connection = backgroundConnection(listenSql, 1)
  connection.listen(channel, wake).catch(cannot)
  return connection
}
