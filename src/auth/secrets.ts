import { createHmac, randomBytes } from 'node:crypto'
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import type { Config } from '../config.js'
import { cursorKey, type CursorKey } from '../core/collections/cursor.js'

type Secrets = Config['jwtSecrets']

/**
 * The signing secrets. In production they come from JWT_SECRETS (the config
 * refuses to start without). In development, with none set, a random secret
 * is generated once and kept in the ignored data folder, so tokens and
 * cursors survive restarts without anyone inventing a weak secret.
 */
export function resolveSecrets(config: Config, dataDir: string): Secrets {
  if (config.jwtSecrets.length) return config.jwtSecrets
  const file = join(dataDir, 'jwt-secret')
  if (!existsSync(file)) {
    mkdirSync(dataDir, { recursive: true })
    writeFileSync(file, randomBytes(48).toString('base64url'), { mode: 0o600, flag: 'wx' })
  }
  return [{ kid: 'dev', secret: Buffer.from(readFileSync(file, 'utf8').trim(), 'utf8') }]
}

/** Cursor MAC keys, derived so that a cursor can never double as a token signature. First signs, all verify. */
export const cursorKeysFrom = (secrets: Secrets): CursorKey[] =>
  secrets.map((s) => cursorKey(createHmac('sha256', s.secret).update('collection-cursor-v2').digest()))
