import { createHash, randomBytes } from 'node:crypto'
import type { Sql } from 'postgres'
import { connect } from '../src/core/db/connect.js'
import { migrate } from '../src/core/db/migrate.js'

// Benchmark databases: `upa_bench_<rows>` on the server of DATABASE_URL (or
// the local cluster), never the development database. Created fresh, migrated
// with the service's own migrations, seeded set-wise with generate_series, and
// dropped when the benchmark ends.

export const benchDatabaseName = (rows: number) => `upa_bench_${rows}`

/** The URL of database `name` on the server of `serverUrl` (query parameters such as host= kept). */
export function databaseUrl(serverUrl: string, name: string): string {
  const url = new URL(serverUrl)
  url.pathname = `/${name}`
  return url.toString()
}

export interface Seeded {
  name: string
  url: string
  rows: number
  /** The API key the benchmark sends in X-API-Key (user 1, scope products:read). */
  apiKey: string
  seconds: number
}

/**
 * Creates `upa_bench_<rows>` (dropping a leftover of an earlier run first),
 * migrates it and fills it: `rows` users (id 1 is an admin) and `rows`
 * products. Secondary indexes are dropped during the load and rebuilt after
 * it, which is several times faster than maintaining them row by row.
 */
export async function createBenchDatabase(admin: Sql, serverUrl: string, rows: number): Promise<Seeded> {
  const started = performance.now()
  const name = benchDatabaseName(rows)
  await admin`DROP DATABASE IF EXISTS ${admin(name)} WITH (FORCE)`
  await admin`CREATE DATABASE ${admin(name)}`
  const url = databaseUrl(serverUrl, name)
  const db = connect(url, { max: 1, statementTimeoutMs: 30 * 60_000 })
  try {
    await migrate(db)
    await db`SET maintenance_work_mem = '256MB'`
    await db`SET synchronous_commit = off`
    const indexes = await db<Array<{ indexname: string; indexdef: string }>>`
      SELECT i.indexname, i.indexdef FROM pg_indexes i
      WHERE i.schemaname = 'public' AND i.tablename IN ('users', 'products')
        AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)`
    for (const { indexname } of indexes) await db`DROP INDEX ${db(indexname)}`

    // Timestamps one second apart, so that created_at sorts are realistic and distinct.
    await db`
      INSERT INTO users (name, email, role, created_at, updated_at)
      SELECT 'Bench User ' || g, 'user' || g || '@bench.example.com', CASE WHEN g = 1 THEN 'admin' ELSE 'user' END,
             t, t
      FROM generate_series(1, ${rows}::int) g, LATERAL (SELECT timestamptz '2025-01-01 00:00:00Z' + g * interval
        '1 second' AS t) ts`
    await db`
      INSERT INTO products (sku, name, description, price, currency, stock, created_at, updated_at)
      SELECT 'SKU-' || lpad(g::text, 8, '0'), 'Bench Product ' || g,
             'A product of the benchmark catalogue, number ' || g || '.',
             (g::bigint * 7919) % 1000000, (ARRAY['EUR', 'USD', 'GBP', 'JPY'])[1 + g % 4], g % 1000, t, t
      FROM generate_series(1, ${rows}::int) g, LATERAL (SELECT timestamptz '2025-01-01 00:00:00Z' + g * interval
        '1 second' AS t) ts`
    for (const { indexdef } of indexes) await db.unsafe(indexdef)

    const apiKey = 'upa_ak_' + randomBytes(32).toString('base64url')
    const keyHash = createHash('sha256').update(apiKey).digest()
    await db`
      INSERT INTO api_keys (user_id, name, prefix, key_hash, scopes)
      VALUES (1, 'benchmark', ${apiKey.slice(0, 13)}, ${keyHash}, ${['products:read']})`
    await db`VACUUM ANALYZE`
    return { name, url, rows, apiKey, seconds: (performance.now() - started) / 1000 }
  } finally {
    await db.end({ timeout: 5 })
  }
}

/**
 * Puts the tables back to `rows` rows after a run of POST /users, so that
 * every round (and the growth series) sees the same table. Deleting a user
 * records a revocation (sql/005_revocations.sql) that every instance loads
 * at start-up: those go too, or each round's fresh services would start with
 * tens of thousands more in memory than the round before.
 */
export async function removeCreatedUsers(url: string, rows: number): Promise<number> {
  const db = connect(url, { max: 1, statementTimeoutMs: 10 * 60_000 })
  try {
    // One transaction: a running server reloads its revocations when the deletion is announced (at commit), and must
    // find none.
    const deleted = await db.begin(async (tx) => {
      const users = await tx`DELETE FROM users WHERE id > ${rows}`
      await tx`DELETE FROM revocations WHERE user_id > ${rows}`
      return users.count
    })
    // The events of those writes too (sql/007): each round starts with the same, empty, log.
    await db`TRUNCATE event_outbox, events, webhook_deliveries, webhook_attempts`
    if (deleted) await db`VACUUM ANALYZE users, revocations`
    return deleted
  } finally {
    await db.end({ timeout: 5 })
  }
}

/**
 * Puts the products back to `rows` rows after a run of POST /products or
 * POST /batch, and empties the event log their events went to, so that every
 * round and server sees the same table.
 */
export async function removeCreatedProducts(url: string, rows: number): Promise<number> {
  const db = connect(url, { max: 1, statementTimeoutMs: 10 * 60_000 })
  try {
    const deleted = await db`DELETE FROM products WHERE id > ${rows}`
    await db`TRUNCATE event_outbox, events, webhook_deliveries, webhook_attempts`
    if (deleted.count) await db`VACUUM ANALYZE products`
    return deleted.count
  } finally {
    await db.end({ timeout: 5 })
  }
}

/**
 * Sets every product's version back to 1, as seeded, before a run of
 * PATCH /products/{id}: bench/wrk.lua sends If-Match tags counted from 1.
 */
export async function resetProductVersions(url: string): Promise<number> {
  const db = connect(url, { max: 1, statementTimeoutMs: 10 * 60_000 })
  try {
    const reset = await db`UPDATE products SET version = 1 WHERE version <> 1`
    await db`TRUNCATE event_outbox, events, webhook_deliveries, webhook_attempts`
    if (reset.count) await db`VACUUM ANALYZE products`
    return reset.count
  } finally {
    await db.end({ timeout: 5 })
  }
}

/**
 * Turns the events outbox (sql/007) off or on for the services on this
 * database, to measure what it costs a write: off, a trigger discards each
 * event row as it is inserted into the outbox, so a write does everything
 * else it does (the same statements, the data built) but stores no event,
 * and the publisher has nothing to publish.
 */
export async function setOutbox(url: string, on: boolean): Promise<void> {
  const db = connect(url, { max: 1, statementTimeoutMs: 60_000 })
  try {
    await db.unsafe(
      `CREATE OR REPLACE FUNCTION bench_discard_event() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; ` +
        `END $$`,
    )
    await db.unsafe('DROP TRIGGER IF EXISTS bench_outbox_off ON event_outbox')
    if (!on)
      await db.unsafe(
        'CREATE TRIGGER bench_outbox_off BEFORE INSERT ON event_outbox FOR EACH ROW EXECUTE FUNCTION ' +
          'bench_discard_event()',
      )
  } finally {
    await db.end({ timeout: 5 })
  }
}

/**
 * The process ids of the PostgreSQL backends connected to the benchmark database, those of one application_name only
 * when given.
 */
export async function backendPids(admin: Sql, db: Seeded, appName?: string): Promise<number[]> {
  const ofApp = appName === undefined ? admin`` : admin`AND application_name = ${appName}`
  const rows = await admin<Array<{ pid: number }>>`SELECT pid FROM pg_stat_activity WHERE datname = ${db.name} ${ofApp}`
  return rows.map((r) => r.pid)
}

export async function dropBenchDatabase(admin: Sql, name: string): Promise<void> {
  await admin`DROP DATABASE IF EXISTS ${admin(name)} WITH (FORCE)`
}
