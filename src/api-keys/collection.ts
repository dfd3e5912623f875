import { defineCollection } from '../collections/declaration.js'

export const apiKeysCollection = defineCollection({
  table: 'api_keys',
  path: '/api-keys',
  members: {
    id: { type: 'integer', minimum: 1, maximum: 9223372036854775807 },
    user_id: { type: 'integer', minimum: 1, maximum: 9223372036854775807 },
    name: { type: 'text' },
    created_at: { type: 'timestamp' },
  },
  searchColumns: ['name'],
  outputMembers: ['id', 'name', 'prefix', 'scopes', 'created_at', 'expires_at', 'last_used_at', 'user_id'],
})
