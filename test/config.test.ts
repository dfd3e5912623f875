import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import { ConfigError } from '../src/core/config-error.js'
import { KNOWN_VARIABLES, loadConfig, parseJwtSecrets, readConfig, SECRET_VARIABLES } from '../src/config.js'
import { suspectVariables } from '../src/config-names.js'
import { runCommand } from './fault-kit.js'

// loadConfig on its own, and once through the real entry point: a bad
// setting must stop start-up with a message naming the variable.

const SECRET = 'a'.repeat(32)

/** Asserts loadConfig refuses `env` with a ConfigError whose message starts with the variable's name. */
function assertRefused(env: Record<string, string>, variable: string, also?: RegExp): ConfigError {
  let caught: unknown
  assert.throws(
    () => loadConfig(env),
    (err: unknown) => ((caught = err), true),
  )
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
      host: '127.0.0.1',
      databaseUrl: undefined,
      databaseListenUrl: undefined,
      databaseMigrationUrl: undefined,
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
      mfaRequired: 'none',
      loginRateLimit: 30,
      trustProxy: 0,
      corsOrigins: new Set(),
      eventsRetentionDays: 30,
      trashRetention: 2592000,
      webhookAllowPrivate: false,
      webhookAllowedPorts: new Set(),
      workers: 1,
      passwordResetUrl: undefined,
      verifyEmailUrl: undefined,
      emailRestoreUrl: undefined,
      passwordResetTtl: 3600,
      passwordHashCost: 15,
      requireVerifiedEmail: false,
      mail: { via: 'none' },
      oidc: undefined,
      oidcLocalPasswords: false,
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
    assert.equal(config.host, '127.0.0.1')
  })

  test('HOST: 127.0.0.1 in development (this machine only), 0.0.0.0 in production; a HOST set wins in both', () => {
    const production = { NODE_ENV: 'production', DATABASE_URL: 'postgres://app@db/app', JWT_SECRETS: `k:${SECRET}` }
    assert.equal(loadConfig({}).host, '127.0.0.1')
    assert.equal(loadConfig({ NODE_ENV: 'development' }).host, '127.0.0.1')
    assert.equal(loadConfig(production).host, '0.0.0.0')
    assert.equal(loadConfig({ HOST: '0.0.0.0' }).host, '0.0.0.0')
    assert.equal(loadConfig({ ...production, HOST: '10.0.0.5' }).host, '10.0.0.5')
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
      DATABASE_MIGRATION_URL: 'postgres://owner:p@db-direct:5432/app',
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
      TRASH_RETENTION: '86400',
      WEBHOOK_ALLOW_PRIVATE: 'true',
      WEBHOOK_ALLOWED_PORTS: '8443,9443',
      WORKERS: '4',
      OIDC_LOCAL_PASSWORDS: 'true',
      TLS_CERT_FILE: '/etc/api/cert.pem',
      TLS_KEY_FILE: '/etc/api/key.pem',
    })
    assert.deepEqual(config, {
      production: false,
      port: 8080,
      host: '127.0.0.1',
      databaseUrl: 'postgresql://u:p@db:5432/app',
      databaseListenUrl: 'postgres://u:p@db-direct:5432/app',
      databaseMigrationUrl: 'postgres://owner:p@db-direct:5432/app',
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
      mfaRequired: 'none',
      loginRateLimit: 0,
      trustProxy: new Set(['10.0.0.1', '10.0.0.2']),
      corsOrigins: new Set(['https://app.example.com', 'http://localhost:5173']),
      eventsRetentionDays: 7,
      trashRetention: 86400,
      webhookAllowPrivate: true,
      webhookAllowedPorts: new Set([8443, 9443]),
      workers: 4,
      passwordResetUrl: undefined,
      verifyEmailUrl: undefined,
      emailRestoreUrl: undefined,
      passwordResetTtl: 3600,
      passwordHashCost: 15,
      requireVerifiedEmail: false,
      mail: { via: 'none' },
      oidc: undefined,
      oidcLocalPasswords: true,
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
    ['OIDC_LOCAL_PASSWORDS', 'false', 'oidcLocalPasswords', false],
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
    ['TRASH_RETENTION', '59'],
    ['TRASH_RETENTION', '30d'],
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
    ['OIDC_LOCAL_PASSWORDS', 'yes'],
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
    ['PASSWORD_HASH_COST', '9'],
    ['PASSWORD_HASH_COST', '18'],
    ['PASSWORD_HASH_COST', 'high'],
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
      const err = assertRefused(
        { DATABASE_URL: url, DATABASE_LISTEN_URL: bad },
        'DATABASE_LISTEN_URL',
        /postgres:\/\/ URL/,
      )
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
    assert.equal(
      loadConfig({ DATABASE_URL: url, DATABASE_LISTEN_URL: listen, DATABASE_POOLER: 'transaction' }).databasePooler,
      'transaction',
    )
  })

  test('refuses DATABASE_LISTEN_URL without DATABASE_URL (it names the same database)', () => {
    assertRefused({ DATABASE_LISTEN_URL: listen }, 'DATABASE_LISTEN_URL', /DATABASE_URL/)
  })

  test('refuses DATABASE_POOLER=transaction without DATABASE_LISTEN_URL, naming what to set', () => {
    assertRefused({ DATABASE_URL: url, DATABASE_POOLER: 'transaction' }, 'DATABASE_POOLER', /DATABASE_LISTEN_URL/)
  })
})

describe('DATABASE_MIGRATION_URL', () => {
  const owner = 'postgres://owner:hunter2-secret@db:5432/app'
  test('is read; refused without DATABASE_URL (it names the same database); never echoed when malformed', () => {
    assert.equal(
      loadConfig({ DATABASE_URL: 'postgres://app@db/app', DATABASE_MIGRATION_URL: owner }).databaseMigrationUrl,
      owner,
    )
    assertRefused({ DATABASE_MIGRATION_URL: owner }, 'DATABASE_MIGRATION_URL', /DATABASE_URL/)
    for (const bad of ['mysql://owner:hunter2-secret@db/app', 'postgres://owner:hunter2-secret@[db/app']) {
      const err = assertRefused(
        { DATABASE_URL: 'postgres://app@db/app', DATABASE_MIGRATION_URL: bad },
        'DATABASE_MIGRATION_URL',
        /postgres:\/\/ URL/,
      )
      assert.doesNotMatch(err.message, /hunter2/)
    }
  })
})

describe('database URLs, as libpq reads them (one reading for the three variables)', () => {
  const url = 'postgres://app@db/app'
  test("libpq's socket forms and TLS parameters are accepted, and the URL kept as given", () => {
    const env = {
      DATABASE_URL: 'postgres://app@/app?host=/run/postgresql',
      DATABASE_LISTEN_URL: 'postgresql:///app?host=%2Frun%2Fpostgresql&user=app',
      DATABASE_MIGRATION_URL: 'postgres://owner:p%40ss@db.example.com/app?sslmode=verify-full&sslrootcert=system',
    }
    const config = loadConfig(env)
    assert.deepEqual(
      [config.databaseUrl, config.databaseListenUrl, config.databaseMigrationUrl],
      [env.DATABASE_URL, env.DATABASE_LISTEN_URL, env.DATABASE_MIGRATION_URL],
    )
  })

  test('what cannot work is one line naming its variable, for each of the three, never the URL', () => {
    assert.deepEqual(
      problemsOf({
        DATABASE_URL: `${url}?sslmod=verify-full&password=hunter2`,
        DATABASE_LISTEN_URL: `${url}?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem`,
        DATABASE_MIGRATION_URL: 'postgres://owner:hunter2@db/app?sslrootcert=system&sslmode=require',
      }),
      [
        'DATABASE_URL: "sslmod" is not a parameter of a PostgreSQL connection URL (libpq\'s; docs/operations.md, ' +
          '"TLS to the database", lists those read)',
        'DATABASE_LISTEN_URL: sslrootcert: cannot read /nonexistent/ca.pem (no such file)',
        'DATABASE_MIGRATION_URL: sslrootcert=system needs sslmode=verify-full (got require): anyone can have a ' +
          'public CA certify a name they control, so only the host name check makes it safe',
      ],
    )
  })

  test('from a file, the _FILE variable and its path are named', () => {
    const dir = mkdtempSync(join(tmpdir(), 'upa-config-url-'))
    after(() => rmSync(dir, { recursive: true, force: true }))
    const path = join(dir, 'url')
    writeFileSync(path, `${url}?sslmode=verify-full&sslcert=/c.pem\n`)
    assert.deepEqual(problemsOf({ DATABASE_URL_FILE: path }), [
      `DATABASE_URL_FILE (${path}): sslcert and sslkey: give both (the client certificate and its key) or neither`,
    ])
  })
})

describe('production', () => {
  const url = 'postgres://app@db/app'
  test('refuses NODE_ENV=production without DATABASE_URL', () => {
    assertRefused({ NODE_ENV: 'production', JWT_SECRETS: `k:${SECRET}` }, 'DATABASE_URL', /required/)
  })

  test('refuses NODE_ENV=production without JWT_SECRETS, saying what they are and how to make one', () => {
    assertRefused({ NODE_ENV: 'production', DATABASE_URL: url }, 'JWT_SECRETS', /required/)
    assertRefused({ NODE_ENV: 'production', DATABASE_URL: url, JWT_SECRETS: '' }, 'JWT_SECRETS', /required/)
    assertRefused({ NODE_ENV: 'production', DATABASE_URL: url }, 'JWT_SECRETS', /kid:secret.*openssl rand -base64 48/)
    // The command it gives makes a secret the service takes.
    const made = spawnSync('sh', ['-c', 'echo "k1:$(openssl rand -base64 48)"'], { encoding: 'utf8' })
    if (made.status === 0) {
      const config = loadConfig({ NODE_ENV: 'production', DATABASE_URL: url, JWT_SECRETS: made.stdout.trim() })
      assert.equal(config.jwtSecrets[0]?.kid, 'k1')
    }
  })

  test('the migrate and admin commands sign nothing: in production they need no JWT_SECRETS', () => {
    for (const purpose of ['migrate', 'admin'] as const) {
      const config = loadConfig({ NODE_ENV: 'production', DATABASE_URL: url }, purpose)
      assert.deepEqual([config.production, config.jwtSecrets], [true, []], purpose)
    }
    assert.throws(() => loadConfig({ NODE_ENV: 'production' }, 'migrate'), {
      message: 'DATABASE_URL: required when NODE_ENV=production',
    })
  })

  test('starts in production with both', () => {
    const config = loadConfig({ NODE_ENV: 'production', DATABASE_URL: url, JWT_SECRETS: `k:${SECRET}` })
    assert.equal(config.production, true)
    assert.equal(config.databaseUrl, url)
    assert.equal(config.jwtSecrets.length, 1)
    assert.equal(config.passwordHashCost, 15)
  })

  test('refuses a PASSWORD_HASH_COST below 15 in production, which development and tests may use', () => {
    const production = { NODE_ENV: 'production', DATABASE_URL: url, JWT_SECRETS: `k:${SECRET}` }
    assertRefused(
      { ...production, PASSWORD_HASH_COST: '14' },
      'PASSWORD_HASH_COST',
      /at least 15 when NODE_ENV=production/,
    )
    assertRefused({ ...production, PASSWORD_HASH_COST: '10' }, 'PASSWORD_HASH_COST', /got "10"/)
    assert.equal(loadConfig({ ...production, PASSWORD_HASH_COST: '15' }).passwordHashCost, 15)
    assert.equal(loadConfig({ ...production, PASSWORD_HASH_COST: '17' }).passwordHashCost, 17)
    assert.equal(loadConfig({ PASSWORD_HASH_COST: '10' }).passwordHashCost, 10)
  })
})

/** The lines of the ConfigError `env` gives (none: it passes). */
function problemsOf(env: Record<string, string | undefined>): readonly string[] {
  try {
    readConfig(env)
    return []
  } catch (err) {
    assert.ok(err instanceof ConfigError, `expected a ConfigError, got ${String(err)}`)
    return err.problems
  }
}

describe('every problem at once', () => {
  test('NODE_ENV=production with nothing else: DATABASE_URL and JWT_SECRETS together, one line each', () => {
    assert.deepEqual(problemsOf({ NODE_ENV: 'production' }), [
      'DATABASE_URL: required when NODE_ENV=production',
      'JWT_SECRETS: required when NODE_ENV=production: comma-separated kid:secret pairs, each secret at least 32 ' +
        'bytes, the first signing; make one with echo "k1:$(openssl rand -base64 48)"',
    ])
  })

  test('bad values of several variables: one line per variable, each naming it; the message is the lines', () => {
    const env = {
      PORT: 'abc',
      LOG_LEVEL: 'loud',
      BODY_LIMIT: '0',
      WORKERS: '0',
      JWT_SECRETS: 'k:short',
      ADMIN_EMAIL: 'root@example.com',
      WEBHOOK_ALLOWED_PORTS: '70000',
    }
    const lines = problemsOf(env)
    assert.deepEqual(lines.map((l) => l.split(':')[0]).sort(), [
      'ADMIN_EMAIL and ADMIN_PASSWORD',
      'BODY_LIMIT',
      'JWT_SECRETS',
      'LOG_LEVEL',
      'PORT',
      'WEBHOOK_ALLOWED_PORTS',
      'WORKERS',
    ])
    assert.ok(lines.includes('PORT: must be an integer from 0 to 65535 (got "abc")'), lines.join('\n'))
    assert.ok(lines.includes('JWT_SECRETS: the secret of kid "k" must be at least 32 bytes'), lines.join('\n'))
    assert.throws(
      () => loadConfig(env),
      (err: unknown) => err instanceof ConfigError && err.message === lines.join('\n'),
    )
  })

  test('one cause gives one line: a DATABASE_URL that is not a URL is not also "required"', () => {
    assert.deepEqual(
      problemsOf({ NODE_ENV: 'production', DATABASE_URL: 'mysql://u:hunter2@db/app', JWT_SECRETS: `k:${SECRET}` }),
      ['DATABASE_URL: must be a postgres:// URL'],
    )
  })

  test(
    'a % in the password that is not an escape (%zz) is refused here, naming DATABASE_URL, without echoing it ' +
      '(the driver would throw "URI malformed")',
    () => {
      for (const name of ['DATABASE_URL', 'DATABASE_LISTEN_URL']) {
        const env = { DATABASE_URL: 'postgres://app:pw@db/app', [name]: 'postgres://app:hunter2%zz@db:5432/app' }
        const [line, ...others] = problemsOf(env)
        assert.deepEqual(others, [])
        assert.match(
          line!,
          new RegExp(
            `^${name}: its user, password or host holds a % that is not followed by two hexadecimal digits; write a ` +
              `% as %25`,
          ),
        )
        assert.doesNotMatch(line!, /hunter2/)
      }
      assert.equal(
        loadConfig({ DATABASE_URL: 'postgres://app:50%25off@db/app' }).databaseUrl,
        'postgres://app:50%25off@db/app',
      )
    },
  )
})

describe('<NAME>_FILE', () => {
  const dir = mkdtempSync(join(tmpdir(), 'upa-secrets-'))
  after(() => rmSync(dir, { recursive: true, force: true }))
  const file = (name: string, content: string) => {
    const path = join(dir, name)
    writeFileSync(path, content)
    return path
  }
  const url = 'postgres://app:from-a-file@db:5432/app'

  test('each secret is read from its file, less one trailing newline', () => {
    const config = loadConfig({
      NODE_ENV: 'production',
      DATABASE_URL_FILE: file('url', `${url}\n`),
      DATABASE_LISTEN_URL_FILE: file('listen', 'postgres://app:direct@db-direct/app\r\n'),
      JWT_SECRETS_FILE: file('jwt', `k1:${SECRET}\n`),
      ADMIN_EMAIL: 'root@example.com',
      ADMIN_PASSWORD_FILE: file('admin', 'no newline at all'),
    })
    assert.equal(config.databaseUrl, url)
    assert.equal(config.databaseListenUrl, 'postgres://app:direct@db-direct/app')
    assert.deepEqual(config.jwtSecrets, [{ kid: 'k1', secret: Buffer.from(SECRET) }])
    assert.deepEqual(config.bootstrapAdmin, { email: 'root@example.com', password: 'no newline at all' })
  })

  test(
    'a file of more than one line, or not text, is refused: one line naming the _FILE variable and the path, ' +
      'never the content',
    () => {
      const shadow = 'root:$6$hunter2salt$hunter2hash:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n'
      const cases: Record<string, string> = {
        'a file like /etc/shadow': shadow,
        'a second line after the final newline': `k1:${SECRET}\nhunter2\n`,
        'two final newlines': `k1:${SECRET}\n\n`,
        'two final CRLFs': `k1:${SECRET}\r\n\r\n`,
        'a lone carriage return at the end': `k1:${SECRET}\r`,
        'a carriage return inside': `k1:${SECRET}\rhunter2`,
        'a blank first line': `\nk1:${SECRET}`,
      }
      for (const [i, [name, content]] of Object.entries(cases).entries()) {
        const path = file(`multi-${i}`, content)
        const lines = problemsOf({ JWT_SECRETS_FILE: path })
        assert.deepEqual(
          lines,
          [
            `JWT_SECRETS_FILE: ${path} holds more than one line: a secret file holds one line (and at most a final ` +
              'newline)',
          ],
          name,
        )
        assert.doesNotMatch(lines.join('\n'), /hunter2|root:|daemon|aaaa/, `${name}: the content is echoed`)
      }
      const nul = file('nul', `k1:${SECRET}\0hunter2\n`)
      assert.deepEqual(problemsOf({ JWT_SECRETS_FILE: nul }), [
        `JWT_SECRETS_FILE: ${nul} holds a NUL byte: a secret file holds one line of text`,
      ])
      const der = file('der', '')
      writeFileSync(der, Buffer.from([0x30, 0x82, 0x01, 0x0a, 0x02, 0x82, 0x01, 0x01, 0x00, 0xc3, 0xff]))
      assert.deepEqual(problemsOf({ DATABASE_URL_FILE: der }), [
        `DATABASE_URL_FILE: ${der} is not UTF-8 text: a secret file holds one line of text`,
      ])
      // Every secret is held to it, the admin's password too.
      const password = file('password', 'first line\nsecond line\n')
      assert.deepEqual(problemsOf({ ADMIN_EMAIL: 'root@example.com', ADMIN_PASSWORD_FILE: password }), [
        `ADMIN_PASSWORD_FILE: ${password} holds more than one line: a secret file holds one line (and at most a ` +
          'final newline)',
      ])
    },
  )

  test('a secret file counts for "required in production"', () => {
    assert.deepEqual(problemsOf({ NODE_ENV: 'production', DATABASE_URL_FILE: file('url2', url) }), [
      'JWT_SECRETS: required when NODE_ENV=production: comma-separated kid:secret pairs, each secret at least 32 ' +
        'bytes, the first signing; make one with echo "k1:$(openssl rand -base64 48)"',
    ])
  })

  test('a variable and its _FILE twin together: an error naming both', () => {
    assert.deepEqual(problemsOf({ DATABASE_URL: url, DATABASE_URL_FILE: file('url3', url) }), [
      'DATABASE_URL and DATABASE_URL_FILE: both are set; set one or the other',
    ])
  })

  test(
    'a file that cannot be read, or is empty: an error naming the _FILE variable and the path, never the ' + 'content',
    () => {
      const missing = join(dir, 'missing')
      const empty = file('empty', '\n')
      const unreadable = file('unreadable', `k:${SECRET}`)
      chmodSync(unreadable, 0o000)
      const lines = problemsOf({
        DATABASE_URL_FILE: missing,
        ADMIN_EMAIL: 'root@example.com',
        ADMIN_PASSWORD_FILE: empty,
        JWT_SECRETS_FILE: dir,
      })
      assert.deepEqual(lines, [
        `DATABASE_URL_FILE: cannot read ${missing} (no such file)`,
        `JWT_SECRETS_FILE: cannot read ${dir} (a directory, not a file)`,
        `ADMIN_PASSWORD_FILE: ${empty} is empty`,
      ])
      // Root reads any file whatever its mode; the check is for the service's own unprivileged user.
      if (process.getuid?.() !== 0)
        assert.deepEqual(problemsOf({ JWT_SECRETS_FILE: unreadable }), [
          `JWT_SECRETS_FILE: cannot read ${unreadable} (permission denied)`,
        ])
    },
  )

  test('a bad value read from a file names the _FILE variable and its path, not the value', () => {
    const path = file('bad-url', 'mysql://app:hunter2@db/app')
    assert.deepEqual(problemsOf({ DATABASE_URL_FILE: path }), [
      `DATABASE_URL_FILE (${path}): must be a postgres:// URL`,
    ])
    const jwt = file('bad-jwt', `k:${'a'.repeat(31)}`)
    assert.deepEqual(problemsOf({ JWT_SECRETS_FILE: jwt }), [
      `JWT_SECRETS_FILE (${jwt}): the secret of kid "k" must be at least 32 bytes`,
    ])
  })

  test('an empty _FILE counts as unset', () => {
    assert.equal(loadConfig({ DATABASE_URL: url, DATABASE_URL_FILE: '' }).databaseUrl, url)
  })
})

describe('misspelt variables', () => {
  const url = 'postgres://app@db/app'

  test(
    'DATABSE_URL alone stops start-up, naming DATABASE_URL (the service would otherwise run on the development ' +
      'database)',
    () => {
      assert.deepEqual(problemsOf({ DATABSE_URL: url }), [
        'DATABSE_URL: not a variable of this service; did you mean DATABASE_URL?',
      ])
    },
  )

  test('the same near-names, each refused naming the variable it was meant for', () => {
    const cases: Array<[string, string]> = [
      ['JWT_SECRET', 'JWT_SECRETS'],
      ['DATABASE_URI', 'DATABASE_URL'],
      ['LOG_LEVLE', 'LOG_LEVEL'],
      ['WORKER', 'WORKERS'],
      ['PROT', 'PORT'],
      ['API_PREFX', 'API_PREFIX'],
      ['DATABASE_URL_FIEL', 'DATABASE_URL_FILE'],
    ]
    for (const [name, meant] of cases)
      assert.deepEqual(
        problemsOf({ [name]: 'x' }),
        [`${name}: not a variable of this service; did you mean ${meant}?`],
        name,
      )
  })

  test('the wrong case, and _FILE on a variable that is not a secret', () => {
    assert.deepEqual(problemsOf({ database_url: url }), [
      'database_url: not read (names are case-sensitive); did you mean DATABASE_URL?',
    ])
    assert.deepEqual(problemsOf({ PORT_FILE: '/run/secrets/port' }), [
      'PORT_FILE: not read: only DATABASE_URL, DATABASE_LISTEN_URL, DATABASE_MIGRATION_URL, JWT_SECRETS, ' +
        'ADMIN_PASSWORD, SMTP_URL, MAIL_HOOK_SECRET can be read from a file (<NAME>_FILE); set PORT itself',
    ])
  })

  test("a name in one of the service's families that it does not read: refused, listing the family", () => {
    const [line] = problemsOf({ DATABASE_HOST: 'db' })
    assert.match(
      line!,
      /^DATABASE_HOST: not a variable of this service \(its DATABASE_… variables are DATABASE_URL, .*DATABASE_POOLER.*; docs\/operations\.md lists them all\)$/,
    )
  })

  test('beside the variable it was meant for, it loses nothing: a warning, not a refusal', () => {
    const { config, warnings } = readConfig({
      DATABASE_URL: url,
      DATABSE_URL: 'postgres://old@db/old',
      DATABASE_HOST: 'db',
    })
    assert.equal(config.databaseUrl, url)
    assert.deepEqual(warnings, [
      'DATABSE_URL: not a variable of this service; did you mean DATABASE_URL?',
      warnings[1]!,
    ])
    assert.match(warnings[1]!, /^DATABASE_HOST: /)
    // Its _FILE twin counts as set.
    assert.equal(readConfig({ DATABASE_URL_FILE: '', JWT_SECRET: 'x', JWT_SECRETS: `k:${SECRET}` }).warnings.length, 1)
  })

  test('when start-up stops anyway, the suspects are among the lines: they may be why', () => {
    assert.deepEqual(
      problemsOf({ NODE_ENV: 'production', JWT_SECRETS: `k:${SECRET}`, DATABASE_POOL_MAX: '5', DATABASE_HOST: 'db' }),
      [
        'DATABASE_URL: required when NODE_ENV=production',
        'DATABASE_HOST: not a variable of this service (its DATABASE_… variables are DATABASE_URL, DATABASE_POOLER, ' +
          'DATABASE_POOL_MAX, DATABASE_LISTEN_URL, DATABASE_MIGRATION_URL; docs/operations.md lists them all)',
      ],
    )
  })

  test(
    'a variable of a family the service reads, but not one of its own (OIDC_CLIENT_ID: no client is needed to ' +
      'check tokens): start-up stops, naming the family',
    () => {
      assert.deepEqual(problemsOf({ OIDC_CLIENT_ID: 'api' }), [
        'OIDC_CLIENT_ID: not a variable of this service (its OIDC_… variables are OIDC_AUDIENCE, OIDC_ISSUER, ' +
          'OIDC_ADMIN_CLAIM, OIDC_ADMIN_VALUE, OIDC_REPROVISION, OIDC_LOCAL_PASSWORDS; docs/operations.md lists them ' +
          'all)',
      ])
    },
  )

  test('an empty variable carries nothing: not reported', () => {
    assert.deepEqual(readConfig({ DATABSE_URL: '' }).warnings, [])
  })

  // What a process is given besides its configuration, in the places it runs: none of it may be reported.
  const ordinary: Record<string, Record<string, string>> = {
    'a shell': {
      PATH: '/usr/local/bin:/usr/bin',
      HOME: '/home/dev',
      USER: 'dev',
      LOGNAME: 'dev',
      SHELL: '/bin/bash',
      TERM: 'xterm-256color',
      LANG: 'C.UTF-8',
      LC_ALL: 'C.UTF-8',
      PWD: '/app',
      OLDPWD: '/',
      SHLVL: '1',
      _: '/usr/bin/node',
      MAIL: '/var/mail/dev',
      TMPDIR: '/tmp',
      EDITOR: 'vi',
      TZ: 'UTC',
      HOSTTYPE: 'x86_64',
      DISPLAY: ':0',
      SSH_AUTH_SOCK: '/tmp/ssh',
      XDG_RUNTIME_DIR: '/run/user/1000',
      http_proxy: 'http://proxy:3128',
      no_proxy: 'localhost',
    },
    'the official node image and Docker': {
      HOSTNAME: 'f00dcafe1234',
      NODE_VERSION: '26.1.0',
      YARN_VERSION: '1.22.22',
      HOME: '/home/node',
      PATH: '/usr/local/bin:/usr/bin',
    },
    'Node itself': {
      NODE_OPTIONS: '--max-old-space-size=512',
      NODE_EXTRA_CA_CERTS: '/etc/ca.pem',
      NODE_DEBUG: 'http',
      NODE_PATH: '/usr/lib/node',
      UV_THREADPOOL_SIZE: '8',
      NODE_NO_WARNINGS: '1',
      NODE_TLS_REJECT_UNAUTHORIZED: '1',
      NODE_UNIQUE_ID: '1',
    },
    'npm run': {
      npm_config_user_agent: 'npm/11',
      npm_lifecycle_event: 'start',
      npm_lifecycle_script: 'node dist/main.js',
      npm_package_name: 'users-products-api',
      npm_package_version: '0.1.0',
      npm_node_execpath: '/usr/bin/node',
      npm_execpath: '/usr/lib/npm-cli.js',
      npm_config_cache: '/root/.npm',
      npm_command: 'start',
      INIT_CWD: '/app',
      NODE: '/usr/bin/node',
      COLOR: '0',
      npm_config_port: '1',
    },
    'Kubernetes, with services named database, api, admin and webhook in the namespace': {
      KUBERNETES_SERVICE_HOST: '10.96.0.1',
      KUBERNETES_SERVICE_PORT: '443',
      KUBERNETES_SERVICE_PORT_HTTPS: '443',
      KUBERNETES_PORT: 'tcp://10.96.0.1:443',
      KUBERNETES_PORT_443_TCP: 'tcp://10.96.0.1:443',
      KUBERNETES_PORT_443_TCP_PROTO: 'tcp',
      KUBERNETES_PORT_443_TCP_PORT: '443',
      KUBERNETES_PORT_443_TCP_ADDR: '10.96.0.1',
      ...serviceLinks('DATABASE', 5432),
      ...serviceLinks('API', 3000),
      ...serviceLinks('ADMIN', 8080),
      ...serviceLinks('WEBHOOK', 443),
      DATABASE_SERVICE_PORT_POSTGRES: '5432',
      POD_NAME: 'api-7d9f',
      POD_NAMESPACE: 'shop',
    },
    'Docker links (legacy)': {
      DATABASE_PORT: 'tcp://172.17.0.2:5432',
      DATABASE_PORT_5432_TCP: 'tcp://172.17.0.2:5432',
      DATABASE_PORT_5432_TCP_ADDR: '172.17.0.2',
      DATABASE_PORT_5432_TCP_PORT: '5432',
      DATABASE_PORT_5432_TCP_PROTO: 'tcp',
      DATABASE_NAME: '/api/database',
      DATABASE_ENV_POSTGRES_PASSWORD: 'pw',
      DATABASE_ENV_POSTGRES_USER: 'api',
    },
    'GitHub Actions': {
      CI: 'true',
      GITHUB_ACTIONS: 'true',
      GITHUB_WORKSPACE: '/home/runner/work',
      GITHUB_SHA: 'abc',
      GITHUB_REF: 'refs/heads/main',
      GITHUB_ENV: '/tmp/env',
      GITHUB_TOKEN: 'x',
      RUNNER_OS: 'Linux',
      RUNNER_TEMP: '/tmp',
      RUNNER_TOOL_CACHE: '/opt/hostedtoolcache',
      ImageOS: 'ubuntu24',
      ImageVersion: '2026',
      ACTIONS_RUNNER_DEBUG: 'false',
      JAVA_HOME: '/usr/lib/jvm',
      ANDROID_HOME: '/usr/local/lib/android',
      GOROOT: '/usr/local/go',
      PIPX_HOME: '/opt/pipx',
      AGENT_TOOLSDIRECTORY: '/opt/hostedtoolcache',
      DEBIAN_FRONTEND: 'noninteractive',
    },
    'OpenSSL and other TLS clients': {
      SSL_CERT_FILE: '/etc/ssl/certs/ca-certificates.crt',
      SSL_CERT_DIR: '/etc/ssl/certs',
      REQUESTS_CA_BUNDLE: '/etc/ssl/ca.pem',
      CURL_CA_BUNDLE: '/etc/ssl/ca.pem',
      NODE_EXTRA_CA_CERTS: '/etc/ssl/ca.pem',
    },
    'PostgreSQL clients and images': {
      PGHOST: 'db',
      PGPORT: '5432',
      PGUSER: 'api',
      PGDATABASE: 'api',
      PGPASSWORD: 'pw',
      PGDATA: '/var/lib/postgresql/data',
      POSTGRES_PASSWORD: 'pw',
      POSTGRES_USER: 'api',
      POSTGRES_DB: 'api',
    },
  }
  for (const [where, env] of Object.entries(ordinary)) {
    test(`the environment of ${where}: nothing reported`, () => {
      assert.deepEqual(readConfig(env).warnings, [])
    })
  }

  test("none of the service's own variables is a suspect, whatever its value", () => {
    assert.deepEqual(
      suspectVariables(
        Object.fromEntries([...KNOWN_VARIABLES].map((name) => [name, 'x'])),
        KNOWN_VARIABLES,
        SECRET_VARIABLES,
      ),
      [],
    )
  })
})

/** What Kubernetes adds for a service `name` on `port` (enableServiceLinks, the default). */
function serviceLinks(name: string, port: number): Record<string, string> {
  const address = '10.96.12.34'
  return {
    [`${name}_SERVICE_HOST`]: address,
    [`${name}_SERVICE_PORT`]: String(port),
    [`${name}_PORT`]: `tcp://${address}:${port}`,
    [`${name}_PORT_${port}_TCP`]: `tcp://${address}:${port}`,
    [`${name}_PORT_${port}_TCP_PROTO`]: 'tcp',
    [`${name}_PORT_${port}_TCP_PORT`]: String(port),
    [`${name}_PORT_${port}_TCP_ADDR`]: address,
  }
}

describe('JWT_SECRETS', () => {
  test('keeps the order of kid:secret pairs (the first signs) and uses the secret bytes as given', () => {
    const secrets = parseJwtSecrets(`new:${SECRET},old:${'b'.repeat(40)}`)
    assert.deepEqual(
      secrets.map((s) => s.kid),
      ['new', 'old'],
    )
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
  const run = (env: Record<string, string>) => runCommand([], { DATABASE_URL: '', ...env })

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
    const { code, stderr } = await run({
      DATABASE_URL: 'postgres://app@127.0.0.1:1/app',
      DATABASE_LISTEN_URL: 'postgres://app:hunter2-secret@[db/app',
    })
    assert.equal(code, 1)
    assert.match(stderr, /^Cannot start: DATABASE_LISTEN_URL: /m)
    assert.doesNotMatch(stderr, /hunter2/)
  })
})
