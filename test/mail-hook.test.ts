import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { after, describe, test } from 'node:test'
import { Webhook } from 'standardwebhooks'
import { createHookTransport, hookSettingProblems, type HookSettings } from '../src/mail/hook.js'
import { MailSendError, type MailMessage } from '../src/mail/message.js'
import { accepts, freePort } from './helpers/ports.js'
import { waitUntil } from './helpers/wait.js'
import {
  answerEndlessly,
  answerWith,
  startReceiver,
  type Answer,
  type Receiver,
  type Reception,
} from './helpers/webhook-receiver.js'

// The mail hook transport against a real HTTP receiver on this machine,
// which checks each request the way a team's receiver would: the signature
// with the standardwebhooks package (an independent implementation of the
// scheme), then the body. What a send does with each kind of answer
// (taken, refused for good, to be tried again), and the bounds on a
// receiver that answers slowly, endlessly or elsewhere. The link's token
// is a credential: no error may carry it. Last, the receiver docs/auth.md
// shows, run as it is written between the hook and a stand-in for the
// mail provider's API.

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw' // 24 bytes, the shortest Standard Webhooks allows
const OTHER_SECRET = `whsec_${Buffer.alloc(32, 7).toString('base64')}`
const TOKEN = 'rst_Z3JlYXQgc2NvdHQsIGEgc2VjcmV0IHRva2Vu'

const message = (overrides: Partial<MailMessage> = {}): MailMessage => ({
  id: '4711',
  type: 'mail.password_reset',
  to: 'ada@example.com',
  subject: 'Reset your password',
  text:
    `Someone asked to reset the password of ada@example.com.\nOpen ` +
    `https://app.example.com/reset?token=${TOKEN} within an hour.\n`,
  link: `https://app.example.com/reset?token=${TOKEN}`,
  ...overrides,
})

/**
 * A receiver that takes (204) only a request whose signature verifies
 * with `secret`, else 401, as the docs' receiver does.
 */
async function verifyingReceiver(secret = SECRET): Promise<Receiver & { verified: unknown[] }> {
  const receiver = Object.assign(await startReceiver('/mail'), { verified: [] as unknown[] })
  receiver.answer = (_req, res, reception) => {
    try {
      receiver.verified.push(new Webhook(secret).verify(reception.body, reception.headers as Record<string, string>))
    } catch {
      return void answerWith(401, 'bad signature')(_req, res, reception)
    }
    answerWith(204)(_req, res, reception)
  }
  return receiver
}

const hook = (url: string, more: Partial<HookSettings> = {}) => createHookTransport({ url, secret: SECRET, ...more })

/** The MailSendError a send rejects with (fails the test when it resolves or throws anything else). */
async function failure(send: Promise<void>): Promise<MailSendError> {
  try {
    await send
  } catch (err) {
    assert.ok(err instanceof MailSendError, `not a MailSendError: ${String(err)}`)
    return err
  }
  assert.fail('the send resolved')
}

/** Neither the text, the link nor the token appear in an error (message or stack). */
function assertNoSecrets(err: Error, sent: MailMessage = message()) {
  for (const text of [err.message, String(err.stack)]) {
    assert.ok(!text.includes(TOKEN), `the token is in: ${text}`)
    assert.ok(!text.includes(sent.text.trim().split('\n')[0]!), `the text is in: ${text}`)
  }
}

describe('the mail hook sends a signed Standard Webhooks POST', () => {
  test('of exactly type, to, subject, text and link, which the standardwebhooks package verifies', async () => {
    const receiver = await verifyingReceiver()
    const sent = message()
    await hook(receiver.url).send(sent)
    assert.equal(receiver.received.length, 1)
    const [r] = receiver.received as [Reception]
    assert.deepEqual(receiver.verified, [
      { type: sent.type, to: sent.to, subject: sent.subject, text: sent.text, link: sent.link },
    ])
    assert.deepEqual(
      Object.keys(JSON.parse(r.body)),
      ['type', 'to', 'subject', 'text', 'link'],
      'no other member (the id travels as webhook-id)',
    )
    assert.equal(r.headers['content-type'], 'application/json')
    assert.equal(r.headers['webhook-id'], '4711')
    assert.match(String(r.headers['webhook-signature']), /^v1,[A-Za-z0-9+/]{43}=$/)
    const timestamp = Number(r.headers['webhook-timestamp'])
    assert.ok(Math.abs(timestamp - Date.now() / 1000) < 60, `webhook-timestamp ${timestamp} is not now`)
  })

  test('with a null link for a message without one, and UTF-8 intact', async () => {
    const receiver = await verifyingReceiver()
    const sent = message({
      type: 'mail.email_changed',
      subject: 'Ihre E-Mail-Adresse wurde geändert',
      text: 'Grüße — ✉\n',
      link: null,
    })
    await hook(receiver.url).send(sent)
    assert.deepEqual(receiver.verified, [
      { type: 'mail.email_changed', to: sent.to, subject: sent.subject, text: 'Grüße — ✉\n', link: null },
    ])
  })

  test('that a receiver holding another secret refuses (a forged request), which is a permanent failure', async () => {
    const receiver = await verifyingReceiver(OTHER_SECRET)
    const err = await failure(hook(receiver.url).send(message()))
    assert.equal(receiver.received.length, 1)
    assert.deepEqual(receiver.verified, [])
    assert.equal(err.permanent, true)
    assert.equal(err.message, `the mail hook (http://127.0.0.1:${receiver.port}): the receiver answered 401`)
  })

  test('with the same webhook-id on a retry, and a signature that verifies each time', async () => {
    const receiver = await verifyingReceiver()
    const verifying = receiver.answer
    receiver.answer = answerWith(503)
    const transport = hook(receiver.url)
    const err = await failure(transport.send(message({ id: '99' })))
    assert.equal(err.permanent, false)
    receiver.answer = verifying
    await transport.send(message({ id: '99' }))
    assert.deepEqual(
      receiver.received.map((r) => r.headers['webhook-id']),
      ['99', '99'],
    )
    assert.equal(receiver.verified.length, 1)
    assert.equal(receiver.received[0]!.body, receiver.received[1]!.body)
  })
})

describe('what a send makes of the answer', () => {
  test(
    '2xx: sent; 4xx: permanent, but for 408 and 429; 5xx: to be tried again; never with the text or link in the ' +
      'error',
    async () => {
      const receiver = await startReceiver('/mail')
      let status = 0
      // The receiver's answer echoes the request: an error quoting the answer would leak the link.
      const echo: Answer = (_req, res, reception) => {
        res.writeHead(status, { 'content-type': 'application/json' })
        res.end(reception.body)
      }
      receiver.answer = echo
      const transport = hook(receiver.url)
      for (status of [200, 201, 202, 204]) await transport.send(message())
      const outcomes: Array<[number, boolean, string]> = []
      for (status of [400, 401, 403, 404, 410, 413, 422, 408, 429, 500, 502, 503, 504]) {
        const err = await failure(transport.send(message()))
        assertNoSecrets(err)
        outcomes.push([status, err.permanent, err.message])
      }
      const origin = `http://127.0.0.1:${receiver.port}`
      assert.deepEqual(outcomes, [
        ...[400, 401, 403, 404, 410, 413, 422].map((s): [number, boolean, string] => [
          s,
          true,
          `the mail hook (${origin}): the receiver answered ${s}`,
        ]),
        ...[408, 429, 500, 502, 503, 504].map((s): [number, boolean, string] => [
          s,
          false,
          `the mail hook (${origin}): the receiver answered ${s}`,
        ]),
      ])
    },
  )

  test('no answer within the time-out: to be tried again', async () => {
    const receiver = await startReceiver('/mail')
    receiver.answer = () => {} // holds the request open
    const err = await failure(hook(receiver.url, { timeoutMs: 400 }).send(message()))
    assert.equal(err.permanent, false)
    assert.equal(err.message, `the mail hook (http://127.0.0.1:${receiver.port}): no complete answer within 400 ms`)
    assertNoSecrets(err)
  })

  test('nothing listening: to be tried again', async () => {
    const port = await freePort()
    const err = await failure(hook(`http://127.0.0.1:${port}/mail`).send(message()))
    assert.equal(err.permanent, false)
    assert.equal(err.message, `the mail hook (http://127.0.0.1:${port}): connection refused`)
  })

  test('a name that does not resolve: to be tried again', async () => {
    const err = await failure(hook('http://mail-receiver.invalid/mail').send(message()))
    assert.equal(err.permanent, false)
    assert.equal(err.message, 'the mail hook (http://mail-receiver.invalid): mail-receiver.invalid does not resolve')
  })

  test(
    'a redirect is not followed (only its origin is said), and is tried again: fixing MAIL_HOOK_URL lets the mail ' +
      'through',
    async () => {
      const target = await verifyingReceiver()
      const redirecting = await startReceiver('/mail')
      redirecting.answer = (_req, res) => {
        res.writeHead(307, { location: `${target.url}?token=${TOKEN}` })
        res.end()
      }
      const err = await failure(hook(redirecting.url).send(message()))
      assert.equal(err.permanent, false)
      assert.equal(
        err.message,
        `the mail hook (http://127.0.0.1:${redirecting.port}): redirect to ` +
          `http://127.0.0.1:${target.port} not followed`,
      )
      assertNoSecrets(err)
      assert.equal(redirecting.received.length, 1)
      assert.equal(target.received.length, 0)
    },
  )

  test('an endless answer is read only up to the bound: the connection is closed, and the status decides', async () => {
    const receiver = await startReceiver('/mail')
    let sentWhenClosed: number | undefined
    receiver.answer = answerEndlessly(503, (sent) => (sentWhenClosed = sent))
    // The time-out is far away: what ends the attempt is the bound.
    const transport = hook(receiver.url, { timeoutMs: 60_000, maxResponseBytes: 64 * 1024 })
    const err = await failure(transport.send(message()))
    assert.equal(err.permanent, false)
    assert.equal(
      err.message,
      `the mail hook (http://127.0.0.1:${receiver.port}): the receiver answered 503; the answer exceeded 65536 ` +
        `bytes; the rest was not read`,
    )
    await waitUntil('the receiver to see the connection closed', async () => sentWhenClosed !== undefined)
    assert.ok(sentWhenClosed! < 5 * 1024 * 1024, `the connection was closed after ${sentWhenClosed} bytes`)

    sentWhenClosed = undefined
    receiver.answer = answerEndlessly(200, (sent) => (sentWhenClosed = sent))
    await transport.send(message()) // a 2xx took the message; the bound only limits what is read
    await waitUntil('the receiver to see the connection closed', async () => sentWhenClosed !== undefined)
    assert.ok(sentWhenClosed! < 5 * 1024 * 1024, `the connection was closed after ${sentWhenClosed} bytes`)
  })

  test('close() lets an attempt finish until its deadline, then cuts it short: to be tried again', async () => {
    const receiver = await startReceiver('/mail')
    receiver.answer = () => {}
    const transport = hook(receiver.url, { timeoutMs: 60_000 })
    const sending = failure(transport.send(message()))
    await receiver.waitFor('the request', (r) => r.length === 1)
    await transport.close(performance.now() + 100)
    const err = await sending
    assert.equal(err.permanent, false)
    assert.equal(
      err.message,
      `the mail hook (http://127.0.0.1:${receiver.port}): the service stopped during the attempt`,
    )
  })
})

describe('MAIL_HOOK_URL and MAIL_HOOK_SECRET', () => {
  const check = (url: string | undefined, secret: string | undefined, production = false) =>
    hookSettingProblems({ url, secret, production })

  test("neither set, or both right: no problem; loopback and private addresses are the operator's to use", () => {
    assert.deepEqual(check(undefined, undefined), [])
    for (const url of [
      'http://127.0.0.1:8025/mail',
      'http://10.1.2.3/mail',
      'http://mailer:3000/send',
      'https://hooks.example.com/mail?key=k',
      'http://[::1]:9000/',
    ]) {
      assert.deepEqual(check(url, SECRET), [], url)
    }
    assert.deepEqual(check('https://hooks.example.com/mail', `whsec_${Buffer.alloc(64, 1).toString('base64')}`), [])
  })

  test('one without the other names the one missing', () => {
    assert.deepEqual(check('https://hooks.example.com/mail', undefined), [
      {
        variable: 'MAIL_HOOK_SECRET',
        problem:
          "required with MAIL_HOOK_URL: the receiver tells the service's messages from forged ones by their signature",
      },
    ])
    assert.deepEqual(check(undefined, SECRET), [
      {
        variable: 'MAIL_HOOK_URL',
        problem: 'required with MAIL_HOOK_SECRET (set both to send mail through the hook, or neither)',
      },
    ])
  })

  test('a secret not in the whsec_ form, or of the wrong size, is refused without being quoted', () => {
    const bad = {
      sk_live_abcdefghijklmnopqrstuvwxyz0123456789: /^must start with whsec_/,
      'whsec_not base64 at all!!': /^must be whsec_ and standard base64/,
      // unpadded: a character lost in a copy
      whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS: /^must be whsec_ and standard base64/,
      [`whsec_${Buffer.alloc(16, 9).toString('base64')}`]: /^must hold 24 to 64 bytes after whsec_ \(it holds 16\)/,
      [`whsec_${Buffer.alloc(65, 9).toString('base64')}`]: /^must hold 24 to 64 bytes after whsec_ \(it holds 65\)/,
    }
    for (const [secret, expected] of Object.entries(bad)) {
      const problems = check('https://hooks.example.com/mail', secret)
      assert.equal(problems.length, 1, secret)
      assert.equal(problems[0]!.variable, 'MAIL_HOOK_SECRET')
      assert.match(problems[0]!.problem, expected)
      assert.ok(!problems[0]!.problem.includes(secret.slice(6, 20)), `the secret is quoted: ${problems[0]!.problem}`)
    }
  })

  test('a URL that is not http(s), carries credentials or does not parse is refused without being quoted', () => {
    const bad = {
      'hooks.example.com/mail': 'must be an http:// or https:// URL (it does not parse as a URL)',
      'ftp://hooks.example.com/mail': 'must be an http:// or https:// URL (not ftp://)',
      'https://user:hunter2secret@hooks.example.com/mail':
        'must not carry a user name or password: the receiver knows the service by the signature (MAIL_HOOK_SECRET)',
    }
    for (const [url, problem] of Object.entries(bad))
      assert.deepEqual(check(url, SECRET), [{ variable: 'MAIL_HOOK_URL', problem }], url)
  })

  test('in production, http only to this host', () => {
    for (const url of [
      'http://127.0.0.1:8025/mail',
      'http://localhost:8025/mail',
      'http://[::1]/mail',
      'https://10.1.2.3/mail',
      'https://hooks.example.com/mail',
    ]) {
      assert.deepEqual(check(url, SECRET, true), [], url)
    }
    for (const url of ['http://10.1.2.3/mail', 'http://mailer:3000/send', 'http://hooks.example.com/mail']) {
      assert.deepEqual(
        check(url, SECRET, true),
        [
          {
            variable: 'MAIL_HOOK_URL',
            problem:
              'must be https when NODE_ENV=production, unless it points at this host (localhost, 127.0.0.1, [::1]): ' +
              'every message carries a password-reset or verification link, a credential for the account',
          },
        ],
        url,
      )
    }
  })
})

describe('the receiver of docs/auth.md, run as written', () => {
  const root = resolve(import.meta.dirname, '..')

  /** The ```js block under "A receiver for the mail hook". */
  function documentedReceiver(): string {
    const doc = readFileSync(join(root, 'docs/auth.md'), 'utf8')
    const section = doc.slice(doc.indexOf('### A receiver for the mail hook'))
    const code = /```js\n([\s\S]*?)```/.exec(section)?.[1]
    assert.ok(code, 'docs/auth.md has no js block under "A receiver for the mail hook"')
    return code
  }

  /** The documented receiver as a process, handing messages to `providerUrl`; its port. */
  async function startDocumentedReceiver(providerUrl: string): Promise<number> {
    // Under node_modules, so that its `import 'standardwebhooks'` resolves to the project's copy.
    const dir = join(root, 'node_modules', '.cache', `mail-receiver-${process.pid}`)
    mkdirSync(dir, { recursive: true })
    writeFileSync(join(dir, 'mail-receiver.mjs'), documentedReceiver())
    const port = await freePort()
    const child = spawn(process.execPath, [join(dir, 'mail-receiver.mjs')], {
      env: {
        PATH: process.env.PATH,
        MAIL_HOOK_SECRET: SECRET,
        RESEND_API_KEY: 're_test_key',
        MAIL_FROM: 'Example <no-reply@example.com>',
        MAIL_API_URL: providerUrl,
        PORT: String(port),
      },
      stdio: ['ignore', 'inherit', 'inherit'],
    })
    after(() => {
      child.kill()
      rmSync(dir, { recursive: true, force: true })
    })
    await waitUntil('the documented receiver to listen', async () => child.exitCode === null && (await accepts(port)))
    return port
  }

  test(
    'hands a signed message to the provider once, refuses a forged one, and has a failing provider ' + 'retried',
    async () => {
      const provider = await startReceiver('/emails')
      provider.answer = answerWith(200, '{"id":"e-1"}')
      const port = await startDocumentedReceiver(provider.url)
      const url = `http://127.0.0.1:${port}/`
      const transport = hook(url)

      const sent = message({ id: '501' })
      await transport.send(sent)
      assert.equal(provider.received.length, 1)
      assert.equal(provider.received[0]!.headers.authorization, 'Bearer re_test_key')
      assert.deepEqual(JSON.parse(provider.received[0]!.body), {
        from: 'Example <no-reply@example.com>',
        to: sent.to,
        subject: sent.subject,
        text: sent.text,
      })

      await transport.send(sent) // a repetition (the service did not hear the first answer): dropped by webhook-id
      assert.equal(provider.received.length, 1)

      const forged = await failure(createHookTransport({ url, secret: OTHER_SECRET }).send(message({ id: '502' })))
      assert.equal(forged.permanent, true)
      assert.equal(forged.message, `the mail hook (http://127.0.0.1:${port}): the receiver answered 401`)
      assert.equal(provider.received.length, 1, 'a forged request reaches no provider')

      provider.answer = answerWith(500)
      const down = await failure(transport.send(message({ id: '503' })))
      assert.equal(down.permanent, false)
      provider.answer = answerWith(200, '{"id":"e-2"}')
      await transport.send(message({ id: '503' }))
      assert.equal(provider.received.length, 3)
    },
  )
})
