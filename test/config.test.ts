import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { describe, test } from 'node:test'
import { ConfigError } from '../src/core/config-error.js'
import { loadConfig, parseJwtSecrets } from '../src/config.js'

// loadConfig on its own, and once through the real entry point: a bad
// setting must stop start-up with a message naming the variable.

const SECRET = 'a'.repeat(32)

/** Asserts loadConfig refuses `env` with a ConfigError whose message starts with the variable's name. */
function assertRefused(env: Record<string, string>, variable: string, also?: RegExp): ConfigError {
  let caught: unknown
  assert.throws(() => loadConfig(env), (err: unknown) => ((caught = err), true))
  assert.ok(caught instanceof ConfigError, `expected a ConfigError, got ${String(caught)}`)
  assert.ok(caught.message.startsWith(`${variable}:`), `message does not start with ${variable}: ${caught.message}`)
  if (also) assert.match(caught.message, also)
  return caught
}

describe('defaults', () => {
  test('an empty environment gives the documented defaults', () => {
    assert.deepEqual(loadConfig({}), {
      production: false,
      port: 3000,
      host: '0.0.0.0',
      databaseUrl: undefined,
      databaseListenUrl: undefined,
      databasePooler: 'auto',
      poolMax: 10,
      apiPrefix: '',
      bodyLimit: 1048576,
      jwtSecrets: [],
      logLevel: 'info',
      shutdownTimeoutMs: 10_000,
      shutdownDelayMs: 0,
      headersTimeoutMs: 10_000,
      requestTimeoutMs: 30_000,
      keepAliveTimeoutMs: 65_000,
      maxConnections: 10_000,
      statementTimeoutMs: 5_000,
      allowSignup: false,
      jwtIssuer: 'users-products-api',
      jwtAudience: 'users-products-api',
      accessTokenTtl: 900,
      refreshTokenTtl: 1209600,
      bootstrapAdmin: undefined,
      requireIfMatch: false,
      rateLimit: 1200,
      maxApiKeysPerUser: 100,
      reauthWindow: 600,
      loginRateLimit: 30,
      trustProxy: 0,
      corsOrigins: new Set(),
      eventsRetentionDays: 30,
      webhookAllowPrivate: false,
      webhookAllowedPorts: new Set(),
      workers: 1,
      tls: undefined,
    })
  })

  test('an empty variable counts as unset', () => {
    const config = loadConfig({ PORT: '', BODY_LIMIT: '', LOG_LEVEL: '', ALLOW_SIGNUP: '', DATABASE_URL: '', HOST: '' })
    assert.equal(config.port, 3000)
    assert.equal(config.bodyLimit, 1048576)
    assert.equal(config.logLevel, 'info')
    assert.equal(config.allowSignup, false)
    assert.equal(config.databaseUrl, undefined)
    assert.equal(config.host, '0.0.0.0')
  })

  test('ignores variables it does not know', () => {
    assert.deepEqual(loadConfig({ SOMETHING_ELSE: 'x', PATH: '/bin' }), loadConfig({}))
  })
})

describe('values', () => {
  test('reads every setting, converting seconds to milliseconds', () => {
    const config = loadConfig({
      PORT: '8080',
      HOST: '127.0.0.1',
      DATABASE_URL: 'postgresql://u:p@db:5432/app',
      DATABASE_LISTEN_URL: 'postgres://u:p@db-direct:5432/app',
      DATABASE_POOLER: 'transaction',
      DATABASE_POOL_MAX: '25',
      API_PREFIX: '/api/v1',
      BODY_LIMIT: '2048',
      JWT_SECRETS: `k1:${SECRET}`,
      LOG_LEVEL: 'warn',
      SHUTDOWN_TIMEOUT: '3',
      SHUTDOWN_DELAY: '5',
      HEADERS_TIMEOUT: '4',
      REQUEST_TIMEOUT: '6',
      KEEP_ALIVE_TIMEOUT: '7',
      MAX_CONNECTIONS: '500',
      STATEMENT_TIMEOUT: '8',
      ALLOW_SIGNUP: 'true',
      JWT_ISSUER: 'issuer',
      JWT_AUDIENCE: 'audience',
      ACCESS_TOKEN_TTL: '60',
      REFRESH_TOKEN_TTL: '3600',
      ADMIN_EMAIL: 'root@example.com',
      ADMIN_PASSWORD: 'long enough',
      REQUIRE_IF_MATCH: 'true',
      RATE_LIMIT: '0',
      MAX_API_KEYS_PER_USER: '7',
      REAUTH_WINDOW: '30',
      LOGIN_RATE_LIMIT: '0',
      TRUST_PROXY: '10.0.0.1,10.0.0.2',
      CORS_ORIGINS: 'https://app.example.com,http://localhost:5173',
      EVENTS_RETENTION_DAYS: '7',
      WEBHOOK_ALLOW_PRIVATE: 'true',
      WEBHOOK_ALLOWED_PORTS: '8443,9443',
      WORKERS: '4',
      TLS_CERT_FILE: '/etc/api/cert.pem',
      TLS_KEY_FILE: '/etc/api/key.pem',
    })
    assert.deepEqual(config, {
      production: false,
      port: 8080,
      host: '127.0.0.1',
      databaseUrl: 'postgresql://u:p@db:5432/app',
      databaseListenUrl: 'postgres://u:p@db-direct:5432/app',
      databasePooler: 'transaction',
      poolMax: 25,
      apiPrefix: '/api/v1',
      bodyLimit: 2048,
      jwtSecrets: [{ kid: 'k1', secret: Buffer.from(SECRET) }],
      logLevel: 'warn',
      shutdownTimeoutMs: 3000,
      shutdownDelayMs: 5000,
      headersTimeoutMs: 4000,
      requestTimeoutMs: 6000,
      keepAliveTimeoutMs: 7000,
      maxConnections: 500,
      statementTimeoutMs: 8000,
      allowSignup: true,
      jwtIssuer: 'issuer',
      jwtAudience: 'audience',
      accessTokenTtl: 60,
      refreshTokenTtl: 3600,
      bootstrapAdmin: { email: 'root@example.com', password: 'long enough' },
      requireIfMatch: true,
      rateLimit: 0,
      maxApiKeysPerUser: 7,
      reauthWindow: 30,
      loginRateLimit: 0,
      trustProxy: new Set(['10.0.0.1', '10.0.0.2']),
      corsOrigins: new Set(['https://app.example.com', 'http://localhost:5173']),
      eventsRetentionDays: 7,
      webhookAllowPrivate: true,
      webhookAllowedPorts: new Set([8443, 9443]),
      workers: 4,
      tls: { certFile: '/etc/api/cert.pem', keyFile: '/etc/api/key.pem' },
    })
  })

  for (const [name, value, key, expected] of [
    ['PORT', '0', 'port', 0],
    ['PORT', '65535', 'port', 65535],
    ['BODY_LIMIT', '1', 'bodyLimit', 1],
    ['BODY_LIMIT', '1073741824', 'bodyLimit', 1073741824],
    ['LOG_LEVEL', 'debug', 'logLevel', 'debug'],
    ['LOG_LEVEL', 'error', 'logLevel', 'error'],
    ['ALLOW_SIGNUP', 'false', 'allowSignup', false],
    ['API_PREFIX', '', 'apiPrefix', ''],
    ['NODE_ENV', 'development', 'production', false],
    ['NODE_ENV', 'test', 'production', false],
  ] as const) {
    test(`accepts ${name}=${JSON.stringify(value)}`, () => {
      assert.equal(loadConfig({ [name]: value })[key], expected)
    })
  }
})

describe('refused values', () => {
  const refused: Array<[string, string]> = [
    ['PORT', 'abc'],
    ['PORT', '65536'],
    ['PORT', '-1'],
    ['PORT', '1.5'],
    ['PORT', ' 80'],
    ['PORT', '0x50'],
    ['PORT', '99999999999999999999999'],
    ['BODY_LIMIT', '0'],
    ['BODY_LIMIT', '1e6'],
    ['BODY_LIMIT', '1mb'],
    ['BODY_LIMIT', '1073741825'],
    ['DATABASE_POOL_MAX', '0'],
    ['SHUTDOWN_TIMEOUT', '3601'],
    ['SHUTDOWN_DELAY', '3601'],
    ['SHUTDOWN_DELAY', '-1'],
    ['HEADERS_TIMEOUT', '0'],
    ['LOG_LEVEL', 'verbose'],
    ['EVENTS_RETENTION_DAYS', '0'],
    ['EVENTS_RETENTION_DAYS', '3651'],
    ['EVENTS_RETENTION_DAYS', '1.5'],
    ['WEBHOOK_ALLOW_PRIVATE', 'yes'],
    ['WEBHOOK_ALLOW_PRIVATE', 'TRUE'],
    ['WEBHOOK_ALLOWED_PORTS', '0'],
    ['WEBHOOK_ALLOWED_PORTS', '65536'],
    ['WEBHOOK_ALLOWED_PORTS', '8443,'],
    ['WEBHOOK_ALLOWED_PORTS', '8443, 9443'],
    ['WEBHOOK_ALLOWED_PORTS', 'https'],
    ['LOG_LEVEL', 'INFO'],
    ['ALLOW_SIGNUP', 'yes'],
    ['ALLOW_SIGNUP', 'TRUE'],
    ['ALLOW_SIGNUP', '1'],
    ['API_PREFIX', 'v1'],
    ['API_PREFIX', '/v1/'],
    ['API_PREFIX', '/'],
    ['API_PREFIX', '/v 1'],
    ['DATABASE_URL', 'mysql://u@h/db'],
    ['DATABASE_URL', 'postgres://u@[db/app'],
    ['DATABASE_LISTEN_URL', 'mysql://u@h/db'],
    ['DATABASE_LISTEN_URL', 'postgres://u@[db/app'],
    ['DATABASE_LISTEN_URL', 'db.example.com'],
    ['DATABASE_POOLER', 'pgbouncer'],
    ['DATABASE_POOLER', 'TRANSACTION'],
    ['MAX_API_KEYS_PER_USER', '0'],
    ['MAX_API_KEYS_PER_USER', '-1'],
    ['MAX_API_KEYS_PER_USER', 'many'],
    ['MAX_CONNECTIONS', '0'],
    ['MAX_CONNECTIONS', '1000001'],
    ['REAUTH_WINDOW', 'soon'],
    ['REAUTH_WINDOW', '-1'],
    ['LOGIN_RATE_LIMIT', '-1'],
    ['LOGIN_RATE_LIMIT', '1000001'],
  ]
  for (const [name, value] of refused) {
    test(`refuses ${name}=${JSON.stringify(value)} with a ConfigError naming ${name}`, () => {
      assertRefused({ [name]: value }, name)
    })
  }

  test('names the bad variable even when others are valid', () => {
    assertRefused({ PORT: '8080', LOG_LEVEL: 'loud', BODY_LIMIT: '10' }, 'LOG_LEVEL', /debug, info, warn or error/)
  })

  test('quotes an ordinary bad value back', () => {
    assertRefused({ PORT: 'abc' }, 'PORT', /"abc"/)
  })

  test('does not echo a DATABASE_URL, which may hold a password', () => {
    const err = assertRefused({ DATABASE_URL: 'mysql://app:hunter2-secret@db/app' }, 'DATABASE_URL')
    assert.doesNotMatch(err.message, /hunter2/)
  })

  test('does not echo a malformed DATABASE_LISTEN_URL either, whether its scheme or its syntax is wrong', () => {
    const url = 'postgres://app@db/app'
    for (const bad of ['mysql://app:hunter2-secret@db/app', 'postgres://app:hunter2-secret@[db/app']) {
      const err = assertRefused({ DATABASE_URL: url, DATABASE_LISTEN_URL: bad }, 'DATABASE_LISTEN_URL', /postgres:\/\/ URL/)
      assert.doesNotMatch(err.message, /hunter2/)
    }
  })
})

describe('DATABASE_LISTEN_URL and DATABASE_POOLER', () => {
  const url = 'postgres://app:pw@pgbouncer:6432/app'
  const listen = 'postgres://app:pw@db:5432/app'
  test('both are read; DATABASE_POOLER is auto unless set', () => {
    const config = loadConfig({ DATABASE_URL: url, DATABASE_LISTEN_URL: listen })
    assert.equal(config.databaseListenUrl, listen)
    assert.equal(config.databasePooler, 'auto')
    assert.equal(loadConfig({ DATABASE_URL: url, DATABASE_POOLER: 'none' }).databasePooler, 'none')
    assert.equal(loadConfig({ DATABASE_URL: url, DATABASE_LISTEN_URL: listen, DATABASE_POOLER: 'transaction' }).databasePooler, 'transaction')
  })

  test('refuses DATABASE_LISTEN_URL without DATABASE_URL (it names the same database)', () => {
    assertRefused({ DATABASE_LISTEN_URL: listen }, 'DATABASE_LISTEN_URL', /DATABASE_URL/)
  })

  test('refuses DATABASE_POOLER=transaction without DATABASE_LISTEN_URL, naming what to set', () => {
    assertRefused({ DATABASE_URL: url, DATABASE_POOLER: 'transaction' }, 'DATABASE_POOLER', /DATABASE_LISTEN_URL/)
  })
})

describe('production', () => {
  const url = 'postgres://app@db/app'
  test('refuses NODE_ENV=production without DATABASE_URL', () => {
    assertRefused({ NODE_ENV: 'production', JWT_SECRETS: `k:${SECRET}` }, 'DATABASE_URL', /required/)
  })

  test('refuses NODE_ENV=production without JWT_SECRETS', () => {
    assertRefused({ NODE_ENV: 'production', DATABASE_URL: url }, 'JWT_SECRETS', /required/)
    assertRefused({ NODE_ENV: 'production', DATABASE_URL: url, JWT_SECRETS: '' }, 'JWT_SECRETS', /required/)
  })

  test('starts in production with both', () => {
    const config = loadConfig({ NODE_ENV: 'production', DATABASE_URL: url, JWT_SECRETS: `k:${SECRET}` })
    assert.equal(config.production, true)
    assert.equal(config.databaseUrl, url)
    assert.equal(config.jwtSecrets.length, 1)
  })
})

describe('JWT_SECRETS', () => {
  test('keeps the order of kid:secret pairs (the first signs) and uses the secret bytes as given', () => {
    const secrets = parseJwtSecrets(`new:${SECRET},old:${'b'.repeat(40)}`)
    assert.deepEqual(secrets.map((s) => s.kid), ['new', 'old'])
    assert.deepEqual(secrets[1]!.secret, Buffer.from('b'.repeat(40)))
  })

  test('keeps colons inside a secret', () => {
    const secret = `${SECRET}:with:colons`
    assert.deepEqual(parseJwtSecrets(`k:${secret}`)[0]!.secret, Buffer.from(secret))
  })

  test('counts secret length in UTF-8 bytes: 16 two-byte characters are enough', () => {
    assert.equal(parseJwtSecrets(`k:${'é'.repeat(16)}`)[0]!.secret.length, 32)
  })

  const refused: Array<[string, string, RegExp]> = [
    ['a 31-byte secret', `k:${'a'.repeat(31)}`, /at least 32 bytes/],
    ['a short second secret', `k1:${SECRET},k2:short`, /kid "k2".*at least 32 bytes/],
    ['a duplicate kid', `k:${SECRET},k:${'b'.repeat(32)}`, /kid "k" appears twice/],
    ['a missing kid', `:${SECRET}`, /kid:secret/],
    ['no colon', SECRET, /kid:secret/],
    ['a kid with a space', `my key:${SECRET}`, /kid:secret/],
    ['an empty entry', `k:${SECRET},`, /entry 2/],
  ]
  for (const [what, value, message] of refused) {
    test(`refuses ${what} with a ConfigError naming JWT_SECRETS`, () => {
      const err = assertRefused({ JWT_SECRETS: value }, 'JWT_SECRETS', message)
      assert.doesNotMatch(err.message, /aaaaaaaa|bbbbbbbb/, 'the message echoes a secret')
    })
  }
})

describe('the entry point', () => {
  const main = fileURLToPath(new URL('../src/main.ts', import.meta.url))
  const run = (env: Record<string, string>) =>
    new Promise<{ code: number | null; stderr: string }>((resolve) => {
      const child = execFile(process.execPath, ['--import', 'tsx', main], { env: { ...process.env, DATABASE_URL: '', ...env }, timeout: 20_000 }, (_err, _stdout, stderr) =>
        resolve({ code: child.exitCode, stderr }),
      )
    })

  test('exits non-zero with stderr naming PORT when PORT=abc', async () => {
    const { code, stderr } = await run({ PORT: 'abc' })
    assert.notEqual(code, 0)
    assert.notEqual(code, null, 'the process did not exit by itself')
    assert.match(stderr, /PORT/)
    assert.match(stderr, /^Cannot start: PORT: /m)
    assert.doesNotMatch(stderr, /\n\s+at /, 'a configuration error should not print a stack trace')
  })

  test('exits non-zero without echoing the password of a malformed DATABASE_URL', async () => {
    const { code, stderr } = await run({ DATABASE_URL: 'mysql://app:hunter2-secret@db/app' })
    assert.equal(code, 1)
    assert.match(stderr, /DATABASE_URL/)
    assert.doesNotMatch(stderr, /hunter2/)
  })

  test('exits 1 naming DATABASE_LISTEN_URL, without echoing its password, when it does not parse', async () => {
    const { code, stderr } = await run({ DATABASE_URL: 'postgres://app@127.0.0.1:1/app', DATABASE_LISTEN_URL: 'postgres://app:hunter2-secret@[db/app' })
    assert.equal(code, 1)
    assert.match(stderr, /^Cannot start: DATABASE_LISTEN_URL: /m)
    assert.doesNotMatch(stderr, /hunter2/)
  })
})
