import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, describe, test } from 'node:test'
import { expiredLoginFailures } from '../src/auth/login/login-throttle.js'
import { deleteInBatches } from '../src/core/db/batched-delete.js'
import { PASSWORD_HASH_COST } from '../src/config.js'
import { PasswordHasher } from '../src/auth/password.js'
import { testPasswords } from './helpers/passwords.js'
import { holdHashSlots } from './helpers/accounts.js'
import { startServer, type TestResponse, type TestServer } from './helpers/server.js'
import { waitUntil } from './helpers/wait.js'

// Logins under attack, from the addresses a proxy reports (TRUST_PROXY=1):
// one address flooding /auth/login can neither keep other addresses from
// logging in (the hash queue serves addresses in turn) nor lock the account
// for its owner elsewhere (failures count per account and address, with a
// much higher ceiling per account alone); attempts the queue turned away are
// not failures; each address has a login rate of its own; e-mail case has one
// spelling; old counts are purged; guessing current_password is throttled
// like logging in.

const PASSWORD = `right-${randomBytes(6).toString('hex')}`
const passwordHash = await testPasswords.hash(PASSWORD)
// RATE_LIMIT=0: nothing but the hash queue stands between the flood and the owner.
const open = await startServer({ TRUST_PROXY: '1' })
// A general limit far away, so that only the per-address login rate (LOGIN_RATE_LIMIT, default 30) shows.
const limited = await startServer({ TRUST_PROXY: '1', RATE_LIMIT: '100000' })
const LOGINS_PER_MINUTE = limited.deps.config.loginRateLimit

let sequence = 0
const unique = () => `${process.pid}-${++sequence}-${randomBytes(3).toString('hex')}`
let octet = 0
const freshAddress = () => `198.51.${100 + Math.floor(++octet / 250)}.${octet % 250}`

function login(server: TestServer, email: string, password: string, from: string): Promise<TestResponse> {
  const headers = { 'x-forwarded-for': from }
  return server.request('POST', '/auth/login', { auth: null, headers, body: { email, password } })
}

/** The hash queue's bound (PasswordHasher's `maxWaiting`): logins waiting for a slot. */
const QUEUE = 64

/**
 * Sends `count` logins from `from` while both hash slots are held (holdHashSlots): the queue fills with
 * QUEUE of them and the rest are turned away, whatever a hash costs on this machine. Resolves once the
 * turned-away ones are answered; `flood` is every answer, `answered` those in so far.
 */
async function floodHeldQueue(server: TestServer, count: number, attempt: () => [string, string], from: string) {
  const answered: TestResponse[] = []
  const flood = Promise.all(
    Array.from({ length: count }, async () => {
      const res = await login(server, ...attempt(), from)
      answered.push(res)
      return res
    }),
  )
  await waitUntil(`${count - QUEUE} logins past the queue turned away`, () => answered.length === count - QUEUE)
  return { flood, answered }
}

async function account(server: TestServer): Promise<{ id: number; email: string; token: string }> {
  return server.createUser({ email: `owner-${unique()}@example.com`, passwordHash })
}

async function rowsOf(server: TestServer, email: string): Promise<Map<string, { failures: number; locked: boolean }>> {
  const rows = await server.sql<Array<{ address: string; failures: number; locked: boolean }>>`
    SELECT address, failures, coalesce(locked_until > now(), false) AS locked FROM login_failures
      WHERE email = ${email}`
  return new Map(rows.map((r) => [r.address, { failures: r.failures, locked: r.locked }]))
}

const bucket = (address: string) => `address ${address}`

describe('one address flooding logins', () => {
  test(
    'a wrong-password flood against an account from one address: with the hash queue full, its owner, from ' +
      "another, takes the place of the flood's newest and logs in; only checked attempts count, and only against the " +
      'flooding address',
    async () => {
      const owner = await account(open)
      const attacker = freshAddress()
      const release = await holdHashSlots(open, { 'x-forwarded-for': freshAddress() })
      let own: Promise<TestResponse>
      let flood: Promise<TestResponse[]>
      try {
        const held = await floodHeldQueue(open, 150, () => [owner.email, `guess-${unique()}`], attacker)
        flood = held.flood
        own = login(open, owner.email.toUpperCase(), PASSWORD, freshAddress())
        await waitUntil(
          "the owner queued, the flood's newest turned away",
          () => held.answered.length === 150 - QUEUE + 1,
        )
      } finally {
        await release()
      }
      const ownAnswer = await own
      assert.equal(ownAnswer.status, 200, ownAnswer.text)
      const answers = await flood
      const checked = answers.filter((r) => r.status === 401)
      const locked = answers.filter((r) => r.status === 429 && r.body.code === 'too_many_login_attempts')
      const turnedAway = answers.filter((r) => r.status === 429 && r.body.code === 'rate_limited')
      // Five guesses checked, then the pair is locked; the rest turned away.
      assert.deepEqual([checked.length, locked.length, turnedAway.length], [5, QUEUE - 1 - 5, 150 - QUEUE + 1])
      for (const res of turnedAway) assert.equal(res.headers.get('retry-after'), '1')
      const rows = await rowsOf(open, owner.email)
      assert.deepEqual(
        rows.get(bucket(attacker)),
        { failures: 5, locked: true },
        'attempts turned away by the queue or the lock are not failures',
      )
      assert.equal(rows.get('*')?.locked, false, 'the account itself is not locked')
      // And again, now that the pair is locked: the owner elsewhere is not.
      assert.equal((await login(open, owner.email, PASSWORD, freshAddress())).status, 200)
    },
  )

  test(
    'a flood of logins for random accounts fills the hash queue: another address is served next, before all but ' +
      'the first of the flood',
    async () => {
      const owner = await account(open)
      const attacker = freshAddress()
      const ownerAddress = freshAddress()
      // The order the hasher grants its slots in, each by its owner (the address's bucket), read where it
      // happens: a timestamp of a statement run after the grant races the others on the pool.
      const { passwords } = open.deps
      const granted: string[] = []
      const withSlot = passwords.withSlot
      const original = withSlot.bind(passwords)
      passwords.withSlot = (slotOwner, work) => original(slotOwner, () => (granted.push(slotOwner), work()))
      after(() => void (passwords.withSlot = withSlot))
      const release = await holdHashSlots(open, { 'x-forwarded-for': freshAddress() })
      let own: Promise<TestResponse>
      let flood: Promise<TestResponse[]>
      try {
        const held = await floodHeldQueue(open, 80, () => [`nobody-${unique()}@example.com`, 'whatever-1'], attacker)
        flood = held.flood
        own = login(open, owner.email, PASSWORD, ownerAddress)
        await waitUntil(
          "the owner queued in place of the flood's newest",
          () => held.answered.length === 80 - QUEUE + 1,
        )
      } finally {
        await release()
      }
      const ownAnswer = await own
      assert.equal(ownAnswer.status, 200, ownAnswer.text)
      const answers = await flood
      const checked = answers.filter((r) => r.status === 401).length
      assert.equal(checked, QUEUE - 1)
      assert.ok(answers.every((r) => r.status === 401 || (r.status === 429 && r.body.code === 'rate_limited')))
      // Every failure counted is one that was checked.
      const [{ n }] = await open.sql<
        [{ n: number }]
      >`SELECT count(*)::int AS n FROM login_failures WHERE address = ${bucket(attacker)}`
      assert.equal(n, checked)
      // The slots freed when the holders go serve the addresses in turn: the flood's first, then the owner (in
      // arrival order, all 63 of the flood would be first).
      const served = granted.filter((o) => o === bucket(attacker) || o === bucket(ownerAddress))
      const before = served.indexOf(bucket(ownerAddress))
      assert.ok(
        before >= 0 && before <= 1,
        `${before} of the flood were served before the owner (grants: ${served.slice(0, 5).join(', ')}, …)`,
      )
    },
  )
})

describe('an unknown account', () => {
  test(
    'its password is checked against a hash of the form and parameters of a stored one, which no password ' + 'matches',
    async () => {
      // At the production cost and at the suite's: the decoy follows the hasher's cost.
      for (const hasher of [new PasswordHasher(PASSWORD_HASH_COST.default), testPasswords]) {
        const decoy = hasher.decoy.split('$')
        const stored = (await hasher.hash(PASSWORD)).split('$')
        // The scheme and the cost (N, r, p) are a stored hash's, so the
        // check takes as long; salt and key have the same lengths.
        assert.deepEqual(decoy.slice(0, 4), stored.slice(0, 4))
        assert.deepEqual(
          [4, 5].map((i) => Buffer.from(decoy[i]!, 'base64').length),
          [4, 5].map((i) => Buffer.from(stored[i]!, 'base64').length),
        )
      }
      assert.equal(new PasswordHasher(PASSWORD_HASH_COST.default).decoy.split('$')[1], String(2 ** 15))
      // Its key is arbitrary bytes whatever the cost: one check at the suite's shows that no password gives them.
      assert.equal(await testPasswords.verify(PASSWORD, testPasswords.decoy), false)
    },
  )
})

describe('the per-address login rate (RATE_LIMIT on)', () => {
  test(
    `${LOGINS_PER_MINUTE} attempts a minute from one address, then 429 rate_limited with Retry-After; another ` +
      `address is not affected`,
    async () => {
      const from = freshAddress()
      // One e-mail: after 5 checked failures its pair is locked, so the rest of the minute's attempts cost no hash.
      const email = `nobody-${unique()}@example.com`
      const answers = await Promise.all(
        Array.from({ length: LOGINS_PER_MINUTE + 1 }, () => login(limited, email, 'whatever-1', from)),
      )
      const limitedAnswers = answers.filter((r) => r.status === 429 && r.body.code === 'rate_limited')
      assert.equal(limitedAnswers.length, 1, `codes ${answers.map((r) => r.body.code).join(' ')}`)
      assert.match(limitedAnswers[0]!.headers.get('retry-after') ?? '', /^[0-9]+$/)
      assert.equal(answers.filter((r) => r.status === 401).length, 5)
      assert.equal(answers.filter((r) => r.body.code === 'too_many_login_attempts').length, LOGINS_PER_MINUTE - 5)
      const owner = await account(limited)
      assert.equal((await login(limited, owner.email, PASSWORD, freshAddress())).status, 200)
    },
  )
})

describe('the account ceiling', () => {
  test(
    'failures spread over many addresses lock the account itself once past its ceiling, for every ' + 'address',
    async () => {
      const owner = await account(open)
      // 99 failures from elsewhere already in the window; the 100th locks the account.
      await open.sql`INSERT INTO login_failures (email, address, failures, last_failure) VALUES
      (${owner.email}, '*', 99, now())`
      assert.equal((await login(open, owner.email, 'wrong-guess', freshAddress())).status, 401)
      const res = await login(open, owner.email, PASSWORD, freshAddress())
      assert.equal(res.status, 429, res.text)
      assert.equal(res.body.code, 'too_many_login_attempts')
      assert.ok(Number(res.headers.get('retry-after')) >= 1)
      assert.equal((await rowsOf(open, owner.email)).get('*')?.locked, true)
    },
  )
})

describe('e-mail case', () => {
  test(
    'one account has one spelling: ASCII case folds to one row; U+0130 is another address, not another key of ' +
      'this account',
    async () => {
      const email = `admin-${unique()}@example.com`
      await open.createUser({ email, passwordHash })
      const from = freshAddress()
      for (const spelling of [email.toUpperCase(), email, email.replace('admin', 'ADMIN')]) {
        assert.equal((await login(open, spelling, 'wrong-guess', from)).status, 401)
      }
      assert.deepEqual((await rowsOf(open, email)).get(bucket(from)), { failures: 3, locked: false })
      const dotted = email.replace('admin', 'ADM\u0130N')
      assert.equal((await login(open, dotted, PASSWORD, from)).status, 401, 'U+0130 does not name this account')
      const [{ keys }] = await open.sql<
        [{ keys: number }]
      >`SELECT count(DISTINCT email)::int AS keys FROM login_failures WHERE lower(email) = ${email}`
      assert.equal(keys, 1)
      assert.equal((await login(open, email.toUpperCase(), PASSWORD, from)).status, 200)
    },
  )
})

describe('old failure counts', () => {
  test('are purged in batches once their window has passed; locked and recent ones stay', async () => {
    const tag = unique()
    await open.sql`
      INSERT INTO login_failures (email, address, failures, last_failure)
      SELECT ${'stale-' + tag + '-'} || g || '@example.com', 'address 192.0.2.1', 3, now() - interval '1 hour' FROM
        generate_series(1, 2500) g`
    await open.sql`INSERT INTO login_failures (email, address, failures, last_failure, locked_until) VALUES
      (${'locked-' + tag}, 'x', 9, now() - interval '1 hour', now() + interval '5 minutes')`
    await open.sql`INSERT INTO login_failures (email, address, failures, last_failure) VALUES
      (${'recent-' + tag}, 'x', 1, now())`
    assert.ok((await deleteInBatches(open.sql, 'login_failures', expiredLoginFailures(open.sql))) >= 2500)
    const left = await open.sql<
      Array<{ email: string }>
    >`SELECT email FROM login_failures WHERE email LIKE ${'%' + tag + '%'} ORDER BY email`
    assert.deepEqual(
      left.map((r) => r.email),
      [`locked-${tag}`, `recent-${tag}`],
    )
  })

  test('an instance purges them when it starts (job logins.purge-failures), no login needed', async () => {
    await open.sql`INSERT INTO login_failures (email, address, failures, last_failure) VALUES
      (${'stale-' + unique()}, 'x', 3, now() - interval '1 hour')`
    const fresh = await startServer({ TRUST_PROXY: '1' }, {}, { databaseUrl: open.databaseUrl })
    await waitUntil(
      'the old counts purged',
      async () => {
        const [{ n }] = await fresh.sql<
          [{ n: number }]
        >`SELECT count(*)::int AS n FROM login_failures WHERE last_failure < now() - interval '30 minutes' AND
          locked_until IS NULL`
        return n === 0
      },
      5000,
    )
  })
})

describe('current_password', () => {
  test(
    'guesses with a stolen token are throttled like logins: after 5 wrong, 429 even with the right one from that ' +
      'address',
    async () => {
      const owner = await account(open)
      const from = freshAddress()
      const change = (current: string) =>
        open.request('PATCH', `/users/${owner.id}`, {
          auth: owner.token,
          headers: { 'x-forwarded-for': from },
          body: { password: 'stolen-account-1', current_password: current },
        })
      for (let i = 0; i < 5; i++) {
        const res = await change(`guess-${i}`)
        assert.equal(res.status, 403, res.text)
        assert.equal(res.body.code, 'current_password_required')
      }
      const locked = await change(PASSWORD)
      assert.equal(locked.status, 429, locked.text)
      assert.equal(locked.body.code, 'too_many_login_attempts')
      const [{ password_hash }] = await open.sql<
        [{ password_hash: string }]
      >`SELECT password_hash FROM users WHERE id = ${owner.id}`
      assert.equal(password_hash, passwordHash, 'nothing changed')
    },
  )
})
