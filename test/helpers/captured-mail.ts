import assert from 'node:assert/strict'
import type { Sql } from 'postgres'
import { createConsoleTransport } from '../../src/mail/console.js'
import { waitUntil } from './wait.js'

// The messages a service sends, captured: its mail worker writes each to a
// console transport of the test's (what development prints), and a test
// reads them back, waits for them, and takes the link out of one.

export interface Sent {
  id: string
  type: string
  to: string
  subject: string
  text: string
}

export interface CapturedMail {
  /** For startServer's options: `{ tuning: mail.tuning }`. */
  tuning: { mail: { transport: ReturnType<typeof createConsoleTransport>; pollMs: number } }
  /** Everything sent so far, in order. */
  sent(): Sent[]
  /** The messages to `to` of `type`, once `count` of them have been sent (their outbox rows gone from `sql`). */
  messagesTo(sql: Sql, to: string, type: string, count?: number): Promise<Sent[]>
}

export function captureMail(): CapturedMail {
  const outputs: string[] = []
  const transport = createConsoleTransport((text) => void outputs.push(text))
  const sent = (): Sent[] =>
    outputs.map((text) => {
      const header = (name: string) => new RegExp(`^${name}: (.*)$`, 'm').exec(text)![1]!
      return { id: header('Message-ID'), type: header('Type'), to: header('To'), subject: header('Subject'), text }
    })
  return {
    tuning: { mail: { transport, pollMs: 50 } },
    sent,
    async messagesTo(sql, to, type, count = 1) {
      let found: Sent[] = []
      await waitUntil(
        `${count} ${type} to ${to} sent`,
        async () => {
          found = sent().filter((m) => m.to === to && m.type === type)
          if (found.length < count) return false
          const [left] = await sql`
            SELECT count(*)::int AS n FROM mail_outbox WHERE recipient = ${to} AND type = ${type}`
          return left!.n === 0
        },
        5000,
      )
      return found
    },
  }
}

/** The one-time token in a message's link made from `template` (its `{token}` replaced). */
export function tokenIn(message: Sent, template: string): string {
  const prefix = template.slice(0, template.indexOf('{token}')).replace(/[.?/]/g, (c) => `\\${c}`)
  const m = new RegExp(`^${prefix}(upa_ot_[A-Za-z0-9_-]{43})$`, 'm').exec(message.text)
  assert.ok(m, `no link in ${message.text}`)
  return m[1]!
}
