import type { MailFrom } from './address.js'
import type { MailMessage } from './message.js'

// The text of a message as RFC 5322 and MIME (RFC 2045, 2047) want it:
// seven-bit lines of at most 78 characters joined by CRLF, so that it goes
// through any server unchanged (no 8BITMIME or SMTPUTF8 needed). The body is
// quoted-printable UTF-8, a non-ASCII header text is a run of encoded-words.
// SMTP's own framing (dot-stuffing, the final ".") is the session's job.

const CRLF = '\r\n'
/** RFC 2045 6.7 (5): an encoded line is at most 76 characters, the soft break's "=" included. */
const QP_LINE = 76
/**
 * RFC 2047 2: a header line holding an encoded-word is at most 76
 * characters. 39 bytes make a word of 64, which fits after "Subject: ".
 */
const WORD_BYTES = 39
/** RFC 5322 2.1.1: header lines should be at most 78 characters. */
const HEADER_LINE = 78

/** One byte as =XX (RFC 2045 6.7 (1)). */
const escape = (byte: number) => `=${byte.toString(16).toUpperCase().padStart(2, '0')}`

/**
 * A byte that stands for itself in quoted-printable: printable ASCII but "=" (RFC 2045 6.7 (2)); space and tab only
 * inside a line.
 */
const literal = (byte: number) => (byte >= 33 && byte <= 126 && byte !== 61) || byte === 32 || byte === 9

/** One line of text (no line break) as quoted-printable lines, joined by soft line breaks. */
function quotedPrintableLine(line: string): string {
  const bytes = Buffer.from(line, 'utf8')
  const tokens = [...bytes].map((byte, i) => {
    // Trailing white space is removed by some transports (RFC 2045 6.7 (3)): it is encoded.
    const last = i === bytes.length - 1
    return literal(byte) && !(last && (byte === 32 || byte === 9)) ? String.fromCharCode(byte) : escape(byte)
  })
  const lines: string[] = []
  let current = ''
  for (const token of tokens) {
    // A soft break ("=" at the end) costs one character; an =XX is never split.
    if (current.length + token.length > QP_LINE - 1) {
      lines.push(`${current}=`)
      current = ''
    }
    current += token
  }
  // The last piece may use the whole 76 when it ends the line: then it holds no soft break.
  const last =
    lines.length && lines[lines.length - 1]!.length - 1 + current.length <= QP_LINE
      ? lines.pop()!.slice(0, -1) + current
      : current
  return [...lines, last].join(CRLF)
}

/** `text` (lines separated by \n, \r\n or \r) as a quoted-printable body with CRLF line breaks. */
export function quotedPrintable(text: string): string {
  return text
    .split(/\r\n|\r|\n/)
    .map(quotedPrintableLine)
    .join(CRLF)
}

/** Whether a header text can go as it is: printable ASCII and spaces only, short enough for one line. */
const plainHeaderText = (text: string, room: number) =>
  /^[\x20-\x7e]*$/.test(text) && !/=\?/.test(text) && text.length <= room

/**
 * `text` as RFC 2047 encoded-words ("B" encoding of UTF-8), one a line,
 * each holding whole characters only (2047 section 5: a character is never
 * split across words), separated by folding white space.
 */
export function encodedWords(text: string): string {
  const prefix = '=?UTF-8?B?'
  const words: string[] = []
  let bytes: Buffer[] = []
  let size = 0
  const flush = () => {
    if (size) words.push(`${prefix}${Buffer.concat(bytes).toString('base64')}?=`)
    bytes = []
    size = 0
  }
  for (const character of text) {
    const encoded = Buffer.from(character, 'utf8')
    if (size + encoded.length > WORD_BYTES) flush()
    bytes.push(encoded)
    size += encoded.length
  }
  flush()
  return words.join(`${CRLF} `)
}

/** A header field whose value is free text (Subject, a display name): as it is when it can be, else encoded-words. */
function textField(name: string, text: string): string {
  return `${name}: ${plainHeaderText(text, HEADER_LINE - name.length - 2) ? text : encodedWords(text)}`
}

/** RFC 5322 3.3 date-time in UTC: toUTCString's form with a numeric zone ("GMT" is obsolete syntax there). */
export const rfc5322Date = (date: Date) => date.toUTCString().replace(/GMT$/, '+0000')

/**
 * The Message-ID of a message: its outbox id at the sender's domain, the same
 * on every attempt, so that a receiver that got it twice (sent, then the
 * acknowledgement lost) can tell. An id with characters a msg-id cannot hold
 * is carried in hexadecimal.
 */
export function messageId(id: string, from: MailFrom): string {
  const left = /^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*$/.test(id)
    ? id
    : Buffer.from(id, 'utf8').toString('hex')
  return `<${left}@${from.domain}>`
}

/** The From field's value: the address alone, or a display name (quoted, or encoded-words) and the address. */
function mailbox(from: MailFrom): string {
  if (from.name === undefined) return from.address
  // The address goes on a line of its own after encoded-words, which keep their lines to 76 characters.
  if (!/^[\x20-\x7e]*$/.test(from.name)) return `${encodedWords(from.name)}${CRLF} <${from.address}>`
  return `"${from.name.replace(/["\\]/g, '\\$&')}" <${from.address}>`
}

/**
 * The whole message: header fields, an empty line, the body; CRLF line
 * breaks, no final line break (the session ends the data with CRLF "." CRLF).
 * The caller has checked `to` (isMailAddress) and that `subject` holds no line break.
 */
export function renderMessage(message: MailMessage, from: MailFrom, date: Date): string {
  return [
    `Date: ${rfc5322Date(date)}`,
    `From: ${mailbox(from)}`,
    `To: ${message.to}`,
    textField('Subject', message.subject),
    `Message-ID: ${messageId(message.id, from)}`,
    'MIME-Version: 1.0',
    'Content-Type: text/plain; charset=utf-8',
    'Content-Transfer-Encoding: quoted-printable',
    '',
    quotedPrintable(message.text),
  ].join(CRLF)
}
