import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import type { PeerCertificate } from 'node:tls'
import { parseConnectionString, type ConnectionString } from '../src/core/db/connection-string.js'
import { connectionStringProblem, tlsFailure, tlsOptions } from '../src/core/db/database-tls.js'
import { classifyDatabaseError } from '../src/core/db/errors.js'
import { certificateFromAuthority, createCertificateAuthority } from './helpers/certificates.js'

// Database URLs read as libpq reads them (src/core/db/connection-string.ts),
// the TLS options each sslmode gives postgres.js (src/core/db/database-tls.ts),
// and the words a TLS failure is told in. What a real server does with them:
// test/database-tls.test.ts.

/** The parts of a parse worth comparing; the rest as the defaults say. */
const read = (url: string) => {
  const { hosts, ports, socket, user, password, database, sslmode } = parseConnectionString(url)
  return { hosts, ports, socket, user, password, database, sslmode }
}

describe('the URL as libpq reads it', () => {
  const cases: Array<[string, Partial<ReturnType<typeof read>>]> = [
    [
      'postgres://user@/db?host=/run/postgresql',
      { hosts: [], ports: [5432], socket: '/run/postgresql', user: 'user', database: 'db' },
    ],
    ['postgresql:///db?host=/run/postgresql&port=5433', { socket: '/run/postgresql', ports: [5433], user: undefined }],
    ['postgres://%2Frun%2Fpostgresql/db', { socket: '/run/postgresql', ports: [5432], database: 'db' }],
    ['postgres://%2Frun%2Fpostgresql:6000/db', { socket: '/run/postgresql', ports: [6000] }],
    // The host parameter overrides the host part (the local development cluster's URL).
    ['postgres://postgres@localhost/postgres?host=%2Ftmp%2Frun', { hosts: [], socket: '/tmp/run' }],
    ['postgres://user@:6000/db?host=/tmp/run', { socket: '/tmp/run', ports: [6000] }],
    [
      'postgres://u%40x:p%40ss%3Aw%2Fd@db.example.com:6543/my%20db',
      { hosts: ['db.example.com'], ports: [6543], user: 'u@x', password: 'p@ss:w/d', database: 'my db' },
    ],
    // An unencoded @ or ? in the password: the user part ends at the last @ before the first /.
    ['postgres://u:p@ss@db/app', { hosts: ['db'], user: 'u', password: 'p@ss' }],
    ['postgres://u:p?ss@db/app?sslmode=require', { hosts: ['db'], password: 'p?ss', sslmode: 'require' }],
    ['postgres://db?application_name=api', { hosts: ['db'], user: undefined, database: undefined }],
    ['postgres://u@[::1]:5433,db2/app', { hosts: ['::1', 'db2'], ports: [5433, 5432] }],
    ['postgres://u@h1,h2/app?port=7000', { hosts: ['h1', 'h2'], ports: [7000, 7000] }],
    ['postgres://u@h/app?user=other&password=pw&dbname=db2', { user: 'other', password: 'pw', database: 'db2' }],
    ['postgres://u@h/app', { sslmode: 'prefer' }],
    ['postgres://u@h/app?ssl=true', { sslmode: 'require' }],
    ['postgres://u@h/app?sslrootcert=system', { sslmode: 'verify-full' }],
    ['postgres://u@h/app?sslmode=verify-ca', { sslmode: 'verify-ca' }],
    // Ignored, as tuning the service has its own answer to; accepted with the values that ask nothing.
    ['postgres://u@h/app?connect_timeout=10&keepalives=1&sslsni=0&gssencmode=disable&client_encoding=UTF8', {}],
  ]
  for (const [url, expected] of cases) {
    test(url, () => {
      const got = read(url)
      assert.deepEqual(Object.fromEntries(Object.keys(expected).map((k) => [k, got[k as keyof typeof got]])), expected)
    })
  }

  test('application_name, options and target_session_attrs are kept', () => {
    const got = parseConnectionString(
      'postgres://u@h/app?application_name=api-eu&options=-c%20search_path%3Dapi&target_session_attrs=read-write',
    )
    assert.equal(got.applicationName, 'api-eu')
    assert.equal(got.options, '-c search_path=api')
    assert.equal(got.targetSessionAttrs, 'read-write')
  })

  const refused: Array<[string, RegExp]> = [
    ['mysql://u@h/db', /^must be a postgres:\/\/ URL$/],
    ['postgres://u@[db/app', /^must be a postgres:\/\/ URL \(an IPv6 address/],
    ['postgres://app:hunter2%zz@db/app', /^its user, password or host holds a % that is not followed by two hex/],
    ['postgres://app@db/a%zzb', /^its database name holds a %/],
    ['postgres://u@/app', /^names no host: give one .* or the folder of a Unix socket/],
    ['postgres:///app', /^names no host/],
    ['postgres://u@h/app?sslmod=verify-full', /^"sslmod" is not a parameter of a PostgreSQL connection URL/],
    ['postgres://u@h/app?ssl=false', /^"ssl" is not a parameter/],
    [
      'postgres://u@h/app?sslmode=verfy-full',
      /^sslmode must be disable, allow, prefer, require, verify-ca, verify-full/,
    ],
    ['postgres://u@h/app?sslmode', /^its parameter sslmode has no = and value$/],
    ['postgres://u@h/app?a@b', /^a parameter of it has no = and value$/],
    ['postgres://u:12/b@db/app', /^its database name holds an @, as when a password holds an unencoded \/: /],
    ['postgres://u:abc/d@db/app', /^the port after its host must be an integer from 1 to 65535 \(percent-encode a \//],
    ['postgres://u@h/app?hostaddr=10.0.0.1', /^the parameter hostaddr is not supported: give the address as the host/],
    ['postgres://u@h/app?sslcrl=/crl.pem', /^the parameter sslcrl is not supported/],
    [
      'postgres://u@h/app?gssencmode=require',
      /^gssencmode=require is not supported \(the service accepts disable, prefer/,
    ],
    ['postgres://u@h/app?channel_binding=require', /^channel_binding=require is not supported/],
    ['postgres://u@h/app?sslrootcert=system&sslmode=verify-ca', /^sslrootcert=system needs sslmode=verify-full/],
    ['postgres://u@h/app?sslcert=/c.pem', /^sslcert and sslkey: give both/],
    ['postgres://u@h:0/app', /^the port must be an integer from 1 to 65535 \(got "0"\)$/],
    ['postgres://u@h/app?port=x', /^the port must be an integer from 1 to 65535 \(got "x"\)$/],
    ['postgres://u@h1,h2/app?port=1,2,3', /^it gives 3 ports for 2 hosts$/],
    ['postgres://u@h1/app?host=/tmp/run,h2', /^a Unix socket folder cannot be listed with other hosts$/],
    ['postgres://u@h/app?ssl_min_protocol_version=TLSv1.4', /^ssl_min_protocol_version must be TLSv1, TLSv1\.1/],
  ]
  for (const [url, message] of refused) {
    test(`refuses ${url}`, () => {
      assert.throws(() => parseConnectionString(url), { message })
      assert.match(connectionStringProblem(url) ?? '', message)
    })
  }

  test('never repeats a password in what it says', () => {
    for (const url of [
      'postgres://app:hunter2%zz@db/app',
      'postgres://app:hunter2@[db/app',
      'postgres://app:hunter2@db/app?sslmode=bad',
      'postgres://app@db/app?password=hunter2&nonsense=1',
      'postgres://app:hunter/2@db/app',
      'postgres://app:hunter2/x@db/app',
      'postgres://app:4/hunter2@db/app',
    ])
      assert.doesNotMatch(connectionStringProblem(url) ?? 'accepted', /hunter2|accepted/)
  })
})

describe('the TLS options each sslmode gives postgres.js', () => {
  const dir = mkdtempSync(join(tmpdir(), 'upa-connection-string-'))
  after(() => rmSync(dir, { recursive: true, force: true }))
  const authority = createCertificateAuthority(dir)
  const client = certificateFromAuthority(dir, 'client', authority, { names: [], client: true })
  const other = certificateFromAuthority(dir, 'other', authority)
  const options = (query: string) => tlsOptions(parseConnectionString(`postgres://u@db.example.com/app?${query}`))

  test('disable, and any mode on a Unix socket: no TLS; allow and prefer: TLS when offered, unchecked', () => {
    assert.equal(options('sslmode=disable'), false)
    assert.equal(tlsOptions(parseConnectionString('postgres://u@/app?host=/tmp&sslmode=verify-full')), false)
    assert.equal(options(''), 'prefer')
    assert.equal(options('sslmode=allow'), 'prefer')
  })

  test('require checks nothing; with sslrootcert it checks the chain but not the name, as verify-ca', () => {
    assert.deepEqual(options('sslmode=require'), { rejectUnauthorized: false })
    for (const query of [
      `sslmode=require&sslrootcert=${authority.cert}`,
      `sslmode=verify-ca&sslrootcert=${authority.cert}`,
    ]) {
      const tls = options(query)
      assert.ok(typeof tls === 'object')
      assert.equal(tls.rejectUnauthorized, true)
      assert.equal(tls.ca?.length, 1)
      assert.equal(tls.checkServerIdentity?.('elsewhere.example.com', {} as PeerCertificate), undefined)
    }
  })

  test('verify-full checks the chain and the host the URL names, also an address', () => {
    const tls = tlsOptions(parseConnectionString(`postgres://u@127.0.0.1/app?sslmode=verify-full`))
    assert.ok(typeof tls === 'object')
    assert.equal(tls.rejectUnauthorized, true)
    assert.equal(tls.ca, undefined, 'without sslrootcert: the CAs Node trusts (NODE_EXTRA_CA_CERTS among them)')
    const cert = { subject: { CN: 'x' }, subjectaltname: 'DNS:localhost' } as PeerCertificate
    // Node would pass "localhost" for an address, to which postgres.js sends no SNI.
    assert.match(String(tls.checkServerIdentity?.('localhost', cert)), /IP: 127\.0\.0\.1 is not in the cert's list/)
    assert.throws(
      () => tlsOptions(parseConnectionString('postgres://u@10.0.0.1,db2/app?sslmode=verify-full')),
      /sslmode=verify-full with several hosts needs host names, not addresses \(10\.0\.0\.1\)/,
    )
  })

  test('a client certificate and its key; an encrypted key opened by sslpassword', () => {
    const tls = options(`sslmode=require&sslcert=${client.cert}&sslkey=${client.key}`)
    assert.ok(typeof tls === 'object' && typeof tls.cert === 'string' && typeof tls.key === 'string')
    const encrypted = join(dir, 'encrypted.key.pem')
    execFileSync('openssl', ['ec', '-in', client.key, '-aes256', '-passout', 'pass:p&ss', '-out', encrypted], {
      stdio: 'pipe',
    })
    const withKey = (password?: string) =>
      connectionStringProblem(
        `postgres://u@db/app?sslcert=${client.cert}&sslkey=${encrypted}` +
          (password === undefined ? '' : `&sslpassword=${encodeURIComponent(password)}`),
      )
    assert.equal(withKey('p&ss'), undefined)
    assert.match(withKey() ?? '', /^sslkey: .*encrypted\.key\.pem is encrypted, and no sslpassword is given$/)
    assert.match(withKey('wrong') ?? '', /is encrypted, and sslpassword does not open it$/)
  })

  const unusable: Array<[string, () => string, RegExp]> = [
    [
      'an sslrootcert that is not there',
      () => `sslrootcert=${join(dir, 'nope.pem')}`,
      /^sslrootcert: cannot read .*nope\.pem \(no such file\)$/,
    ],
    [
      'an sslrootcert that is a directory',
      () => `sslrootcert=${dir}`,
      /^sslrootcert: cannot read .* \(a directory, not a file\)$/,
    ],
    [
      'an sslrootcert with no certificate in it',
      () => (writeFileSync(join(dir, 'empty.pem'), 'not a certificate\n'), `sslrootcert=${join(dir, 'empty.pem')}`),
      /^sslrootcert: .*empty\.pem holds no PEM certificate$/,
    ],
    [
      "a key that is not the certificate's",
      () => `sslcert=${client.cert}&sslkey=${other.key}`,
      /^sslkey: .*other\.key\.pem is not the key of sslcert .*client\.cert\.pem$/,
    ],
    [
      'a key given as the certificate',
      () => `sslcert=${client.key}&sslkey=${client.key}`,
      /^sslcert: .* is not a PEM certificate$/,
    ],
  ]
  for (const [what, query, message] of unusable) {
    test(`refuses ${what}, naming the parameter and the path`, () => {
      assert.match(connectionStringProblem(`postgres://u@db/app?sslmode=require&${query()}`) ?? '', message)
    })
  }
})

describe('a TLS failure, in words', () => {
  const settings = (query: string): ConnectionString => parseConnectionString(`postgres://u@db/app?${query}`)
  const failure = (code: string, extra: object = {}) => Object.assign(new Error(`some ${code}`), { code }, extra)

  test("a chain that leads to no CA trusted names sslrootcert, or the process's CAs", () => {
    assert.match(
      tlsFailure(failure('UNABLE_TO_VERIFY_LEAF_SIGNATURE'), settings('sslrootcert=/etc/rds.pem'))!,
      /^the server's certificate is not signed by sslrootcert \(\/etc\/rds\.pem\)/,
    )
    assert.match(
      tlsFailure(failure('SELF_SIGNED_CERT_IN_CHAIN'), settings('sslmode=verify-full'))!,
      /not signed by a CA this process trusts \(Node's bundled list and NODE_EXTRA_CA_CERTS\)/,
    )
  })

  test('expired, not yet valid, another host, a refused client certificate', () => {
    assert.match(tlsFailure(failure('CERT_HAS_EXPIRED'), settings(''))!, /has expired \(CERT_HAS_EXPIRED\)$/)
    assert.match(tlsFailure(failure('CERT_NOT_YET_VALID'), settings(''))!, /not valid yet: is this machine's clock/)
    assert.match(
      tlsFailure(
        failure('ERR_TLS_CERT_ALTNAME_INVALID', { host: 'db', cert: { subjectaltname: 'DNS:db.internal' } }),
        settings(''),
      )!,
      /does not match host "db" \(it names DNS:db\.internal\)/,
    )
    assert.match(
      tlsFailure(
        failure('ERR_SSL_TLSV1_ALERT_UNKNOWN_CA', { reason: 'tlsv1 alert unknown ca' }),
        settings('sslcert=/c.pem&sslkey=/k.pem'),
      )!,
      /^the server refused the client certificate \(sslcert \/c\.pem\): tlsv1 alert unknown ca/,
    )
  })

  test('anything else is no TLS failure; TLS failures are the database unavailable (503) to a request', () => {
    assert.equal(tlsFailure(failure('ECONNREFUSED'), settings('')), undefined)
    assert.equal(tlsFailure(failure('28P01'), settings('')), undefined)
    for (const code of ['CERT_HAS_EXPIRED', 'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'ERR_TLS_CERT_ALTNAME_INVALID'])
      assert.equal(classifyDatabaseError(failure(code)), 'unavailable')
  })
})
