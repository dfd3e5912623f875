import type { TransactionSql } from 'postgres'
import Type from 'typebox'
import { idMember, nameSchema, timestampMember } from '../../core/resources/common.js'
import { member } from '../../core/resources/member.js'
import { defineResource } from '../../core/resources/resource.js'
import { deleteRowsWhere } from '../../core/resources/store.js'
import { freshProofMembers } from '../current-password.js'
import type { EventOrigin } from '../origin.js'

// API keys as stored: the table's declaration, and their revocation with a
// user's other credentials (a logout everywhere, a password reset, the user's
// deletion). Auth owns both, as it owns the sessions table; the routes over
// the table, and who may create a key, are the api-keys
// module's (src/api-keys/resource.ts).

const nullableTimestamp = () =>
  Type.Union([Type.String({ format: 'date-time', description: 'an RFC 3339 timestamp in the future' }), Type.Null()])

export const apiKeys = defineResource({
  name: 'ApiKey',
  path: '/api-keys',
  table: 'api_keys',
  // Everyone keeps their own keys; the hooks below scope them to their owner.
  access: { read: 'any', write: 'any' },
  versioned: false,
  // Only the key's hash is stored, the key itself shown once; a key made on the strength of a recent login names the
  // session it ends with (sql/016).
  serverColumns: ['key_hash', 'session_id'],
  deletedVerb: 'revoked',
  members: {
    id: idMember(),
    name: member(nameSchema(), { write: 'create', sort: true, search: true }),
    prefix: member(Type.String(), { write: 'server' }),
    // A bound on hostile input, above any number of scopes the resources declare; which scopes a key may
    // hold is the creator's (the create hook), not the schema's.
    scopes: member(Type.Array(Type.String({ maxLength: 64 }), { minItems: 1, maxItems: 64, uniqueItems: true }), {
      write: 'create',
    }),
    created_at: timestampMember(),
    expires_at: member(nullableTimestamp(), { write: 'create', optional: true }),
    last_used_at: member(nullableTimestamp(), { write: 'server' }),
    user_id: member(Type.Integer({ minimum: 1, maximum: 9223372036854775807 }), { write: 'server', sort: true }),
  },
  createExtras: freshProofMembers("the creator's", ' (the key then ends with that session)'),
})

/**
 * Revokes every API key of a user in the caller's transaction, each with its
 * api_key.revoked event; the trigger of sql/004 tells every instance's key
 * cache at commit (the caller waits with credentialChanges.caughtUp).
 */
export function revokeApiKeysOf(tx: TransactionSql, userId: number, origin: EventOrigin): Promise<number> {
  return deleteRowsWhere(tx, apiKeys, { user_id: String(userId) }, origin)
}
