import type { TSchema } from 'typebox'

// A member of a resource is its JSON Schema (what a client may send) plus
// traits: how it is stored, written, listed and shown. The traits ride on the
// schema under a symbol, so the declaration stays one TypeBox object and the
// OpenAPI document (JSON) never sees them.

export interface MemberTraits {
  /**
   * Who writes it: 'server' (read-only: ids, timestamps), 'create' (set once,
   * at creation), 'client' (create, replace and patch). Default 'client'.
   */
  write?: 'server' | 'create' | 'client'
  /** Left out of a create or replace body, it takes this value. */
  default?: string | number | boolean | null
  /** May be left out of a create body without a default: stored as NULL (or by a hook). */
  optional?: boolean
  /** Left out of a PUT body, it keeps its stored value (access attributes such as a user's role). */
  keepOnReplace?: boolean
  /** A merge patch may send null: the member goes back to its default, or to NULL without one. */
  nullable?: boolean
  /** Sortable, and filterable with every operator; the table has an index (member, id) for it. */
  sort?: boolean
  /** `q` searches it as a case-insensitive substring. */
  search?: boolean
  /** Equality filters ignore case (e-mail addresses); served by a lower(column) index. */
  caseless?: boolean
  /** Never part of a representation (a password, a key's hash). */
  secret?: boolean
  /** Accepted in bodies but not a column: a hook stores it (a password is stored as its hash). */
  virtual?: boolean
  /**
   * A unique constraint on it (its name in the migration), and the problem a
   * client gets for a duplicate: a 409 with this code and title.
   */
  unique?: { constraint: string; code: string; title: string }
}

const TRAITS = Symbol('member traits')

/** Attaches traits to a schema; give it a schema of its own (the traits live on the object). */
export function member<S extends TSchema>(schema: S, traits: MemberTraits = {}): S {
  if ((schema as Record<symbol, unknown>)[TRAITS])
    throw new Error('member(): this schema is already a member; build one per member')
  return Object.assign(schema, { [TRAITS]: traits })
}

export const traitsOf = (schema: TSchema): MemberTraits =>
  (schema as Record<symbol, MemberTraits | undefined>)[TRAITS] ?? {}
