import { appendFileSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { SMTPServer } from 'smtp-server'

// The SMTP server process of test/helpers/smtp-server.ts:
//   node --import tsx smtp-server-process.ts <options JSON> <folder>
// Nodemailer's smtp-server on a free loopback port, with the certificate in
// <folder>/smtp.{cert,key}.pem. It delivers each message into the maildir
// <folder>/mail (written to tmp/, then renamed into new/, as maildir
// delivery does) and appends what happened, one JSON object a line, to
// <folder>/events.jsonl, both before it answers, so that whatever the
// client was told is already on disk. Prints "listening <port>" when ready.

export interface ServerOptions {
  tls: 'starttls' | 'implicit' | 'none'
  authMethods: string[]
  refuseRecipient?: { code: number; text: string }
  user: string
  password: string
}

const options = JSON.parse(process.argv[2]!) as ServerOptions
const folder = process.argv[3]!
const maildir = join(folder, 'mail')
for (const sub of ['tmp', 'new', 'cur']) mkdirSync(join(maildir, sub), { recursive: true })
const record = (event: Record<string, unknown>) => appendFileSync(join(folder, 'events.jsonl'), `${JSON.stringify(event)}\n`)
let delivered = 0

const server = new SMTPServer({
  secure: options.tls === 'implicit',
  key: readFileSync(join(folder, 'smtp.key.pem')),
  cert: readFileSync(join(folder, 'smtp.cert.pem')),
  name: 'mx.test',
  authMethods: options.authMethods,
  disabledCommands: options.tls === 'none' ? ['STARTTLS'] : [],
  // Without STARTTLS, AUTH in clear is what the client's ?starttls=off asks for (to this machine only).
  allowInsecureAuth: options.tls === 'none',
  hideENHANCEDSTATUSCODES: false,
  logger: false,
  onConnect(_session, callback) {
    record({ type: 'connect' })
    callback()
  },
  onAuth(auth, session, callback) {
    const accepted = auth.username === options.user && auth.password === options.password
    record({ type: 'auth', method: auth.method, secure: session.secure, accepted })
    if (accepted) callback(null, { user: auth.username })
    else callback(Object.assign(new Error('Authentication credentials invalid'), { responseCode: 535 }))
  },
  onMailFrom(address, session, callback) {
    record({ type: 'mail', address: address.address, secure: session.secure })
    callback()
  },
  onRcptTo(_address, _session, callback) {
    const refusal = options.refuseRecipient
    callback(refusal ? Object.assign(new Error(refusal.text), { responseCode: refusal.code }) : undefined)
  },
  onData(stream, session, callback) {
    const chunks: Buffer[] = []
    stream.on('data', (chunk: Buffer) => chunks.push(chunk))
    stream.on('end', () => {
      const file = `${Date.now()}.${process.pid}_${++delivered}.mx.test`
      writeFileSync(join(maildir, 'tmp', file), Buffer.concat(chunks))
      renameSync(join(maildir, 'tmp', file), join(maildir, 'new', file))
      const envelope = session.envelope
      record({ type: 'data', file, from: envelope.mailFrom ? envelope.mailFrom.address : '', to: envelope.rcptTo.map((r) => r.address), secure: session.secure })
      callback()
    })
  },
})
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`listening ${(server.server.address() as { port: number }).port}\n`)
})
process.on('SIGTERM', () => server.close(() => process.exit(0)))
