// Who is calling. Authentication turns a credential into a Principal; until a
// credential is presented the caller is anonymous.

export type Role = 'admin' | 'user'

export type Principal =
  | { kind: 'anonymous' }
  | { kind: 'user'; userId: string; role: Role; scopes: ReadonlySet<string> }

export const anonymous: Principal = { kind: 'anonymous' }
