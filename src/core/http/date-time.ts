import { IsDateTime } from 'typebox/format'

/**
 * What `format: 'date-time'` accepts in this API: an RFC 3339 date-time
 * (TypeBox's own check) that is also an instant the service can hold: one
 * that Date reads (so no leap second `:60` and no RFC 9557 `[zone]` suffix)
 * in the years 0001 to 9999 once in UTC, as PostgreSQL stores a timestamp
 * and the API writes it back (`0000-…`, or `9999-12-31T23:59:59-23:59`,
 * which is year 10000 in UTC, would be refused by the database or written
 * in another form). A value outside is a client's error, answered as any
 * other invalid value, not a failure of the conversion after validation.
 */
export function isApiDateTime(value: string): boolean {
  if (!IsDateTime(value)) return false
  const ms = Date.parse(value)
  return ms >= FIRST_INSTANT && ms <= LAST_INSTANT
}

const FIRST_INSTANT = Date.parse('0001-01-01T00:00:00.000Z')
const LAST_INSTANT = Date.parse('9999-12-31T23:59:59.999Z')
