import { sealer } from '../core/lib/sealed-text.js'

// A webhook's signing secret. HMAC needs the secret itself, so it is stored
// sealed (src/core/lib/sealed-text.ts), under a key of its own purpose;
// reseal.ts moves the secrets an older kid sealed to the first.

export { kidOf, SealingKeyMissing } from '../core/lib/sealed-text.js'

/** Binds the derived key to this use: it can never double as a cursor or token key. */
const webhookSecrets = sealer('users-products-api webhook secret v1', 'the signing secret')

export const sealSecret = webhookSecrets.seal
export const openSecret = webhookSecrets.open
export const resealSecret = webhookSecrets.reseal
