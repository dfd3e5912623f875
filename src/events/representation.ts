import type { Resource } from '../core/resources/resource.js'
import { quoteIdentifier } from '../core/db/identifier.js'

// A resource's representation built in SQL, for the event written in the
// same statement as the change (src/core/resources/store.ts): the same members in
// the same order as the API shows them, timestamps in the API's text
// (api_time, sql/007). Made from the declaration only, into the text of a
// statement that store.ts makes once and keeps; test/events.test.ts holds it
// to what GET answers.

/** `json_build_object(...)` of the representation of the row named `row` in the statement. */
export function representationSql(resource: Resource): string {
  const parts = resource.outputMembers.map((m) => {
    const column = `row.${quoteIdentifier(m)}`
    return `'${m}', ${resource.timestampMembers.has(m) ? `api_time(${column})` : column}`
  })
  return `json_build_object(${parts.join(', ')})`
}
