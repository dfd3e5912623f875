import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { describe, test } from 'node:test'
import { expiredKnownAddresses } from '../src/auth/login/known-addresses.js'
import { deleteInBatches } from '../src/core/db/batched-delete.js'
import { testPasswords } from './helpers/passwords.js'
import { workOf } from './helpers/accounts.js'
import { startServer, type TestResponse, type TestServer } from './helpers/server.js'
import { waitUntil } from './helpers/wait.js'

// The owner of an account under attack keeps logging in: an address that
// proved the account's password within 30 days is not locked out by the
// account-wide failure count that other addresses drive up, while its own
// failures still lock it, and an e-mail without an account behaves the same
// as one with, for the same work (no oracle). Also: LOGIN_RATE_LIMIT, the
// warning about an X-Forwarded-For that TRUST_PROXY=0 ignores, and a failed
// login's event keeping the typed e-mail only when it names an account.

const PASSWORD = `right-${randomBytes(6).toString('hex')}`
const passwordHash = await testPasswords.hash(PASSWORD)
// Addresses as a proxy reports them (TRUST_PROXY=1); RATE_LIMIT=0, so only the throttle in the database shows.
const proxied = await startServer({ TRUST_PROXY: '1' })

let sequence = 0
const unique = () => `${process.pid}-${++sequence}-${randomBytes(3).toString('hex')}`
let octet = 0
const freshAddress = () => `203.0.${Math.floor(++octet / 250)}.${octet % 250}`

function login(server: TestServer, email: string, password: string, from?: string): Promise<TestResponse> {
  return server.request('POST', '/auth/login', {
    auth: null,
    headers: from === undefined ? {} : { 'x-forwarded-for': from },
    body: { email, password },
  })
}

const account = (server: TestServer) => server.createUser({ email: `owner-${unique()}@example.com`, passwordHash })

async function failures(
  server: TestServer,
  email: string,
): Promise<Record<string, { failures: number; locked: boolean }>> {
  const rows = await server.sql<Array<{ address: string; failures: number; locked: boolean }>>`
    SELECT address, failures, coalesce(locked_until > now(), false) AS locked FROM login_failures
      WHERE email = ${email}`
  return Object.fromEntries(rows.map((r) => [r.address, { failures: r.failures, locked: r.locked }]))
}

/** Five wrong passwords from each of `addresses`, all at once: every one of them checked (401). */
async function attack(server: TestServer, email: string, addresses: string[]): Promise<void> {
  const answers = await Promise.all(
    addresses.flatMap((a) => Array.from({ length: 5 }, () => login(server, email, `guess-${unique()}`, a))),
  )
  assert.deepEqual([...new Set(answers.map((r) => r.status))], [401])
}

/**
 * Sets an account-wide count (of unknown addresses, '*', or of known ones), as if an attack had been going on for a
 * while; locked if asked.
 */
async function seedAccountFailures(
  server: TestServer,
  email: string,
  row: '*' | '*known',
  count: number,
  locked = false,
): Promise<void> {
  await server.sql`
    INSERT INTO login_failures (email, address, failures, last_failure, locked_until)
    VALUES (${email}, ${row}, ${count}, now(), ${locked ? server.sql`now() + interval '10 minutes'` : null})
    ON CONFLICT (email, address) DO UPDATE SET failures = excluded.failures, last_failure = excluded.last_failure,
    locked_until = excluded.locked_until`
}

function assertLocked(res: TestResponse): void {
  assert.equal(res.status, 429, res.text)
  assert.equal(res.body.code, 'too_many_login_attempts')
  assert.match(res.headers.get('retry-after') ?? '', /^[1-9][0-9]*$/)
}

describe('an attacker with many addresses drives the account-wide count to its lock', () => {
  test(
    'the owner at an address that logged in before still logs in (IPv6 per /64); a new address with the right ' +
      'password is 429',
    async () => {
      const owner = await account(proxied)
      const home = freshAddress()
      const phone = '2001:db8:77:1::10'
      assert.equal((await login(proxied, owner.email, PASSWORD, home)).status, 200)
      assert.equal((await login(proxied, owner.email, PASSWORD, phone)).status, 200)
      // 90 failures already counted from elsewhere; 2 more addresses × 5 over HTTP pass the ceiling of 100.
      await seedAccountFailures(proxied, owner.email, '*', 90)
      await attack(proxied, owner.email, [freshAddress(), '2001:db8:66:1::1'])
      assert.equal(
        (await failures(proxied, owner.email))['*']?.locked,
        true,
        'the account is locked for unknown addresses',
      )

      const fromHome = await login(proxied, owner.email, PASSWORD, home)
      assert.equal(fromHome.status, 200, fromHome.text)
      assert.equal(typeof fromHome.body.access_token, 'string')
      const phoneElsewhereInItsPrefix = await login(proxied, owner.email, PASSWORD, '2001:db8:77:1:aaaa:bbbb:cccc:dddd')
      assert.equal(phoneElsewhereInItsPrefix.status, 200, phoneElsewhereInItsPrefix.text)
      assertLocked(await login(proxied, owner.email, PASSWORD, freshAddress()))
      assertLocked(await login(proxied, owner.email, PASSWORD, '2001:db8:77:2::10'))

      // Stored: one keyed hash per address bucket, never the address itself.
      const known = await proxied.sql<
        Array<{ tag: Buffer; epoch: number }>
      >`SELECT address_tag AS tag, epoch FROM login_known_addresses WHERE user_id = ${owner.id}`
      assert.equal(known.length, 2)
      for (const { tag } of known) {
        assert.equal(tag.length, 32)
        assert.ok(![home, '2001:db8:77:1::', `address ${home}`].some((text) => tag.includes(Buffer.from(text))))
      }
      assert.equal(
        (await failures(proxied, owner.email))['*known']?.failures,
        0,
        "the owner's own logins took their counts back",
      )
    },
  )

  test(
    "a known address that itself guesses is still locked (its pair after 5), and counts on the known addresses' " +
      "row, not the others'",
    async () => {
      const owner = await account(proxied)
      const shared = freshAddress()
      assert.equal((await login(proxied, owner.email, PASSWORD, shared)).status, 200)
      await seedAccountFailures(proxied, owner.email, '*', 100, true)
      for (let i = 0; i < 5; i++) assert.equal((await login(proxied, owner.email, `guess-${i}`, shared)).status, 401)
      assertLocked(await login(proxied, owner.email, PASSWORD, shared))
      const rows = await failures(proxied, owner.email)
      assert.deepEqual(rows[`address ${shared}`], { failures: 5, locked: true })
      assert.deepEqual(rows['*known'], { failures: 5, locked: false })
      assert.equal(rows['*']?.failures, 100)
    },
  )

  test('known addresses together have a ceiling of their own', async () => {
    const owner = await account(proxied)
    const [a, b] = [freshAddress(), freshAddress()]
    for (const from of [a, b]) assert.equal((await login(proxied, owner.email, PASSWORD, from)).status, 200)
    await seedAccountFailures(proxied, owner.email, '*known', 99)
    assert.equal((await login(proxied, owner.email, 'wrong-guess', a)).status, 401)
    assertLocked(await login(proxied, owner.email, PASSWORD, b))
    assert.equal(
      (await login(proxied, owner.email, PASSWORD, freshAddress())).status,
      200,
      'unknown addresses have their own count',
    )
  })

  test(
    'one address alone cannot lock the account: attempts its locked pair refuses are not counted against the ' +
      'account',
    async () => {
      const owner = await account(proxied)
      const attacker = freshAddress()
      const answers = []
      for (let i = 0; i < 30; i++) answers.push(await login(proxied, owner.email, `guess-${i}`, attacker))
      assert.equal(answers.filter((r) => r.status === 401).length, 5)
      assert.equal(answers.filter((r) => r.status === 429 && r.body.code === 'too_many_login_attempts').length, 25)
      const rows = await failures(proxied, owner.email)
      assert.deepEqual(rows['*'], { failures: 5, locked: false })
      assert.deepEqual(rows[`address ${attacker}`], { failures: 5, locked: true })
    },
  )

  test(
    "attempts the account's lock refuses are not counted against their address: once the lock ends, the owner " +
      'logs in from there',
    async () => {
      const owner = await account(proxied)
      const newPlace = freshAddress()
      await seedAccountFailures(proxied, owner.email, '*', 100, true)
      for (let i = 0; i < 6; i++) assertLocked(await login(proxied, owner.email, PASSWORD, newPlace))
      assert.equal(
        (await failures(proxied, owner.email))[`address ${newPlace}`],
        undefined,
        'refused attempts were counted against the address',
      )
      await seedAccountFailures(proxied, owner.email, '*', 0)
      const res = await login(proxied, owner.email, PASSWORD, newPlace)
      assert.equal(res.status, 200, res.text)
    },
  )

  test(
    'logins of one account at once, right and wrong, from one address and from several, all get their answer: no ' +
      'deadlock between counting and clearing',
    async () => {
      const owner = await account(proxied)
      const home = freshAddress()
      for (let round = 0; round < 3; round++) {
        const answers = await Promise.all([
          ...Array.from({ length: 6 }, () => login(proxied, owner.email, PASSWORD, home)),
          ...Array.from({ length: 3 }, () => login(proxied, owner.email, PASSWORD, freshAddress())),
          login(proxied, owner.email, 'wrong-guess', freshAddress()),
        ])
        assert.deepEqual(
          answers.map((r) => r.status),
          [200, 200, 200, 200, 200, 200, 200, 200, 200, 401],
          JSON.stringify(answers.map((r) => r.body?.code)),
        )
      }
    },
  )

  test('logging out everywhere forgets the known addresses, as it ends every JWT', async () => {
    const owner = await account(proxied)
    const home = freshAddress()
    const tokens = await login(proxied, owner.email, PASSWORD, home)
    assert.equal(tokens.status, 200)
    assert.equal((await proxied.request('POST', '/auth/logout-all', { auth: tokens.body.access_token })).status, 204)
    await seedAccountFailures(proxied, owner.email, '*', 100, true)
    assertLocked(await login(proxied, owner.email, PASSWORD, home))
  })

  test(
    'no oracle: for an address that never logged in to it, an e-mail with an account and one without answer ' +
      'alike, for the same work; a known address is known to its own account only',
    async () => {
      const owner = await account(proxied)
      const home = freshAddress()
      assert.equal((await login(proxied, owner.email, PASSWORD, home)).status, 200)
      const nobody = `nobody-${unique()}@example.com`
      // The last failure the account's row allows, then one it refuses:
      // what each answers, and costs (a hash, then none).
      const answers = async (email: string) => {
        await seedAccountFailures(proxied, email, '*', 99)
        const attempts = []
        for (let i = 0; i < 2; i++) {
          const { result, work } = await workOf(proxied, () => login(proxied, email, 'wrong-guess', freshAddress()))
          attempts.push({ status: result.status, code: result.body.code, work })
        }
        return attempts
      }
      const ofAccount = await answers(owner.email)
      assert.deepEqual(
        ofAccount.map((a) => [a.status, a.work.hashes]),
        [
          [401, 1],
          [429, 0],
        ],
      )
      assert.deepEqual(await answers(nobody), ofAccount)
      assertLocked(await login(proxied, nobody, PASSWORD, home))
      assert.equal((await login(proxied, owner.email, PASSWORD, home)).status, 200)
    },
  )
})

describe('known addresses older than 30 days', () => {
  test('are purged in batches; recent ones stay', async () => {
    const owner = await account(proxied)
    await proxied.sql`
      INSERT INTO login_known_addresses (user_id, address_tag, epoch, last_success_at)
      SELECT ${owner.id}, sha256(g::text::bytea), 0, now() - interval '31 days' FROM generate_series(1, 2500) g`
    await proxied.sql`INSERT INTO login_known_addresses (user_id, address_tag, epoch, last_success_at) VALUES
      (${owner.id}, sha256('recent'::bytea), 0, now() - interval '29 days')`
    assert.ok((await deleteInBatches(proxied.sql, 'login_known_addresses', expiredKnownAddresses(proxied.sql))) >= 2500)
    const [{ n }] = await proxied.sql<
      [{ n: number }]
    >`SELECT count(*)::int AS n FROM login_known_addresses WHERE user_id = ${owner.id}`
    assert.equal(n, 1)
  })

  test('an instance purges them when it starts (job logins.purge-known-addresses), no login needed', async () => {
    const owner = await account(proxied)
    await proxied.sql`INSERT INTO login_known_addresses (user_id, address_tag, epoch, last_success_at) VALUES
      (${owner.id}, sha256('old'::bytea), 0, now() - interval '31 days')`
    const fresh = await startServer({ TRUST_PROXY: '1' }, {}, { databaseUrl: proxied.databaseUrl })
    await waitUntil(
      'the old known addresses purged',
      async () => {
        const [{ n }] = await fresh.sql<
          [{ n: number }]
        >`SELECT count(*)::int AS n FROM login_known_addresses WHERE last_success_at < now() - interval '30 days'`
        return n === 0
      },
      5000,
    )
  })
})

describe('LOGIN_RATE_LIMIT', () => {
  test(
    'LOGIN_RATE_LIMIT=5: the 6th attempt from one address in a minute is 429 rate_limited with Retry-After, and ' +
      'is not counted; another address is not affected',
    async () => {
      const limited = await startServer(
        { TRUST_PROXY: '1', RATE_LIMIT: '100000', LOGIN_RATE_LIMIT: '5' },
        {},
        { databaseUrl: proxied.databaseUrl },
      )
      const from = freshAddress()
      // A new e-mail each time: no pair is locked, only the per-address rate can refuse.
      const emails = Array.from({ length: 6 }, () => `nobody-${unique()}@example.com`)
      const answers: TestResponse[] = []
      for (const email of emails) answers.push(await login(limited, email, 'whatever-1', from))
      assert.deepEqual(
        answers.map((r) => r.status),
        [401, 401, 401, 401, 401, 429],
      )
      const sixth = answers[5]!
      assert.equal(sixth.body.code, 'rate_limited')
      assert.match(sixth.headers.get('retry-after') ?? '', /^[1-9][0-9]*$/)
      assert.deepEqual(await failures(limited, emails[5]!), {}, 'the refused attempt counted nothing')
      assert.equal((await login(limited, emails[5]!, 'whatever-1', freshAddress())).status, 401)
    },
  )

  test('LOGIN_RATE_LIMIT=0 turns the per-address login rate off (the failure counts still lock)', async () => {
    const open = await startServer(
      { TRUST_PROXY: '1', RATE_LIMIT: '100000', LOGIN_RATE_LIMIT: '0' },
      {},
      { databaseUrl: proxied.databaseUrl },
    )
    const from = freshAddress()
    // One e-mail: its pair locks after 5 checked failures, so the
    // other 26 cost no hash, and none is turned away by a rate.
    const email = `nobody-${unique()}@example.com`
    const answers = await Promise.all(Array.from({ length: 31 }, () => login(open, email, 'whatever-1', from)))
    assert.equal(answers.filter((r) => r.status === 401).length, 5)
    assert.equal(answers.filter((r) => r.status === 429 && r.body.code === 'too_many_login_attempts').length, 26)
  })

  test('the default is 30', async () => {
    assert.equal(proxied.deps.config.loginRateLimit, 30)
  })
})

describe('X-Forwarded-For while TRUST_PROXY=0', () => {
  const warnings = (server: TestServer) =>
    server.logs.filter((l) => l.level === 'warn' && l.msg === 'X-Forwarded-For is ignored: TRUST_PROXY is 0')

  test('is warned about once per process, naming the peer; the header changes nothing', async () => {
    const direct = await startServer({}, {}, { databaseUrl: proxied.databaseUrl })
    assert.equal((await direct.request('GET', '/healthz')).status, 200)
    assert.equal(warnings(direct).length, 0, 'no header, no warning')
    const owner = await account(direct)
    for (let i = 0; i < 3; i++) {
      const res = await login(direct, owner.email, PASSWORD, freshAddress())
      assert.equal(res.status, 200, res.text)
    }
    const [warning, ...more] = warnings(direct)
    assert.equal(more.length, 0, 'once')
    assert.equal(warning?.peer, '127.0.0.1')
    assert.match(String(warning?.hint), /TRUST_PROXY/)
    // Every attempt counted against the peer, whatever the header said.
    assert.equal(
      direct.logs
        .filter((l) => l.msg === 'request' && l.route === '/auth/login')
        .every((l) => l.client === '127.0.0.1'),
      true,
    )
  })

  test('is not warned about with TRUST_PROXY set', async () => {
    const owner = await account(proxied)
    assert.equal((await login(proxied, owner.email, PASSWORD, freshAddress())).status, 200)
    assert.equal(warnings(proxied).length, 0)
  })
})

describe('the login.failed event', () => {
  async function failedLoginEvents(server: TestServer, attempt: () => Promise<TestResponse>) {
    await server.published()
    const [{ since }] = await server.sql<[{ since: number }]>`SELECT coalesce(max(id), 0)::int AS since FROM events`
    const res = await attempt()
    assert.equal(res.status, 401, res.text)
    await server.published()
    const listed = await server.request('GET', `/events?type=login.failed&id[gt]=${since}&limit=100`)
    assert.equal(listed.status, 200, listed.text)
    const stored = await server.sql<
      Array<{ data: Record<string, unknown> }>
    >`SELECT data FROM events WHERE type = 'login.failed' AND id > ${since}`
    return { listed: listed.body as Array<{ subject: { id: number | null }; data: Record<string, unknown> }>, stored }
  }

  test(
    'an e-mail that names no account (a password typed into the wrong field) is kept nowhere: the event has email ' +
      'null, and no log line has it',
    async () => {
      const typed = `Tr0ub4dor&3-${randomBytes(6).toString('hex')}`
      const { listed, stored } = await failedLoginEvents(proxied, () =>
        login(proxied, typed, 'whatever-1', freshAddress()),
      )
      assert.equal(listed.length, 1)
      assert.equal(listed[0]!.subject.id, null)
      assert.ok('email' in listed[0]!.data, 'the shape stays: email is there, null')
      assert.equal(listed[0]!.data.email, null)
      assert.equal(typeof listed[0]!.data.client_address, 'string')
      assert.deepEqual(
        stored.map((e) => e.data.email),
        [null],
      )
      const needle = typed.toLowerCase()
      const [{ n }] = await proxied.sql<[{ n: number }]>`
      SELECT (SELECT count(*) FROM events WHERE lower(data::text) LIKE ${'%' + needle + '%'})::int
           + (SELECT count(*) FROM event_outbox WHERE lower(data::text) LIKE ${'%' + needle + '%'})::int AS n`
      assert.equal(n, 0)
      assert.ok(!JSON.stringify(proxied.logs).toLowerCase().includes(needle), 'not in a log line')
    },
  )

  test('an e-mail that names an account keeps it', async () => {
    const owner = await account(proxied)
    const { listed, stored } = await failedLoginEvents(proxied, () =>
      login(proxied, owner.email.toUpperCase(), 'wrong-guess', freshAddress()),
    )
    assert.equal(listed.length, 1)
    assert.equal(listed[0]!.subject.id, owner.id)
    assert.equal(listed[0]!.data.email, owner.email.toLowerCase())
    assert.deepEqual(
      stored.map((e) => e.data.email),
      [owner.email.toLowerCase()],
    )
  })
})
