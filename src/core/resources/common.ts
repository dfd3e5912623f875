import Type from 'typebox'
import { member } from './member.js'

// Members several resources share. Each is a function: a member's traits
// live on its schema object, so every declaration needs objects of its own.

/** A single-line name: not only white space, no control characters (Unicode Cc). */
export const nameSchema = () =>
  Type.String({
    minLength: 1,
    maxLength: 200,
    // A lookahead for one non-space character plus a single class: linear even
    // when it fails (TypeBox's Errors() runs patterns on over-long strings too,
    // and a pattern that backtracks blocks the event loop).
    pattern: '^(?=[\\s\\S]*[^\\s])[^\\u0000-\\u001f\\u007f-\\u009f]*$',
    description: 'a name of 1 to 200 characters, not only white space, without control characters',
  })

const BIGINT_MAX = 9223372036854775807

/** The identity column (bigint), sortable. */
export const idMember = () => member(Type.Integer({ minimum: 1, maximum: BIGINT_MAX }), { write: 'server', sort: true })

/** A timestamp the database sets (created_at, updated_at), sortable. */
export const timestampMember = () => member(Type.String({ format: 'date-time' }), { write: 'server', sort: true })
