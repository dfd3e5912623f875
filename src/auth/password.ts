import { randomBytes, scrypt, timingSafeEqual, type ScryptOptions } from 'node:crypto'
import { HttpError } from '../http/problem.js'

// Passwords are stored as scrypt hashes with their parameters beside them
// (`scrypt$N$r$p$salt$hash`), so the cost can be raised later and old hashes
// still verify. N=2^15, r=8, p=3 is one of OWASP's equivalent scrypt settings
// (Password Storage Cheat Sheet); it needs 32 MiB per hash instead of the
// 128 MiB of N=2^17, which keeps the process small under a burst of logins.

const PARAMS = { N: 2 ** 15, r: 8, p: 3 }
const KEY_BYTES = 32
const SALT_BYTES = 16

// Hashing runs on libuv's thread pool (4 threads by default). Bounding it keeps
// threads free for DNS and file work, and a bounded queue turns a flood of
// logins into quick 503s instead of a backlog that starves every endpoint.
const MAX_RUNNING = 2
const MAX_WAITING = 64
let running = 0
const waiting: Array<() => void> = []

async function withHashSlot<T>(work: () => Promise<T>): Promise<T> {
  if (running >= MAX_RUNNING) {
    if (waiting.length >= MAX_WAITING) {
      throw new HttpError(429, 'rate_limited', 'Too many password operations in progress; retry shortly.', { headers: { 'retry-after': '1' } })
    }
    await new Promise<void>((resolve) => waiting.push(resolve))
  } else {
    running++
  }
  try {
    return await work()
  } finally {
    const next = waiting.shift()
    if (next) next() // hand the slot over directly
    else running--
  }
}

function derive(password: string, salt: Buffer, params: { N: number; r: number; p: number }): Promise<Buffer> {
  const options: ScryptOptions = { ...params, maxmem: 256 * params.N * params.r }
  return withHashSlot(
    () => new Promise((resolve, reject) => scrypt(password.normalize('NFC'), salt, KEY_BYTES, options, (err, key) => (err ? reject(err) : resolve(key)))),
  )
}

export async function hashPassword(password: string): Promise<string> {
  const salt = randomBytes(SALT_BYTES)
  const key = await derive(password, salt, PARAMS)
  return `scrypt$${PARAMS.N}$${PARAMS.r}$${PARAMS.p}$${salt.toString('base64')}$${key.toString('base64')}`
}

export async function verifyPassword(password: string, stored: string): Promise<boolean> {
  const parts = stored.split('$')
  if (parts.length !== 6 || parts[0] !== 'scrypt') return false
  const [N, r, p] = parts.slice(1, 4).map(Number) as [number, number, number]
  const expected = Buffer.from(parts[5]!, 'base64')
  const key = await derive(password, Buffer.from(parts[4]!, 'base64'), { N, r, p })
  return key.length === expected.length && timingSafeEqual(key, expected)
}
