import Type, { type Static } from 'typebox'
import { NameSchema, readOnlyEcho } from '../resources/common.js'

const Email = Type.String({
  maxLength: 254,
  // local@domain with a dot in the domain; ASCII only (no internationalized addresses).
  pattern: "^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$",
  description: 'an e-mail address (local@domain, with a dot in the domain)',
})
const Role = Type.Union([Type.Literal('admin'), Type.Literal('user')])
const Password = Type.String({ minLength: 8, maxLength: 256, description: 'a password of 8 to 256 characters' })
/** Not a member of the user: the proof a user gives when changing its own e-mail or password. */
const CurrentPassword = Type.Optional(Type.String({ minLength: 1, maxLength: 256, description: 'the current password; required to change one\'s own e-mail or password' }))

export const UserCreate = Type.Object(
  { name: NameSchema, email: Email, role: Type.Optional(Role), password: Type.Optional(Password) },
  { additionalProperties: false },
)
export type UserCreate = Static<typeof UserCreate>

/** PUT: name and email are replaced; role and password, access attributes, stay unless given. */
export const UserReplace = Type.Object(
  { name: NameSchema, email: Email, role: Type.Optional(Role), password: Type.Optional(Password), current_password: CurrentPassword, ...readOnlyEcho },
  { additionalProperties: false },
)
export type UserReplace = Static<typeof UserReplace>

/** PATCH (RFC 7396): members present are set; `password: null` removes the password (no password login). */
export const UserPatch = Type.Object(
  {
    name: Type.Optional(NameSchema),
    email: Type.Optional(Email),
    role: Type.Optional(Role),
    password: Type.Optional(Type.Union([Password, Type.Null()])),
    current_password: CurrentPassword,
    ...readOnlyEcho,
  },
  { additionalProperties: false },
)
export type UserPatch = Static<typeof UserPatch>

/** A user as the API returns it (never a password or its hash). */
export const User = Type.Object({
  id: Type.Integer({ minimum: 1 }),
  name: Type.String(),
  email: Type.String(),
  role: Role,
  created_at: Type.String({ format: 'date-time' }),
  updated_at: Type.String({ format: 'date-time' }),
}, { additionalProperties: false })
/** A page of a list: `fields` may leave members out. */
export const UserPage = Type.Array(Type.Partial(User))
