import { PASSWORD_HASH_COST } from '../../src/config.js'
import { PasswordHasher } from '../../src/auth/password.js'

// The suite hashes passwords at the lowest cost the service accepts: a hash
// costs about a millisecond instead of the production cost's tens, and what
// a test asserts of passwords does not depend on the cost. The tests of
// hashing itself (test/login-abuse.test.ts) use the production cost.

/** PASSWORD_HASH_COST of every service the suite starts (startServer and spawned processes). */
export const TEST_PASSWORD_HASH_COST = String(PASSWORD_HASH_COST.min)

/** A hasher at the suite's cost, for arranging users in the database directly. */
export const testPasswords = new PasswordHasher(PASSWORD_HASH_COST.min)

/**
 * PASSWORD_HASH_COST for a service started with `env`: the suite's, unless the
 * service runs as production (NODE_ENV=production), which refuses it and hashes at
 * its own floor.
 */
export const testHashCostFor = (env: Record<string, string | undefined>): Record<string, string> =>
  env.NODE_ENV === 'production' ? {} : { PASSWORD_HASH_COST: TEST_PASSWORD_HASH_COST }
