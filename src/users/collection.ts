import { defineCollection } from '../collections/declaration.js'

const BIGINT_MAX = 9223372036854775807

export const usersCollection = defineCollection({
  table: 'users',
  path: '/users',
  members: {
    id: { type: 'integer', minimum: 1, maximum: BIGINT_MAX },
    name: { type: 'text' },
    email: { type: 'email' },
    role: { type: 'enum', values: ['admin', 'user'] },
    created_at: { type: 'timestamp' },
    updated_at: { type: 'timestamp' },
  },
  searchColumns: ['name', 'email'],
  outputMembers: ['id', 'name', 'email', 'role', 'created_at', 'updated_at'],
})
