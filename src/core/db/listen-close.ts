import type { Sql } from 'postgres'

/**
 * Calls `onClose` whenever the connection of `sql.listen` closes, which
 * postgres.js does not tell. postgres.js 3.4 keeps that connection in a
 * postgres instance of its own, `listen.sql` (a property of the `sql.listen`
 * function, there once `listen` was first called: it creates it before its
 * first await), whose `options.onclose` it calls on every close and then
 * listens again. Undocumented, hence the checks: false when the shape is not
 * the one expected, and the caller cannot tell a dropped connection.
 */
export function watchListenClose(sql: Sql, onClose: () => void): boolean {
  const instance = (sql.listen as unknown as { sql?: { options?: { onclose?: unknown } } }).sql
  const options = instance?.options
  const original = options?.onclose
  if (!options || typeof original !== 'function') return false
  options.onclose = (...args: unknown[]) => {
    onClose()
    return (original as (...a: unknown[]) => unknown)(...args)
  }
  return true
}
