import type { Sql } from 'postgres'
import type { Component } from '../lifecycle.js'
import { unreachable } from './target.js'

/**
 * The pool, the listening connection and the purges' connection as a
 * component, registered first so that it ends last: everything else uses
 * them while it stops. Stopped whether or not it was started, since the pool
 * may be used before (a service's start-up work). The pool's end ends its
 * own listener too; `listenSql` is ended when it is a connection of its own.
 */
export class DatabaseComponent implements Component {
  readonly name = 'database'

  constructor(
    private readonly sql: Sql,
    private readonly listenSql: Sql,
    private readonly maintenanceSql: Sql,
    /** The pool's URL, to say where it failed (never shown). */
    private readonly url: string,
  ) {}

  /**
   * The pool's first connection: the first request does not pay for connecting, and a database that cannot be reached
   * fails start-up, said as where it tried to go and why (target.ts): this may be the first session on the pool's URL
   * (with DATABASE_POOLER=none and the migrations on another URL, nothing connected there before).
   */
  async start(): Promise<void> {
    await this.sql`SELECT 1`.catch((err: unknown) => {
      throw unreachable(this.url, this.sql, err)
    })
  }

  /** end() destroys the connections once its time-out passes: statements still running then are cut. */
  async stop(deadline: number): Promise<void> {
    const timeout = Math.max(0, deadline - performance.now()) / 1000
    await Promise.all([
      this.sql.end({ timeout }),
      this.listenSql === this.sql ? undefined : this.listenSql.end({ timeout }),
      this.maintenanceSql.end({ timeout }),
    ])
  }
}
