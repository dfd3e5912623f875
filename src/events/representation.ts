import type { Resource } from '../core/resources/resource.js'
import { quoteIdentifier } from '../core/db/identifier.js'

// A resource's representation built in SQL, for the event written in the
// same statement as the change (src/core/resources/store.ts): the same members in
// the same order as the API shows them, timestamps in the API's text
// (api_time, sql/007). Made from the declaration only, once per resource;
// test/events.test.ts holds it to what GET answers.

const built = new WeakMap<Resource, string>()

/** `json_build_object(...)` of the representation of the row named `row` in the statement. */
export function representationSql(resource: Resource): string {
  let text = built.get(resource)
  if (text === undefined) {
    const parts = resource.outputMembers.map((m) => {
      const column = `row.${quoteIdentifier(m)}`
      return `'${m}', ${resource.timestampMembers.has(m) ? `api_time(${column})` : column}`
    })
    text = `json_build_object(${parts.join(', ')})`
    built.set(resource, text)
  }
  return text
}
