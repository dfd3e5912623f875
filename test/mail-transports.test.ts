import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, test } from 'node:test'
import PostalMime from 'postal-mime'
import { Webhook } from 'standardwebhooks'
import { startExim } from './helpers/exim.js'
import { startServer, type TestServer } from './helpers/server.js'
import { startReceiver } from './helpers/webhook-receiver.js'

// Account recovery end to end through each real transport the configuration
// can choose (src/mail/transport.ts): the service's mail worker sends a
// password reset through the signed hook to a receiver that verifies it with
// the independent standardwebhooks package, and by SMTP to exim, whose
// delivered message is parsed back (postal-mime). In each, the link the
// person receives resets the password, once.

const RESET_URL = 'https://app.example.com/reset?token={token}'
const LINK = /https:\/\/app\.example\.com\/reset\?token=(upa_ot_[A-Za-z0-9_-]+)/

/**
 * Resets `email`'s password with `token`, then proves the new
 * one logs in, the old one does not, and the token is spent.
 */
async function resetWith(server: TestServer, email: string, oldPassword: string, token: string): Promise<void> {
  const password = `a new password ${randomBytes(4).toString('hex')}`
  const confirm = await server.request('POST', '/auth/password-reset/confirm', { body: { token, password } })
  assert.equal(confirm.status, 204, confirm.text)
  assert.equal((await server.request('POST', '/auth/login', { body: { email, password } })).status, 200)
  assert.equal((await server.request('POST', '/auth/login', { body: { email, password: oldPassword } })).status, 401)
  const again = await server.request('POST', '/auth/password-reset/confirm', {
    body: { token, password: `${password}!` },
  })
  assert.equal(again.status, 400)
  assert.equal(again.body.code, 'invalid_one_time_token')
}

test(
  'MAIL_HOOK_URL: the reset is POSTed signed (standardwebhooks verifies it), and its link resets the ' + 'password',
  async () => {
    const secret = `whsec_${randomBytes(32).toString('base64')}`
    const receiver = await startReceiver('/mail')
    after(() => receiver.close())
    const server = await startServer({
      MAIL_HOOK_URL: receiver.url,
      MAIL_HOOK_SECRET: secret,
      PASSWORD_RESET_URL: RESET_URL,
    })
    const oldPassword = 'the password before the reset'
    const user = await server.createUser({
      email: `hooked-${randomBytes(3).toString('hex')}@example.com`,
      password: oldPassword,
    })

    assert.equal((await server.request('POST', '/auth/password-reset', { body: { email: user.email } })).status, 202)
    await receiver.waitFor('the reset message', (received) => received.length === 1)
    const [reception] = receiver.received
    const message = new Webhook(secret).verify(reception!.body, reception!.headers as Record<string, string>) as Record<
      string,
      string
    >
    assert.deepEqual(Object.keys(message).sort(), ['link', 'subject', 'text', 'to', 'type'])
    assert.equal(message.type, 'mail.password_reset')
    assert.equal(message.to, user.email)
    const token = LINK.exec(message.link!)?.[1]
    assert.ok(token && message.text!.includes(message.link!), 'the text carries the link')
    await resetWith(server, user.email, oldPassword, token)
    // Sent once, and gone from the outbox: the token is stored nowhere in clear.
    const outbox = await server.sql`SELECT count(*)::int AS n FROM mail_outbox`
    assert.equal(outbox[0]!.n, 0)
  },
)

test(
  'SMTP_URL: the reset arrives at exim as a parsed mail from MAIL_FROM, and its link resets the ' + 'password',
  async () => {
    const exim = await startExim({ tls: 'none' })
    // No TLS: allowed only to a loopback server (?starttls=off), which this is.
    const account = `${encodeURIComponent(exim.user)}:${encodeURIComponent(exim.password)}`
    const smtpUrl = `smtp://${account}@127.0.0.1:${exim.port}?starttls=off`
    const server = await startServer({
      SMTP_URL: smtpUrl,
      MAIL_FROM: 'Accounts <accounts@example.com>',
      PASSWORD_RESET_URL: RESET_URL,
    })
    const oldPassword = 'the password before the reset'
    const user = await server.createUser({
      email: `mailed-${randomBytes(3).toString('hex')}@example.org`,
      password: oldPassword,
    })

    assert.equal((await server.request('POST', '/auth/password-reset', { body: { email: user.email } })).status, 202)
    const [mail] = await exim.received(1)
    const parsed = await PostalMime.parse(mail!.raw)
    assert.deepEqual(parsed.from, { name: 'Accounts', address: 'accounts@example.com' })
    assert.deepEqual(
      parsed.to?.map((t) => t.address),
      [user.email],
    )
    assert.deepEqual(
      exim.accepted().map((a) => a.auth),
      ['plain'],
    )
    const token = LINK.exec(parsed.text ?? '')?.[1]
    assert.ok(token, parsed.text)
    await resetWith(server, user.email, oldPassword, token)
  },
)
