import assert from 'node:assert/strict'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import { loadConfig } from '../src/config.js'
import { ConfigError } from '../src/core/config-error.js'
import { createLogger } from '../src/core/log.js'
import { mailTransportFor, MAIL_NOT_CONFIGURED } from '../src/mail/transport.js'

// The configuration of account recovery and outgoing mail: what start-up
// refuses, what it accepts, and which transport it chooses.

const HOOK_SECRET = `whsec_${Buffer.alloc(24, 7).toString('base64')}`

function refused(env: Record<string, string>, line: RegExp): string {
  let message = ''
  assert.throws(
    () => loadConfig(env),
    (err: unknown) => {
      assert.ok(err instanceof ConfigError, String(err))
      message = err.message
      return true
    },
  )
  assert.match(message, line)
  return message
}

describe('mail and recovery settings', () => {
  test('one transport at most; MAIL_FROM with SMTP_URL; the hook needs its whsec_ secret; no secret is echoed', () => {
    const both = refused(
      {
        SMTP_URL: 'smtp://u:hunter2@mail.example.com:587',
        MAIL_FROM: 'a@example.com',
        MAIL_HOOK_URL: 'https://hooks.example.com/mail',
        MAIL_HOOK_SECRET: HOOK_SECRET,
      },
      /^SMTP_URL and MAIL_HOOK_URL: set one of them/m,
    )
    assert.ok(!both.includes('hunter2') && !both.includes(HOOK_SECRET))
    refused({ SMTP_URL: 'smtp://mail.example.com' }, /^MAIL_FROM: required with SMTP_URL/m)
    const bad = refused(
      { SMTP_URL: 'http://u:hunter2@mail.example.com', MAIL_FROM: 'a@example.com' },
      /^SMTP_URL: must be smtp:\/\/user:password@host:port \(STARTTLS\) or smtps:\/\/user:password@host:port \(TLS\) \(the scheme is "http:"\)$/m,
    )
    assert.ok(!bad.includes('hunter2'))
    refused({ MAIL_HOOK_URL: 'https://hooks.example.com/mail' }, /^MAIL_HOOK_SECRET: required with MAIL_HOOK_URL/m)
    refused({ MAIL_HOOK_SECRET: HOOK_SECRET }, /^MAIL_HOOK_URL: required with MAIL_HOOK_SECRET/m)
    refused(
      { MAIL_HOOK_URL: 'https://hooks.example.com/mail', MAIL_HOOK_SECRET: 'not-whsec' },
      /^MAIL_HOOK_SECRET: must start with whsec_/m,
    )
    refused({ MAIL_FROM: 'a@example.com\r\nBcc: everyone@example.com' }, /^MAIL_FROM: must be an address/m)
  })

  test('link templates hold {token}; https in production', () => {
    refused(
      { PASSWORD_RESET_URL: 'https://app.example.com/reset' },
      /^PASSWORD_RESET_URL: must be an http\(s\) URL holding \{token\}/m,
    )
    refused(
      { VERIFY_EMAIL_URL: 'javascript:alert(1)//{token}' },
      /^VERIFY_EMAIL_URL: must be an http\(s\) URL holding \{token\}/m,
    )
    refused(
      {
        NODE_ENV: 'production',
        DATABASE_URL: 'postgres://db/app',
        JWT_SECRETS: `k:${'s'.repeat(32)}`,
        PASSWORD_RESET_URL: 'http://app.example.com/reset?t={token}',
      },
      /^PASSWORD_RESET_URL: must be an https:\/\/ URL when NODE_ENV=production/m,
    )
    refused({ REQUIRE_VERIFIED_EMAIL: 'true' }, /^REQUIRE_VERIFIED_EMAIL: needs VERIFY_EMAIL_URL/m)
    const verifying = { VERIFY_EMAIL_URL: 'https://app.example.com/verify?t={token}' }
    refused(
      { ...verifying, EMAIL_RESTORE_URL: 'https://app.example.com/restore' },
      /^EMAIL_RESTORE_URL: must be an http\(s\) URL holding \{token\}/m,
    )
    refused(
      {
        NODE_ENV: 'production',
        DATABASE_URL: 'postgres://db/app',
        JWT_SECRETS: `k:${'s'.repeat(32)}`,
        ...verifying,
        EMAIL_RESTORE_URL: 'http://app.example.com/restore?t={token}',
      },
      /^EMAIL_RESTORE_URL: must be an https:\/\/ URL when NODE_ENV=production/m,
    )
    // Its link rides on the notice of an address change, which only verification sends.
    refused(
      { EMAIL_RESTORE_URL: 'https://app.example.com/restore?t={token}' },
      /^EMAIL_RESTORE_URL: needs VERIFY_EMAIL_URL/m,
    )
    assert.equal(
      loadConfig({ ...verifying, EMAIL_RESTORE_URL: 'http://localhost:5173/restore?t={token}' }).emailRestoreUrl,
      'http://localhost:5173/restore?t={token}',
    )
    const config = loadConfig({
      PASSWORD_RESET_URL: 'http://localhost:5173/reset?t={token}',
      PASSWORD_RESET_TTL: '600',
      REQUIRE_VERIFIED_EMAIL: 'true',
      VERIFY_EMAIL_URL: 'http://localhost:5173/verify?t={token}',
    })
    assert.equal(config.passwordResetUrl, 'http://localhost:5173/reset?t={token}')
    assert.equal(config.passwordResetTtl, 600)
    assert.equal(config.requireVerifiedEmail, true)
    refused({ PASSWORD_RESET_TTL: '10' }, /^PASSWORD_RESET_TTL: must be an integer from 60 to 86400/m)
  })

  test('SMTP_URL_FILE and MAIL_HOOK_SECRET_FILE are read as secrets', () => {
    const dir = mkdtempSync(join(tmpdir(), 'mail-config-'))
    after(() => rmSync(dir, { recursive: true, force: true }))
    writeFileSync(join(dir, 'smtp'), 'smtps://u:p@mail.example.com:465\n')
    writeFileSync(join(dir, 'hook'), `${HOOK_SECRET}\n`)
    assert.deepEqual(loadConfig({ SMTP_URL_FILE: join(dir, 'smtp'), MAIL_FROM: 'a@example.com' }).mail, {
      via: 'smtp',
      server: { host: 'mail.example.com', port: 465, security: 'tls', credentials: { user: 'u', password: 'p' } },
      from: { address: 'a@example.com', domain: 'example.com' },
    })
    assert.deepEqual(
      loadConfig({ MAIL_HOOK_URL: 'http://127.0.0.1:9000/mail', MAIL_HOOK_SECRET_FILE: join(dir, 'hook') }).mail,
      { via: 'hook', url: 'http://127.0.0.1:9000/mail', secret: HOOK_SECRET },
    )
  })

  test('the transport: the console in development, none in production (with a warning)', () => {
    const lines: string[] = []
    const log = createLogger('info', (line) => void lines.push(line))
    assert.equal(mailTransportFor(loadConfig({}), log)?.name, 'console')
    const production = loadConfig({
      NODE_ENV: 'production',
      DATABASE_URL: 'postgres://db/app',
      JWT_SECRETS: `k:${'s'.repeat(32)}`,
    })
    assert.equal(mailTransportFor(production, log), undefined)
    assert.ok(
      lines.some((l) => JSON.parse(l).level === 'warn' && JSON.parse(l).msg === MAIL_NOT_CONFIGURED),
      lines.join('\n'),
    )
  })
})
