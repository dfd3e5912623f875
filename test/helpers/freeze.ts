import assert from 'node:assert/strict'
import { readFile } from 'node:fs/promises'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Sql } from 'postgres'
import { MAIL_CHANNEL } from '../../src/mail/worker.js'
import { DELIVERIES_CHANNEL } from '../../src/webhooks/wake.js'
import { startServer, type TestServer } from './server.js'

/**
 * Freezes (SIGSTOP) one PostgreSQL backend, as a server that stops answering
 * one connection, and gives back the function that thaws it; undefined when
 * the server is not a process of this machine or cannot be signalled.
 *
 * A backend is only left frozen while it waits for its client (wait event
 * ClientRead). Stopped anywhere else it may hold a lock the whole cluster
 * needs (a listener reading the notification queue holds NotifyQueueLock,
 * which every committing NOTIFY waits for, uninterruptibly): every other test
 * using the cluster would hang until it thaws.
 */
export async function freezeBackend(sql: Sql, pid: number): Promise<(() => void) | undefined> {
  const [{ local }] = await sql<
    [{ local: boolean }]
  >`SELECT inet_server_addr() IS NULL OR inet_server_addr() = '127.0.0.1' AS local`
  // Only a backend of a server on this machine, and only if it is one (not a process that reused the number).
  const command = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '')
  if (!local || !command.startsWith('postgres')) return undefined
  const thaw = () => void process.kill(pid, 'SIGCONT')
  for (let attempt = 0; attempt < 200; attempt++) {
    try {
      process.kill(pid, 'SIGSTOP')
    } catch {
      return undefined
    }
    // Its activity entry is frozen with it: what it shows is where it stopped.
    const [state] = await sql<
      Array<{ waiting: boolean }>
    >`SELECT wait_event = 'ClientRead' AS waiting FROM pg_stat_activity WHERE pid = ${pid}`.catch(() => [])
    if (state?.waiting) return thaw
    thaw()
    await sleep(5)
  }
  throw new Error(`backend ${pid} was never caught waiting for its client`)
}

/**
 * The backends of this database listening for credential changes: each
 * instance's listening connection (src/auth/revocation/credential-changes.ts; its event
 * hub shares it), not its webhook or mail worker's, which listen on
 * connections of their own (src/core/db/wakeups.ts) and are no proof of
 * anything about credentials.
 */
export async function credentialListeners(sql: Sql): Promise<number[]> {
  const rows = await sql<Array<{ pid: number }>>`
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND query ILIKE 'listen %'
      AND query NOT ILIKE ${`%${DELIVERIES_CHANNEL}%`} AND query NOT ILIKE ${`%${MAIL_CHANNEL}%`}`
  return rows.map((r) => r.pid)
}

/** Another instance on `on`'s database, and the backend its credential listener uses (the one to freeze). */
export async function instanceAndListener(on: TestServer): Promise<{ instance: TestServer; listener: number }> {
  const before = await credentialListeners(on.sql)
  const instance = await startServer({}, {}, { databaseUrl: on.databaseUrl })
  const [listener] = (await credentialListeners(on.sql)).filter((p) => !before.includes(p))
  assert.ok(listener, 'the new instance listens on a backend of its own')
  return { instance, listener }
}
