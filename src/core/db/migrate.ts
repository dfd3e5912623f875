import { createHash } from 'node:crypto'
import { readdir, readFile } from 'node:fs/promises'
import type { Sql, TransactionSql } from 'postgres'

// Schema changes are the numbered files in sql/, applied in order, each once,
// in one transaction, under an advisory lock so that instances starting
// together take turns. Each file's SHA-256 is recorded: a file edited after it
// was applied stops start-up, because the database no longer matches the
// source and nobody should guess which is right.

const SQL_DIR = new URL('../../../sql/', import.meta.url)
// An arbitrary constant shared by every instance of this service.
export const MIGRATION_LOCK = 4_711_000_002

export class MigrationError extends Error {}

interface MigrationFile {
  version: number
  name: string
  checksum: string
  text: string
}

export async function loadMigrations(dir: URL = SQL_DIR): Promise<MigrationFile[]> {
  const names = (await readdir(dir)).filter((n) => n.endsWith('.sql')).sort()
  const files: MigrationFile[] = []
  for (const name of names) {
    const m = /^([0-9]{3,})_[a-z0-9_]+\.sql$/.exec(name)
    if (!m) throw new MigrationError(`sql/${name}: migration files are named NNN_words.sql`)
    const text = await readFile(new URL(name, dir), 'utf8')
    const version = Number(m[1])
    if (files.some((f) => f.version === version))
      throw new MigrationError(`sql/${name}: version ${version} is used twice`)
    files.push({ version, name, text, checksum: createHash('sha256').update(text).digest('hex') })
  }
  return files
}

/** PostgreSQL's insufficient_privilege: the connection's role may not do what a statement asks. */
const INSUFFICIENT_PRIVILEGE = '42501'

/**
 * Applies pending migrations; returns the names applied. A role that may
 * only read and write the tables (deploy/postgres/runtime-role.psql) passes
 * when nothing is pending; with something pending it gets a MigrationError
 * naming the migration and the connection to use, not the driver's error.
 */
export async function migrate(sql: Sql, dir?: URL): Promise<string[]> {
  const files = await loadMigrations(dir)
  return sql.begin(async (tx) => {
    await tx`SELECT pg_advisory_xact_lock(${MIGRATION_LOCK})`
    // Looked up, not CREATE TABLE IF NOT EXISTS: that needs CREATE on the schema even when the table is there.
    const [{ role, exists }] = await tx<
      [{ role: string; exists: boolean }]
    >`SELECT current_user AS role, to_regclass('schema_migrations') IS NOT NULL AS exists`
    let pending = files
    /** A refusal of the role's becomes what to do about it; any other error stays as it is. */
    const refused =
      (explain: (reason: string) => string) =>
      (err: unknown): never => {
        if ((err as { code?: string }).code !== INSUFFICIENT_PRIVILEGE) throw err
        throw new MigrationError(explain((err as Error).message))
      }
    const cannotChange = refused((reason) => cannotMigrate(role, pending, reason))
    if (exists) {
      const applied = new Map<number, { name: string; checksum: string }>()
      const rows = await tx<
        Array<{ version: number; name: string; checksum: string }>
      >`SELECT version, name, checksum FROM schema_migrations`.catch(
        refused(
          (reason) =>
            `Role "${role}" may not read schema_migrations ` +
            `(${reason}): grant it what deploy/postgres/runtime-role.psql grants, or connect as the schema's owner.`,
        ),
      )
      for (const row of rows) applied.set(row.version, row)
      for (const [version, row] of applied) {
        const file = files.find((f) => f.version === version)
        if (!file)
          throw new MigrationError(
            `The database has migration ${row.name}, which is not in sql/: is this an older build?`,
          )
        if (file.checksum !== row.checksum) {
          throw new MigrationError(
            `sql/${file.name} was edited after it was applied (checksum differs). Restore it and put the change in a ` +
              `new numbered file.`,
          )
        }
      }
      pending = files.filter((f) => !applied.has(f.version))
    } else {
      await tx`
        CREATE TABLE schema_migrations (
          version    integer PRIMARY KEY,
          name       text NOT NULL,
          checksum   text NOT NULL,
          applied_at timestamptz NOT NULL DEFAULT now()
        )`.catch(cannotChange)
    }
    for (const file of pending) {
      // Our own files, never client input: the one place unsafe() is right.
      await tx.unsafe(file.text).catch(cannotChange)
      await tx`INSERT INTO schema_migrations (version, name, checksum) VALUES
        (${file.version}, ${file.name}, ${file.checksum})`
    }
    if (!exists || pending.length > 0) await sealLedger(tx)
    return pending.map((f) => f.name)
  })
}

/**
 * Leaves the writing of schema_migrations to its owner. The owner's default
 * privileges (deploy/postgres/runtime-role.psql) give the runtime role every
 * table the owner creates, this one included, and a role that may write the
 * ledger could mark a future migration applied, so that it never runs. Every
 * other role keeps what it may read. Run when this run wrote the ledger, as
 * its owner (or a superuser): a release's migrations also seal a ledger
 * granted before this rule.
 */
async function sealLedger(tx: TransactionSql): Promise<void> {
  await tx`
    DO $$
    DECLARE
      grantee text;
    BEGIN
      IF NOT pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = 'schema_migrations'::regclass),
        'USAGE') THEN
        RETURN;
      END IF;
      FOR grantee IN
        SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.oid = 'schema_migrations'::regclass AND a.grantee <> c.relowner
          AND a.privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER')
      LOOP
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON schema_migrations FROM %s',
          grantee);
      END LOOP;
    END
    $$`
}

/** Why a role that may not change the schema cannot start the service, and what to do. */
function cannotMigrate(role: string, pending: MigrationFile[], reason: string): string {
  const [first] = pending
  const which = !first
    ? 'schema_migrations is missing'
    : pending.length > 1
      ? `sql/${first.name} and ${pending.length - 1} more are pending`
      : `sql/${first.name} is pending`
  return (
    `${which}, and role "${role}" may not change the schema (${reason}). ` +
    "Set DATABASE_MIGRATION_URL to a connection as the schema's owner (migrations run there, the service as " +
    "DATABASE_URL's role), " +
    'or run `node dist/main.js migrate` once with it set.'
  )
}
