import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { createServer, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import PostalMime from 'postal-mime'
import { parseMailFrom, type MailFrom } from '../src/mail/address.js'
import { MailSendError, type MailMessage } from '../src/mail/message.js'
import { createSmtpTransport } from '../src/mail/smtp.js'
import { parseSmtpUrl, type SmtpServer } from '../src/mail/smtp-url.js'
import { startExim, type Exim } from './helpers/exim.js'
import { freePort } from './helpers/ports.js'
import { waitUntil } from './helpers/wait.js'

// The SMTP transport against a real mail server, Debian's exim4
// (test/helpers/exim.ts): what it delivered into its maildir is parsed by an
// independent parser (postal-mime) and compared with what was sent; what a failure looks like is the MailSendError the
// outbox sees (its text and whether it is retried).

const FROM = parseMailFrom('Exämple Accounts <accounts@example.com>') as MailFrom
const message = (fields: Partial<MailMessage> = {}): MailMessage => ({
  id: '7f9c2a6e-0b7d-4c1e-9d7a-3f1e2b4c5d6e',
  type: 'mail.password_reset',
  to: 'ada@example.org',
  subject: 'Reset your password',
  text: 'Hello,\n\nopen https://app.example.com/reset?token=abc to choose a new password.\n',
  link: 'https://app.example.com/reset?token=abc',
  ...fields,
})

/** SMTP_URL for `server` with its account, as an operator writes it (the password percent-encoded). */
function urlOf(server: Exim, scheme = 'smtp', query = '', password = server.password): string {
  const account = `${encodeURIComponent(server.user)}:${encodeURIComponent(password)}`
  return `${scheme}://${account}@127.0.0.1:${server.port}${query}`
}

function transportFor(server: Exim, url: string, timeoutMs = 5000) {
  const parsed = parseSmtpUrl(url)
  assert.equal(typeof parsed, 'object', String(parsed))
  return createSmtpTransport({ server: parsed as SmtpServer, from: FROM, timeoutMs, trustedCertificates: [server.ca] })
}

/** What `send` rejected with: a MailSendError, its text and whether the outbox gives up. */
async function failure(sending: Promise<void>): Promise<MailSendError> {
  const error = await sending.then(
    () => assert.fail('the message was sent'),
    (e: unknown) => e,
  )
  assert.ok(error instanceof MailSendError, `not a MailSendError: ${String(error)}`)
  return error
}

const parse = (raw: Buffer) => PostalMime.parse(raw)

/**
 * A loopback server that speaks from a script, for what no well-behaved
 * server does (silence, extra data, refusing EHLO): it sends `greeting`, then
 * to each command line what `answer` gives (nothing for ''), and to QUIT 221
 * and the end. `commands`: the verbs it got.
 */
async function scriptedServer(
  greeting: string,
  answer: (line: string) => string,
): Promise<{ port: number; commands: string[] }> {
  const commands: string[] = []
  const sockets = new Set<Socket>()
  const server = createServer((socket) => {
    sockets.add(socket)
    socket.on('error', () => undefined)
    if (greeting) socket.write(greeting)
    socket.setEncoding('latin1').on('data', (chunk: string) => {
      for (const line of chunk.split('\r\n').filter(Boolean)) {
        commands.push(line.split(' ')[0]!)
        const reply = line === 'QUIT' ? '221 2.0.0 Bye\r\n' : answer(line)
        if (reply) socket.write(reply)
        if (line === 'QUIT') socket.end()
      }
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  after(() => {
    for (const socket of sockets) socket.destroy()
    server.close()
  })
  return { port: (server.address() as { port: number }).port, commands }
}

describe('SMTP_URL and MAIL_FROM', () => {
  test('default ports, TLS modes and percent-decoded credentials', () => {
    assert.deepEqual(parseSmtpUrl('smtp://u%40x.com:p%2Fa%25ss@mail.example.com'), {
      host: 'mail.example.com',
      port: 587,
      security: 'starttls',
      credentials: { user: 'u@x.com', password: 'p/a%ss' },
    })
    assert.deepEqual(parseSmtpUrl('smtps://u:p@mail.example.com'), {
      host: 'mail.example.com',
      port: 465,
      security: 'tls',
      credentials: { user: 'u', password: 'p' },
    })
    assert.deepEqual(parseSmtpUrl('smtp://127.0.0.1:2525?starttls=off&helo=api.example.com'), {
      host: '127.0.0.1',
      port: 2525,
      security: 'none',
      helo: 'api.example.com',
    })
    assert.deepEqual(parseSmtpUrl('smtp://[::1]:25?starttls=off'), { host: '::1', port: 25, security: 'none' })
  })

  test('a bad SMTP_URL says what is wrong without repeating the password', () => {
    const bad = {
      'http://u:hunter2@mail.example.com': /scheme is "http:"/,
      'smtp://u:hunter2@mail.example.com:587?starttls=off': /only for a server on this machine/,
      'smtps://u:hunter2@127.0.0.1?starttls=off': /not one of them/,
      'smtp://u:hunter2@mail.example.com?tls=yes': /"tls" is not one of them/,
      'smtp://u:hun%zzter2@mail.example.com': /% not followed by two hexadecimal digits/,
      'smtp://u:hunter2/x@mail.example.com': /does not parse as a URL|a path|host/,
      'smtp://u@mail.example.com': /both a user and a password/,
      'smtp://u:hunter2@mail.example.com/path': /a path has no meaning/,
      'not a url hunter2': /does not parse as a URL/,
    }
    for (const [url, expected] of Object.entries(bad)) {
      const problem = parseSmtpUrl(url)
      assert.equal(typeof problem, 'string', url)
      assert.match(problem as string, expected, url)
      assert.doesNotMatch(problem as string, /hunter2|hun%zzter2/, url)
    }
  })

  test('MAIL_FROM: an address, or a display name and an address', () => {
    assert.deepEqual(parseMailFrom('noreply@example.com'), { address: 'noreply@example.com', domain: 'example.com' })
    assert.deepEqual(parseMailFrom('"Example, Inc." <noreply@mail.example.com>'), {
      address: 'noreply@mail.example.com',
      domain: 'mail.example.com',
      name: 'Example, Inc.',
    })
    assert.match(parseMailFrom('Example <noreply@example.com>\r\nBcc: x@example.net') as string, /line break/)
    assert.match(parseMailFrom('no address') as string, /not plain ASCII local@domain/)
  })
})

describe('sending through a real SMTP server', () => {
  test(
    'STARTTLS then AUTH PLAIN: the message arrives with its headers, and its text decodes to what was ' + 'sent',
    async () => {
      const server = await startExim()
      const sent = message()
      await transportFor(server, urlOf(server)).send(sent)

      assert.deepEqual(server.accepted(), [{ from: 'accounts@example.com', tls: true, auth: 'plain' }])
      const [mail] = await server.received(1)
      const parsed = await parse(mail!.raw)
      assert.deepEqual(parsed.from, { name: 'Exämple Accounts', address: 'accounts@example.com' })
      assert.deepEqual(parsed.to, [{ name: '', address: 'ada@example.org' }])
      assert.equal(parsed.subject, sent.subject)
      assert.equal(parsed.messageId, `<${sent.id}@example.com>`)
      assert.ok(Math.abs(Date.parse(parsed.date!) - Date.now()) < 60_000, parsed.date)
      assert.equal(parsed.text, sent.text)
      const header = (key: string) => parsed.headers.find((h) => h.key === key)?.value
      assert.equal(header('envelope-to'), 'ada@example.org')
      assert.equal(header('return-path'), '<accounts@example.com>')
      assert.equal(header('mime-version'), '1.0')
      assert.equal(header('content-type'), 'text/plain; charset=utf-8')
      assert.equal(header('content-transfer-encoding'), 'quoted-printable')
    },
  )

  test(
    'non-ASCII subject and body, a long line, trailing space and lines starting with "." arrive intact as 7-bit ' +
      'lines',
    async () => {
      const server = await startExim()
      const long = 'Grüße aus Köln = 100 % ✓ '.repeat(60)
      const text = `Bonjour Zoë,\n.\n.hidden line\n..two dots\n${long}\ntrailing space \ttab\t\n= equals at the start\n`
      const subject = 'Réinitialisez votre mot de passe — 密码重置 ✉ '.repeat(3).trim()
      await transportFor(server, urlOf(server)).send(message({ subject, text }))

      const [mail] = await server.received(1)
      // From the client's first field on (exim puts its trace fields first); the maildir holds the lines with LF.
      const raw = mail!.sent.toString('latin1')
      const lines = raw.split('\n')
      // Seven-bit, and no line past 78 (headers) or 76 (the quoted-printable body).
      assert.match(raw, /^[\x00-\x7f]*$/)
      const bodyStart = lines.indexOf('')
      assert.ok(
        lines.slice(0, bodyStart).every((l) => l.length <= 78),
        'a header line is longer than 78',
      )
      assert.ok(
        lines.slice(bodyStart + 1).every((l) => l.length <= 76),
        'a body line is longer than 76',
      )
      // White space at the end of a line is encoded: a transport may strip it (RFC 2045 6.7 (3)).
      assert.ok(
        lines.every((l) => !/[ \t]$/.test(l)),
        'a line ends with white space',
      )
      // The server undid the dot-stuffing: a line that is a lone "." did not end the data early.
      assert.ok(
        lines.includes('.') && lines.includes('.hidden line') && lines.includes('..two dots'),
        'the lines starting with "." did not arrive as written',
      )
      const parsed = await parse(mail!.raw)
      assert.equal(parsed.subject, subject)
      assert.equal(parsed.text, text)
    },
  )

  test('the same message sent again (a retry) has the same Message-ID', async () => {
    const server = await startExim()
    const transport = transportFor(server, urlOf(server))
    await transport.send(message())
    await transport.send(message())
    const [first, second] = await Promise.all((await server.received(2)).map((m) => parse(m.raw)))
    assert.equal(first!.messageId, second!.messageId)
    assert.equal(first!.messageId, '<7f9c2a6e-0b7d-4c1e-9d7a-3f1e2b4c5d6e@example.com>')
  })

  test('AUTH LOGIN when the server offers only LOGIN', async () => {
    const server = await startExim({ authMethods: ['LOGIN'] })
    await transportFor(server, urlOf(server)).send(message())
    assert.deepEqual(server.accepted(), [{ from: 'accounts@example.com', tls: true, auth: 'login' }])
    assert.equal((await server.received(1)).length, 1)
  })

  test('smtps://: TLS from the first byte', async () => {
    const server = await startExim({ tls: 'implicit' })
    await transportFor(server, urlOf(server, 'smtps')).send(message())
    assert.deepEqual(server.accepted(), [{ from: 'accounts@example.com', tls: true, auth: 'plain' }])
    assert.equal((await server.received(1)).length, 1)
  })

  test('smtp://…?starttls=off to this machine: AUTH and the message in clear, as asked', async () => {
    const server = await startExim({ tls: 'none' })
    await transportFor(server, urlOf(server, 'smtp', '?starttls=off')).send(message())
    assert.deepEqual(server.accepted(), [{ from: 'accounts@example.com', tls: false, auth: 'plain' }])
    assert.equal((await server.received(1)).length, 1)
  })
})

describe('failures the outbox sees', () => {
  test('a wrong password: 535, permanent, nothing sent', async () => {
    const server = await startExim()
    const error = await failure(transportFor(server, urlOf(server, 'smtp', '', 'wrong')).send(message()))
    assert.equal(error.permanent, true)
    assert.match(error.message, /^SMTP 127\.0\.0\.1:\d+: AUTH PLAIN refused: 535 Incorrect authentication data$/)
    assert.equal(server.authFailures(), 1)
    assert.deepEqual(server.accepted(), [])
  })

  test("a temporary refusal (451 4.3.0): transient, with the server's words and enhanced code", async () => {
    const server = await startExim()
    const error = await failure(transportFor(server, urlOf(server)).send(message({ to: 'later@defer.test' })))
    assert.equal(error.permanent, false)
    assert.match(error.message, /RCPT TO refused: 451 4\.3\.0 Try again later$/)
    assert.deepEqual(server.accepted(), [])
  })

  test(
    "a refused recipient (550 5.1.1): permanent, with the server's words but not the address they name (the error " +
      'is logged and stored)',
    async () => {
      const server = await startExim()
      const error = await failure(transportFor(server, urlOf(server)).send(message({ to: 'nobody@bounce.test' })))
      assert.equal(error.permanent, true)
      assert.match(error.message, /RCPT TO refused: 550 5\.1\.1 <address>: No such user$/)
      assert.ok(!error.message.includes('nobody'))
    },
  )

  test('STARTTLS required but not offered: permanent, and neither AUTH nor the message goes in clear', async () => {
    // This server offers AUTH in clear: the client must not take it.
    const server = await startExim({ tls: 'none' })
    const error = await failure(transportFor(server, urlOf(server)).send(message()))
    assert.equal(error.permanent, true)
    assert.match(error.message, /does not offer STARTTLS, which SMTP_URL requires/)
    assert.equal(server.connections(), 1)
    assert.deepEqual(await server.withoutMail(), [['EHLO', 'QUIT']])
    assert.equal(server.authFailures(), 0)
  })

  test('a certificate the client does not trust: refused before anything is sent', async () => {
    const server = await startExim()
    const untrusting = createSmtpTransport({
      server: parseSmtpUrl(urlOf(server)) as SmtpServer,
      from: FROM,
      timeoutMs: 5000,
    })
    const error = await failure(untrusting.send(message()))
    assert.equal(error.permanent, false)
    assert.match(
      error.message,
      /TLS certificate is not trusted \((DEPTH_ZERO_SELF_SIGNED_CERT|SELF_SIGNED_CERT_IN_CHAIN)/,
    )
    assert.equal(server.authFailures(), 0)
    assert.deepEqual(server.accepted(), [])

    const implicit = await startExim({ tls: 'implicit' })
    const direct = createSmtpTransport({
      server: parseSmtpUrl(urlOf(implicit, 'smtps')) as SmtpServer,
      from: FROM,
      timeoutMs: 5000,
    })
    assert.match((await failure(direct.send(message()))).message, /TLS certificate is not trusted/)
    assert.deepEqual(implicit.accepted(), [])
  })

  test('a server that accepts the connection and never answers: a time-out naming the step, transient', async () => {
    const silent = await scriptedServer('', () => '')
    const transport = createSmtpTransport({
      server: parseSmtpUrl(`smtp://u:p@127.0.0.1:${silent.port}`) as SmtpServer,
      from: FROM,
      timeoutMs: 300,
    })
    const error = await failure(transport.send(message()))
    assert.equal(error.permanent, false)
    assert.match(error.message, /no answer to the greeting within 0\.3 s/)
  })

  test(
    'a sender that gives up (its time is out) ends the session at once: the step under way fails as transient, ' +
      'nothing can complete behind its retry',
    async () => {
      // A server that is slow at the end of the data (a content scan,
      // say): the message would be taken after the sender retried.
      const slow = await scriptedServer('220 slow.test ESMTP\r\n', (line) =>
        line.startsWith('EHLO')
          ? '250 slow.test\r\n'
          : line.startsWith('MAIL') || line.startsWith('RCPT')
            ? '250 2.1.0 Ok\r\n'
            : line === 'DATA'
              ? '354 Go ahead\r\n'
              : '',
      )
      const transport = createSmtpTransport({
        server: parseSmtpUrl(`smtp://127.0.0.1:${slow.port}?starttls=off`) as SmtpServer,
        from: FROM,
        timeoutMs: 600_000,
      })
      const giveUp = new AbortController()
      const sending = failure(transport.send(message(), giveUp.signal))
      await waitUntil('the DATA command', () => slow.commands.includes('DATA'))
      const abortedAt = performance.now()
      giveUp.abort()
      const error = await sending
      assert.equal(error.permanent, false)
      // Only the give-up can end it this side of the 10-minute step time-out; a minute is room for any machine.
      assert.ok(performance.now() - abortedAt < 60_000, 'ended at the give-up, not at the step time-out')
    },
  )

  test(
    'a server that sends more after its STARTTLS reply (an injection before TLS): refused, nothing read as ' +
      'encrypted',
    async () => {
      // RFC 3207 6: the extra line came in clear, from anyone on the path; read after the handshake it would pass as
      // the server's.
      const hostile = await scriptedServer('220 mx.test ESMTP\r\n', (line) =>
        line.startsWith('EHLO')
          ? '250-mx.test\r\n250-AUTH PLAIN\r\n250 STARTTLS\r\n'
          : line === 'STARTTLS'
            ? '220 2.0.0 Ready to start TLS\r\n250 2.0.0 injected\r\n'
            : '',
      )
      const transport = createSmtpTransport({
        server: parseSmtpUrl(`smtp://u:p@127.0.0.1:${hostile.port}`) as SmtpServer,
        from: FROM,
        timeoutMs: 5000,
      })
      const error = await failure(transport.send(message()))
      assert.equal(error.permanent, false)
      assert.match(error.message, /sent data after its STARTTLS reply/)
      assert.deepEqual(hostile.commands, ['EHLO', 'STARTTLS'])
    },
  )

  test(
    'EHLO refused as unknown (502): HELO instead, which offers no STARTTLS, so nothing more; EHLO refused for now ' +
      '(421): no HELO, transient',
    async () => {
      const old = await scriptedServer('220 old.test SMTP\r\n', (line) =>
        line.startsWith('EHLO')
          ? '502 5.5.1 Unrecognized command\r\n'
          : line.startsWith('HELO')
            ? '250 old.test\r\n'
            : '',
      )
      const error = await failure(
        createSmtpTransport({
          server: parseSmtpUrl(`smtp://u:p@127.0.0.1:${old.port}`) as SmtpServer,
          from: FROM,
          timeoutMs: 5000,
        }).send(message()),
      )
      assert.equal(error.permanent, true)
      assert.match(error.message, /does not offer STARTTLS/)
      assert.deepEqual(old.commands, ['EHLO', 'HELO', 'QUIT'])

      const busy = await scriptedServer('220 busy.test ESMTP\r\n', (line) =>
        line.startsWith('EHLO') ? '421 4.3.2 Too busy\r\n' : '',
      )
      const later = await failure(
        createSmtpTransport({
          server: parseSmtpUrl(`smtp://u:p@127.0.0.1:${busy.port}`) as SmtpServer,
          from: FROM,
          timeoutMs: 5000,
        }).send(message()),
      )
      assert.equal(later.permanent, false)
      assert.match(later.message, /EHLO refused: 421 4\.3\.2 Too busy/)
      assert.deepEqual(busy.commands, ['EHLO', 'QUIT'])
    },
  )

  test('nothing listening: a connection failure, transient', async () => {
    const port = await freePort()
    const transport = createSmtpTransport({
      server: parseSmtpUrl(`smtp://u:p@127.0.0.1:${port}`) as SmtpServer,
      from: FROM,
      timeoutMs: 5000,
    })
    const error = await failure(transport.send(message()))
    assert.equal(error.permanent, false)
    assert.match(error.message, /connection failed \(ECONNREFUSED\)/)
  })

  test('a recipient or subject with a line break is refused before connecting (header injection)', async () => {
    const server = await startExim()
    const transport = transportFor(server, urlOf(server))
    for (const fields of [
      { to: 'ada@example.org\r\nBcc: everyone@example.net' },
      { to: 'ada@example.org>\r\nRCPT TO:<other@example.net' },
      { subject: 'Hello\r\nBcc: everyone@example.net' },
      { subject: 'Hello\nX-Injected: yes' },
    ]) {
      const error = await failure(transport.send(message(fields)))
      assert.equal(error.permanent, true, JSON.stringify(fields))
    }
    assert.equal(server.connections(), 0)
  })
})

test('the server certificate is trusted through NODE_EXTRA_CA_CERTS, as an operator configures it', async () => {
  const server = await startExim()
  const dir = mkdtempSync(join(tmpdir(), 'upa-smtp-ca-'))
  after(() => rmSync(dir, { recursive: true, force: true }))
  writeFileSync(join(dir, 'ca.pem'), server.ca)
  const script =
    `
    import { createSmtpTransport } from ${JSON.stringify(new URL('../src/mail/smtp.ts', import.meta.url).href)}
    import { parseSmtpUrl } from ${JSON.stringify(new URL('../src/mail/smtp-url.ts', import.meta.url).href)}
    import { parseMailFrom } from ${JSON.stringify(new URL('../src/mail/address.ts', import.meta.url).href)}
    const transport = createSmtpTransport({ server: parseSmtpUrl(process.env.SMTP_URL), from: ` +
    `parseMailFrom('accounts@example.com') })
    await transport.send({ id: 'ca-1', type: 'mail.verify_email', to: 'ada@example.org', subject: 'Verify', text: ` +
    `'Hi', link: null })
  `
  const env = { ...process.env, SMTP_URL: urlOf(server), NODE_EXTRA_CA_CERTS: join(dir, 'ca.pem') }
  // Asynchronously: this process's event loop runs the server.
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
    env,
    stdio: ['ignore', 'ignore', 'pipe'],
  })
  let stderr = ''
  child.stderr.setEncoding('utf8').on('data', (t: string) => (stderr += t))
  const status = await new Promise<number | null>((resolve) => child.once('exit', resolve))
  assert.equal(status, 0, stderr)
  assert.equal((await server.received(1)).length, 1)
})
