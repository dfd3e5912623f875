// The addresses a message names: MAIL_FROM (an address, optionally with a
// display name) and a message's `to`. Both go into SMTP commands
// (`MAIL FROM:<…>`, `RCPT TO:<…>`) and into header fields, so a character
// that ends a command or a header (CR, LF), closes the angle brackets or
// starts a comment or a group must never get through: such an address is
// refused, not cleaned up (a cleaned address is someone else's).
//
// Only plain ASCII addresses (RFC 5321 Mailbox without quoted local parts or
// address literals): the service never asks the server for SMTPUTF8.

/** local@domain: printable ASCII without the characters that are syntax in SMTP commands or header fields. */
const ADDRESS = /^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*$/
/** RFC 5321 4.5.3.1.3: a path is at most 256 octets, brackets included. */
const MAX_ADDRESS = 254

/** Whether `address` can go into an SMTP command and a header field as it is. */
export const isMailAddress = (address: string): boolean => address.length <= MAX_ADDRESS && ADDRESS.test(address)

export interface MailFrom {
  address: string
  /** The display name, as given (encoded when the header is written). */
  name?: string
  /** The part after the @: what Message-IDs end with. */
  domain: string
}

/**
 * MAIL_FROM: `noreply@example.com`, or `Example <noreply@example.com>`, or
 * `"Example, Inc." <noreply@example.com>`. Returns the sender, or a line
 * saying what is wrong (for `MAIL_FROM: <line>`).
 */
export function parseMailFrom(value: string): MailFrom | string {
  const shape = 'must be an address (noreply@example.com) or a name and an address (Example <noreply@example.com>)'
  if (/[\r\n]/.test(value)) return `${shape}; it holds a line break`
  const trimmed = value.trim()
  const named = /^(.*?)\s*<([^<>]*)>$/.exec(trimmed)
  const address = named ? named[2]! : trimmed
  if (!isMailAddress(address))
    return `${shape} (got ${JSON.stringify(value)}): the address is not plain ASCII local@domain`
  let name = named?.[1]?.trim()
  if (name?.startsWith('"') && name.endsWith('"') && name.length >= 2) name = name.slice(1, -1).replace(/\\(.)/g, '$1')
  if (name !== undefined && /[\p{Cc}]/u.test(name))
    return `${shape} (got ${JSON.stringify(value)}): the name holds a control character`
  return { address, domain: address.slice(address.lastIndexOf('@') + 1), ...(name ? { name } : {}) }
}
