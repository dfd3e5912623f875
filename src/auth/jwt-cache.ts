import { BoundedMap } from '../core/lib/bounded-map.js'
import { DEFAULT_LEEWAY_SECONDS } from './jwt.js'
import type { UserPrincipal } from './principal.js'

// Verifying a JWT (two base64url decodes, JSON.parse, the claim checks, an
// HMAC) and building its Principal is work spent again and again on the same
// few tokens (bench/README.md has the figures). This remembers the outcome
// per exact token text, for one application instance (deps.jwtCache).
//
// - Only a token that passed verifyJwt in full is put in (the caller's job:
//   `set` after verifying). A token that differs by one character is another
//   key and is verified on its own; a refused token is never remembered.
// - Time can make a verified token invalid, through `exp`: checked again on
//   every hit, with the same leeway rule as verifyJwt (refused from exp +
//   leeway on). Revocation can too: the caller checks it on every request,
//   hit or not (src/auth/credentials.ts). `nbf` and `iat` only become
//   more valid as time passes. The keys (JWT_SECRETS), issuer and audience
//   are fixed for the life of an instance.
// - Bounded: inserting beyond `max` drops the oldest entry (a Map iterates in
//   insertion order). 10,000 tokens of a few hundred bytes are a few MB.
//   Only tokens carrying our signature get in, so nobody can fill it with
//   junk; pushing an entry out costs its owner one verification, no more.

interface Entry {
  principal: UserPrincipal
  /** The token's exp claim, seconds since the epoch. */
  exp: number
}

export class JwtCache {
  private readonly entries: BoundedMap<string, Entry>

  constructor(
    readonly max: number,
    readonly leewaySeconds: number = DEFAULT_LEEWAY_SECONDS,
  ) {
    this.entries = new BoundedMap(max)
  }

  get size(): number {
    return this.entries.size
  }

  /**
   * The principal of a token verified before, if it has not expired since;
   * undefined otherwise (then verify it: verifyJwt says why it fails). `now`
   * in seconds since the epoch, as verifyJwt takes it.
   */
  get(token: string, now: number): UserPrincipal | undefined {
    const entry = this.entries.get(token)
    if (!entry) return undefined
    if (now >= entry.exp + this.leewaySeconds) {
      this.entries.delete(token)
      return undefined
    }
    return entry.principal
  }

  /** Whether the token was verified here (expired or not): then it is one of ours. */
  has(token: string): boolean {
    return this.entries.has(token)
  }

  /** Remembers a token that verifyJwt has just accepted, with its exp claim. */
  set(token: string, principal: UserPrincipal, exp: number): void {
    this.entries.set(token, { principal, exp })
  }
}
