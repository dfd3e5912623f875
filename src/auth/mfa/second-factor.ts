import type { AuthServices } from '../services.js'
import { countAttempt, normalizeEmail, passwordProven, recordFailedLogin } from '../login/login-throttle.js'
import type { EventOrigin } from '../origin.js'
import { acceptCode, useRecoveryCode } from './factors.js'

// Proving the second factor, wherever it is asked for (a login, its second
// step, a step-up): a TOTP code or a recovery code, each attempt counted
// against the account and the address before it is checked, and a wrong one
// recorded as a failed login, exactly as a password guess is: the lock that
// bounds password guesses bounds code guesses too.

export type SecondFactorDeps = Pick<AuthServices, 'sql' | 'config' | 'clock' | 'logins'>

/** What a request offers as its second factor. */
export interface OfferedFactor {
  code?: string | undefined
  recovery_code?: string | undefined
}

/** Whether the offered code (or recovery code, spent) holds for the user. */
export async function proveSecondFactor(
  deps: SecondFactorDeps,
  user: { id: number; email: string },
  offered: OfferedFactor,
  attempt: { client: string; origin: EventOrigin },
): Promise<boolean> {
  const { sql, config, clock, logins } = deps
  const email = normalizeEmail(user.email)
  const from = logins.address(attempt.client)
  await countAttempt(sql, email, from)
  const ok =
    offered.code !== undefined
      ? await acceptCode(sql, config.jwtSecrets, user.id, offered.code, clock.now())
      : offered.recovery_code !== undefined && (await useRecoveryCode(sql, user.id, offered.recovery_code))
  if (!ok) {
    await recordFailedLogin(sql, { email, userId: user.id, client: attempt.client }, attempt.origin)
    return false
  }
  await passwordProven(sql, email, user.id, from)
  return true
}
