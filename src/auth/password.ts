import { randomBytes, scrypt, timingSafeEqual, type ScryptOptions } from 'node:crypto'
import { PASSWORD_HASH_COST } from '../config.js'
import { HttpError } from '../core/http/problem.js'

// Passwords are stored as scrypt hashes with their parameters beside them
// (`scrypt$N$r$p$salt$hash`), so the cost can be raised later and old hashes
// still verify. The cost is N = 2^PASSWORD_HASH_COST with r=8, p=3: at the
// default 15 that is one of OWASP's equivalent scrypt settings (Password
// Storage Cheat Sheet), 32 MiB per hash instead of the 128 MiB of N=2^17,
// which keeps the process small under a burst of logins. Below 15 is for
// tests, where a hash costs about a millisecond;
// production refuses it (src/config.ts).

const R = 8
const P = 3
const KEY_BYTES = 32
const SALT_BYTES = 16

interface Waiter {
  admit: () => void
  turnAway: (err: HttpError) => void
}

/**
 * What a login checks the password against when the account is unknown, so
 * that a wrong e-mail costs the same scrypt work as a wrong password and the
 * two cannot be told apart. Its cost is what matters, and that comes from
 * the parameters, which are the service's: the salt and the key are
 * arbitrary bytes that no password derives (the login fails for an unknown
 * account whatever the comparison says). Made from constants rather than
 * hashed at start-up, which allocated scrypt's memory before the first
 * request and made that the process's peak resident memory (bench/README.md).
 */
function decoyHash(N: number): string {
  return `scrypt$${N}$${R}$${P}$Qft14dr6kxTrf0YM5aGT/Q==$ouKELwtE2MCTSgD+wDJfWFheZGtKuWy99IwtBqwJ9oE=`
}

const busy = () =>
  new HttpError('rate_limited', 'Too many password operations in progress; retry shortly.', {
    headers: { 'retry-after': '1' },
  })

/**
 * One per service (AppDeps.passwords): the slots bound the hashes one
 * service runs at once, and two services in one process (tests) do not
 * wait for each other.
 *
 * Hashing runs on libuv's thread pool (4 threads by default). At most
 * `maxRunning` hashes run at once, keeping threads free for DNS and file
 * work, and at most `maxWaiting` wait, so a flood of logins turns into quick
 * 429s instead of a backlog that starves every endpoint.
 *
 * Waiting is fair between owners (client addresses, for logins): the next
 * free slot goes to the owners in turn, and when the queue is full a
 * newcomer takes the place of the newest waiter of the owner with the most,
 * so one address flooding logins can fill the queue only while nobody else
 * needs it, and never keeps another address waiting behind its backlog.
 */
export class PasswordHasher {
  private running = 0
  private waitingCount = 0
  /** Waiters by owner; owners with waiters in the order they are served. */
  private readonly waiting = new Map<string, Waiter[]>()
  private readonly N: number
  /** The decoy of this hasher's cost (decoyHash): what an unknown account's login is checked against. */
  readonly decoy: string
  /** Hashes derived since start (scrypt runs): what a login's cost is counted in (GET /metrics). */
  derivations = 0

  /** `cost`: log2 of scrypt's N (PASSWORD_HASH_COST). */
  constructor(
    cost: number,
    private readonly maxRunning = 2,
    private readonly maxWaiting = 64,
  ) {
    if (!Number.isInteger(cost) || cost < PASSWORD_HASH_COST.min || cost > PASSWORD_HASH_COST.max) {
      throw new RangeError(
        `password hash cost ${cost} is outside ${PASSWORD_HASH_COST.min} to ${PASSWORD_HASH_COST.max}`,
      )
    }
    this.N = 2 ** cost
    this.decoy = decoyHash(this.N)
  }

  async hash(password: string): Promise<string> {
    const salt = randomBytes(SALT_BYTES)
    const key = await this.withSlot('', () => this.derive(password, salt, { N: this.N, r: R, p: P }))
    return `scrypt$${this.N}$${R}$${P}$${salt.toString('base64')}$${key.toString('base64')}`
  }

  verify(password: string, stored: string): Promise<boolean> {
    return this.withSlot('', () => this.verifyInSlot(password, stored))
  }

  /** Compares `password` with a stored hash; call only while holding a slot (withSlot). */
  async verifyInSlot(password: string, stored: string): Promise<boolean> {
    const parts = stored.split('$')
    if (parts.length !== 6 || parts[0] !== 'scrypt') return false
    const [N, r, p] = parts.slice(1, 4).map(Number) as [number, number, number]
    const expected = Buffer.from(parts[5]!, 'base64')
    const key = await this.derive(password, Buffer.from(parts[4]!, 'base64'), { N, r, p })
    return key.length === expected.length && timingSafeEqual(key, expected)
  }

  private derive(password: string, salt: Buffer, params: { N: number; r: number; p: number }): Promise<Buffer> {
    this.derivations++
    const options: ScryptOptions = { ...params, maxmem: 256 * params.N * params.r }
    return new Promise((resolve, reject) =>
      scrypt(password.normalize('NFC'), salt, KEY_BYTES, options, (err, key) => (err ? reject(err) : resolve(key))),
    )
  }

  /**
   * Runs `work` holding a slot, waiting in `owner`'s turn; 429 when turned
   * away. `work` is given the verification to run inside the slot, so that
   * what must happen only once a slot is held (counting a login attempt)
   * happens there.
   */
  async withSlot<T>(owner: string, work: () => Promise<T>): Promise<T> {
    if (this.running >= this.maxRunning) await this.wait(owner)
    else this.running++
    try {
      return await work()
    } finally {
      this.handOver()
    }
  }

  private wait(owner: string): Promise<void> {
    if (this.waitingCount >= this.maxWaiting && !this.turnAwayNewestOfLargest(owner)) return Promise.reject(busy())
    return new Promise<void>((admit, turnAway) => {
      let queue = this.waiting.get(owner)
      if (!queue) this.waiting.set(owner, (queue = []))
      queue.push({ admit, turnAway })
      this.waitingCount++
    })
  }

  /** Makes room for `newcomer`; false when `newcomer` itself is the owner with the most waiting. */
  private turnAwayNewestOfLargest(newcomer: string): boolean {
    let largest: string | undefined
    let most = this.waiting.get(newcomer)?.length ?? 0
    for (const [owner, queue] of this.waiting) {
      if (queue.length > most) [largest, most] = [owner, queue.length]
    }
    if (largest === undefined) return false
    const queue = this.waiting.get(largest)!
    queue.pop()!.turnAway(busy())
    if (queue.length === 0) this.waiting.delete(largest)
    this.waitingCount--
    return true
  }

  /**
   * The slot goes straight to the next owner in turn (a Map iterates
   * in insertion order: re-inserting moves an owner last).
   */
  private handOver(): void {
    const next = this.waiting.entries().next().value
    if (!next) {
      this.running--
      return
    }
    const [owner, queue] = next
    const waiter = queue.shift()!
    this.waiting.delete(owner)
    if (queue.length) this.waiting.set(owner, queue)
    this.waitingCount--
    waiter.admit()
  }
}
