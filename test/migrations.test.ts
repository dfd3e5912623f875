import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { appendFile, cp, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { after, describe, test } from 'node:test'
import type { Sql } from 'postgres'
import { connect } from '../src/core/db/connect.js'
import { loadMigrations, migrate, MigrationError } from '../src/core/db/migrate.js'
import { createTestDatabase } from './helpers/server.js'

// migrate() against real databases: a copy of the run's migrated template,
// and fresh empty databases for the first run and for concurrent runs. Edited
// and new files are tried in copies of sql/ in the temp folder.

const SQL_DIR = new URL('../sql/', import.meta.url)
const pools: Sql[] = []
const tempDirs: string[] = []

const pool = (url: string, max = 1) => {
  const sql = connect(url, { max, statementTimeoutMs: 60_000 })
  pools.push(sql)
  return sql
}

/** A copy of sql/ in the temp folder, as the file URL migrate() takes (ending with '/'). */
async function copyOfSqlDir(): Promise<{ path: string; url: URL }> {
  const path = await mkdtemp(join(tmpdir(), 'upa-migrations-'))
  tempDirs.push(path)
  await cp(SQL_DIR, path, { recursive: true })
  return { path, url: pathToFileURL(path + '/') }
}

const sha256 = (text: string) => createHash('sha256').update(text).digest('hex')

type Applied = { version: number; name: string; checksum: string }
// postgres.js answers with a Result, an Array subclass: spread for deepEqual against plain arrays.
const rows = async <T>(query: Promise<T[]>): Promise<T[]> => [...(await query)]
const appliedRows = (sql: Sql) =>
  rows(sql<Applied[]>`SELECT version, name, checksum FROM schema_migrations ORDER BY version`)

after(async () => {
  await Promise.all(pools.map((p) => p.end({ timeout: 5 })))
  await Promise.all(tempDirs.map((d) => rm(d, { recursive: true, force: true })))
})

describe('an already migrated database', () => {
  test('records every file of sql/ with its SHA-256', async () => {
    const sql = pool(await createTestDatabase())
    const files = await loadMigrations()
    assert.ok(files.length >= 1)
    assert.deepEqual(
      await appliedRows(sql),
      files.map((f) => ({ version: f.version, name: f.name, checksum: sha256(f.text) })),
    )
  })

  test('migrating again applies nothing and changes nothing', async () => {
    const sql = pool(await createTestDatabase())
    const before = await sql`SELECT version, applied_at FROM schema_migrations ORDER BY version`
    assert.deepEqual(await migrate(sql), [])
    assert.deepEqual(await migrate(sql), [])
    assert.deepEqual(await sql`SELECT version, applied_at FROM schema_migrations ORDER BY version`, before)
  })

  test('refuses a sql/ whose applied file was edited, naming the file, and applies nothing else', async () => {
    const sql = pool(await createTestDatabase())
    const dir = await copyOfSqlDir()
    const [first] = (await readdir(dir.path)).filter((n) => n.endsWith('.sql')).sort()
    await appendFile(join(dir.path, first!), '\n-- an innocent-looking edit\n')
    await writeFile(join(dir.path, '900_would_be_next.sql'), 'CREATE TABLE must_not_exist (id int);\n')
    const before = await appliedRows(sql)
    await assert.rejects(migrate(sql, dir.url), (err: unknown) => {
      assert.ok(err instanceof MigrationError, `expected a MigrationError, got ${String(err)}`)
      assert.ok(err.message.includes(first!), `the message does not name ${first}: ${err.message}`)
      assert.match(err.message, /edited/)
      return true
    })
    assert.deepEqual(await appliedRows(sql), before)
    assert.equal((await sql`SELECT to_regclass('must_not_exist') AS t`)[0]!.t, null)
  })

  test('refuses a sql/ that lacks a file the database has applied', async () => {
    const sql = pool(await createTestDatabase())
    const dir = await copyOfSqlDir()
    for (const name of await readdir(dir.path)) await rm(join(dir.path, name))
    await assert.rejects(
      migrate(sql, dir.url),
      (err: unknown) => err instanceof MigrationError && /001_/.test(err.message) && /not in sql/.test(err.message),
    )
  })

  test('applies a new file once and records it with its checksum', async () => {
    const sql = pool(await createTestDatabase())
    const dir = await copyOfSqlDir()
    const text = 'CREATE TABLE migration_probe (id int PRIMARY KEY);\nINSERT INTO migration_probe VALUES (1);\n'
    await writeFile(join(dir.path, '900_x.sql'), text)

    assert.deepEqual(await migrate(sql, dir.url), ['900_x.sql'])
    assert.deepEqual(await migrate(sql, dir.url), [])
    assert.deepEqual(await migrate(sql, dir.url), [])

    const applied = await appliedRows(sql)
    assert.deepEqual(applied.at(-1), { version: 900, name: '900_x.sql', checksum: sha256(text) })
    assert.equal(applied.filter((r) => r.version === 2).length, 1)
    // Ran exactly once: a second run would have failed on the primary key or doubled the row.
    assert.deepEqual(await rows(sql`SELECT id FROM migration_probe`), [{ id: 1 }])
  })

  test('rolls back a failing new file entirely: neither its changes nor its record remain', async () => {
    const sql = pool(await createTestDatabase())
    const dir = await copyOfSqlDir()
    await writeFile(join(dir.path, '900_half.sql'), 'CREATE TABLE half_done (id int);\nSELECT * FROM no_such_table;\n')
    await assert.rejects(migrate(sql, dir.url), /no_such_table/)
    assert.equal((await sql`SELECT to_regclass('half_done') AS t`)[0]!.t, null)
    assert.deepEqual(
      (await appliedRows(sql)).map((r) => r.version),
      (await loadMigrations()).map((f) => f.version),
    )
  })
})

describe('file names', () => {
  for (const [what, name, message] of [
    ['without a number', 'users.sql', /^sql\/users\.sql: .*NNN_words\.sql/],
    ['with upper case', '002_Users.sql', /^sql\/002_Users\.sql: .*NNN_words\.sql/],
    ['with a two-digit number', '02_x.sql', /^sql\/02_x\.sql: .*NNN_words\.sql/],
    // Files are read in name order, so the second of the pair is the one named.
    ['reusing a version', '001_again.sql', /^sql\/001_users_products\.sql: version 1 is used twice/],
  ] as const) {
    test(`refuses a migration file ${what} (${name}) before touching the database`, async () => {
      const dir = await copyOfSqlDir()
      await writeFile(join(dir.path, name), 'SELECT 1;\n')
      await assert.rejects(loadMigrations(dir.url), (err: unknown) => {
        assert.ok(err instanceof MigrationError, String(err))
        assert.match(err.message, message)
        return true
      })
    })
  }

  test('ignores files that are not .sql', async () => {
    const dir = await copyOfSqlDir()
    await writeFile(join(dir.path, 'README.md'), 'notes\n')
    assert.deepEqual(
      (await loadMigrations(dir.url)).map((f) => f.name),
      (await loadMigrations()).map((f) => f.name),
    )
  })
})

describe('an empty database', () => {
  test('a first migrate() creates the schema and reports the files applied', async () => {
    const sql = pool(await createTestDatabase({ empty: true }))
    const names = (await loadMigrations()).map((f) => f.name)
    assert.deepEqual(await migrate(sql), names)
    assert.deepEqual(
      (await appliedRows(sql)).map((r) => r.name),
      names,
    )
    assert.notEqual((await sql`SELECT to_regclass('users') AS t`)[0]!.t, null)
  })

  test('several concurrent migrate() calls all succeed and apply each file exactly once', async () => {
    const url = await createTestDatabase({ empty: true })
    const dir = await copyOfSqlDir()
    await writeFile(
      join(dir.path, '900_x.sql'),
      'CREATE TABLE concurrency_probe (id int);\nINSERT INTO concurrency_probe VALUES (1);\n',
    )
    // One pool per caller, as separate instances starting together would have.
    const callers = Array.from({ length: 5 }, () => pool(url))
    const results = await Promise.all(callers.map((sql) => migrate(sql, dir.url)))

    const applied = results.flat().sort()
    assert.deepEqual(
      applied,
      [...(await loadMigrations()).map((f) => f.name), '900_x.sql'].sort(),
      'each file reported applied by exactly one caller',
    )
    assert.equal(
      results.filter((r) => r.length > 0).length,
      1,
      'one caller applied everything, the others found nothing to do',
    )
    assert.deepEqual(
      (await appliedRows(callers[0]!)).map((r) => r.version),
      [...(await loadMigrations()).map((f) => f.version), 900],
    )
    assert.deepEqual(await rows(callers[0]!`SELECT id FROM concurrency_probe`), [{ id: 1 }])
  })
})
