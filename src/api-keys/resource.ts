import type { Sql } from 'postgres'
import Type from 'typebox'
import type { AppModule } from '../app-module.js'
import { challenge, invalidToken } from '../auth/credentials.js'
import { requireFreshProof, type FreshProof } from '../auth/current-password.js'
import { apiKeys } from '../auth/api-keys/declaration.js'
import { isAdmin, sessionOf, type Principal } from '../auth/principal.js'
import { displayPrefix, hashSecret, newSecret } from '../auth/tokens.js'
import { HttpError, validationFailed } from '../core/http/problem.js'
import type { ResourceHooks } from '../core/resources/routes.js'
import { resourceModule } from '../resource-module.js'
import { eventOf, type StoredRow } from '../core/resources/store.js'
import { originOf, type EventOrigin } from '../auth/origin.js'
import { recordEvents } from '../core/resources/change-events.js'

// An API key is listed, read and deleted like any resource, by its owner (or
// an admin). It is never changed, and its creation is its own: the secret is
// made here, shown once, and only its hash is stored. A key may outlive the
// session that made it, so making one is a step-up act: only a login may do
// it (never a key), with a fresh proof. A key made with the password (and
// code) in its own request lives on its own; one made on the strength of a
// recent login is bound to that login's session, and is revoked when the
// session is ended (not when it merely runs out).

/** The answer to its creation, the one time the secret `key` is shown. */
const ApiKeyCreated = Type.Object(
  { ...apiKeys.schemas.representation.properties, key: Type.String() },
  { additionalProperties: false },
)

const userIdOf = (p: Principal) => (p.kind === 'user' ? p.userId : '')

/**
 * The credential creating a key: its session (none for a provider token), and for a JWT or a provider token the
 * credential epoch it was checked at.
 */
interface Creator {
  sessionId: number | undefined
  epoch?: number
  /** The proof was the session's recent login: the key is bound to the session. */
  bindToSession: boolean
}

/**
 * The new key; 'gone' when its user no longer exists (a JWT may outlive its
 * user by a moment), or when the creating credential was revoked meanwhile;
 * 'limit' when the user already holds `max` live keys.
 * The user's row is locked (FOR NO KEY UPDATE: it does not block the foreign
 * key checks of other writes) so that concurrent creations count one after
 * another and cannot together pass the limit; a deletion of the user waits
 * for this insert and then takes the key with it. A logout-all or a password
 * reset locks the same row: the creator is checked again under the lock, so
 * a key cannot slip in behind the revocation of its creator (and of its keys).
 */
async function insertApiKey(
  sql: Sql,
  key: {
    user_id: number
    name: string
    prefix: string
    key_hash: Buffer
    scopes: string[]
    expires_at: Date | null
    session_id?: number
  },
  creator: Creator,
  max: number,
  origin: EventOrigin,
): Promise<StoredRow | 'gone' | 'limit'> {
  return sql.begin(async (tx) => {
    const [user] = await tx<
      Array<{ epoch: number }>
    >`SELECT credential_epoch AS epoch FROM users WHERE id = ${key.user_id} AND deleted_at IS NULL FOR NO KEY UPDATE`
    if (!user || (creator.epoch !== undefined && creator.epoch !== user.epoch)) return 'gone'
    const [ended] =
      creator.sessionId === undefined
        ? []
        : await tx`SELECT 1 FROM sessions WHERE id = ${creator.sessionId} AND revoked_at IS NOT NULL`
    if (ended) return 'gone'
    if (creator.bindToSession && creator.sessionId !== undefined) key.session_id = creator.sessionId
    const [{ live }] = await tx<[{ live: number }]>`
      SELECT count(*)::int AS live FROM api_keys WHERE user_id = ${key.user_id} AND (expires_at IS NULL
        OR expires_at > now())`
    if (live >= max) return 'limit'
    const [row] = await tx<StoredRow[]>`INSERT INTO api_keys ${tx(key)} RETURNING *`
    await recordEvents(tx, [eventOf(apiKeys, apiKeys.events.created, row!)], origin)
    return row!
  })
}

const hooks: ResourceHooks = {
  // Everyone sees their own keys; an admin sees anyone's.
  scope: ({ principal }) => (isAdmin(principal) ? undefined : { user_id: userIdOf(principal) }),
  checkList(query, { principal }) {
    if (!isAdmin(principal) && query.user_id !== undefined && String(query.user_id) !== userIdOf(principal)) {
      throw new HttpError('forbidden', 'Only an admin may list the keys of another user.')
    }
  },
  async insert(ctx, values) {
    const { principal, requestId, services } = ctx
    if (principal.kind !== 'user') throw new Error('unreachable: protected route')
    // Before anything about the key is looked at: a stolen access token alone learns nothing here.
    const proof = await requireFreshProof(principal, ctx.body as FreshProof, ctx)
    const scopes = values.scopes as string[]
    const unknown = scopes.findIndex((s) => !services.registry.scopes.isScope(s))
    if (unknown !== -1) throw validationFailed([{ path: `/scopes/${unknown}`, message: 'is not a scope' }])
    // A key can never do more than the credential that created it.
    const beyond = scopes.filter((s) => !principal.scopes.has(s as never))
    // With the challenge every other insufficient_scope answer carries (RFC 6750 §3.1), naming what is missing.
    if (beyond.length) {
      throw new HttpError('insufficient_scope', `A key cannot have scopes its creator lacks: ${beyond.join(' ')}.`, {
        headers: { 'www-authenticate': challenge.scope(beyond.join(' ')) },
      })
    }
    const expiresAt = values.expires_at ? new Date(values.expires_at as string) : null
    if (expiresAt && expiresAt.getTime() <= services.clock.now())
      throw validationFailed([{ path: '/expires_at', message: 'must be in the future' }])
    const key = newSecret('apiKey')
    const { maxApiKeysPerUser } = services.config
    const { credential } = principal
    if (credential.type === 'api_key') throw new Error('unreachable: an interactive route')
    const creator: Creator = {
      sessionId: sessionOf(credential),
      epoch: credential.type === 'token' ? undefined : credential.epoch,
      bindToSession: proof === 'session',
    }
    const row = await insertApiKey(
      services.sql,
      {
        user_id: Number(principal.userId),
        name: values.name as string,
        prefix: displayPrefix(key),
        key_hash: hashSecret(key),
        scopes,
        expires_at: expiresAt,
      },
      creator,
      maxApiKeysPerUser,
      originOf(principal, requestId),
    )
    // The user was deleted, or the credential revoked, while this request ran: it is good for nothing now.
    if (row === 'gone') throw invalidToken()
    if (row === 'limit')
      throw new HttpError(
        'api_key_limit',
        `This user already holds ${maxApiKeysPerUser} live API keys (MAX_API_KEYS_PER_USER); delete one first.`,
      )
    return { row, body: { key } }
  },
  // Answer once this instance has heard the revocation: it never serves the key
  // to a client told it is gone (src/auth/revocation/credential-changes.ts).
  afterDelete: (ctx) => ctx.services.credentialChanges.caughtUp(),
}

const operations = resourceModule(apiKeys, {
  operations: ['list', 'create', 'read', 'delete'],
  // A key never makes a key: one leaked key must not be able to outlive its own revocation.
  access: { create: { interactive: true } },
  // Keys are never changed, only revoked.
  unsubscribable: [apiKeys.events.updated],
  hooks,
  summaries: {
    list: "List API keys: one's own, or anyone's for an admin",
    create:
      'Create an API key (a login only, with current_password unless it logged in within REAUTH_WINDOW); the secret ' +
      'is in this answer only',
    read: 'Read an API key (without its secret)',
    delete: 'Revoke an API key at once',
  },
  // Not idempotent: a replay would have to store the secret, and only its hash may be stored.
  idempotentCreate: false,
  // Nor in a batch, whose answer is stored under its Idempotency-Key.
  batchable: false,
  created: { name: 'ApiKeyCreated', schema: ApiKeyCreated },
  noStore: ['create'],
})

/** API keys: the resource a user manages its keys through (the credential itself is auth's, src/auth/api-keys/). */
export const apiKeysModule: AppModule = {
  name: 'api-keys',
  resources: [operations],
  problems: { api_key_limit: { status: 409, title: 'Too many API keys' } },
}
