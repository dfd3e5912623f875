import { isIP } from 'node:net'
import { hostOf, requestOnce, type OutboundOutcome } from '../core/http/outbound.js'
import { addressList } from '../core/lib/address-list.js'
import { signingSecretProblem, standardWebhookHeaders } from '../core/http/standard-webhooks.js'
import { MailSendError, type MailMessage, type MailTransport } from './message.js'

// The mail hook: each message is a Standard Webhooks POST to MAIL_HOOK_URL,
// signed with MAIL_HOOK_SECRET, so that a small receiver of the operator's
// hands it to a mail provider's HTTP API (docs/auth.md, "A receiver for the
// mail hook"), as Supabase's "send email hook" does. The signing and the
// bounded POST are the webhooks' (src/core/http/standard-webhooks.ts,
// src/core/http/outbound.ts); what differs is whose URL it is. A webhook's
// URL comes from an API caller, so it is held to the SSRF policy; this one
// comes from the operator's configuration, so loopback and private
// addresses are allowed: a receiver beside the service is the usual set-up.
//
// http is allowed, except in production to anything but this host: every
// message carries a password-reset or verification link, which is a
// credential for the account, and plain http across a network gives it to
// whoever can read that network. Loopback is the line the SMTP transport
// draws for a connection without TLS too.
//
// What comes of an attempt: a 2xx means the receiver took the message. A
// 4xx means it refused this message and will refuse it again (permanent),
// except 408 and 429, which ask to come back later; a 5xx, a redirect (not
// followed: fixing MAIL_HOOK_URL lets the queued mail through), a time-out or
// a connection that failed are retried. Errors name the receiver's origin
// and what happened, never the message's text or link.

export interface HookSettings {
  /** MAIL_HOOK_URL, checked by hookSettingProblems. */
  url: string
  /** MAIL_HOOK_SECRET: whsec_ and base64. */
  secret: string
  /** From the start of an attempt to the end of the answer; default 10 s. */
  timeoutMs?: number
  /** Bytes of the receiver's answer read at most; default 64 KiB. */
  maxResponseBytes?: number
}

const DEFAULT_TIMEOUT_MS = 10_000
const DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024
const USER_AGENT = 'users-products-api-mail/1 (Standard Webhooks)'

/** 408 Request Timeout and 429 Too Many Requests: the receiver asks to be tried again. */
const RETRYABLE_CLIENT_ERRORS: ReadonlySet<number> = new Set([408, 429])

export function createHookTransport(settings: HookSettings): Required<MailTransport> {
  const url = new URL(settings.url)
  const where = `the mail hook (${url.origin})`
  const timeoutMs = settings.timeoutMs ?? DEFAULT_TIMEOUT_MS
  const maxResponseBytes = settings.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES
  // Aborted once close's deadline passes: an attempt cut short is retried later, by this instance or another.
  const stopping = new AbortController()
  const inFlight = new Set<Promise<OutboundOutcome>>()

  return {
    name: 'hook',
    async send(message: MailMessage, giveUp?: AbortSignal): Promise<void> {
      // Exactly these members: the id travels as webhook-id, and nothing else of the outbox leaves the service.
      const body = JSON.stringify({
        type: message.type,
        to: message.to,
        subject: message.subject,
        text: message.text,
        link: message.link,
      })
      const headers = standardWebhookHeaders([settings.secret], message.id, body, USER_AGENT)
      const signal = giveUp ? AbortSignal.any([stopping.signal, giveUp]) : stopping.signal
      const attempt = requestOnce({ url, headers, body, timeoutMs, maxResponseBytes, signal })
      inFlight.add(attempt)
      const outcome = await attempt.finally(() => inFlight.delete(attempt))
      if (outcome.ok) return
      const permanent =
        outcome.status !== undefined &&
        outcome.status >= 400 &&
        outcome.status < 500 &&
        !RETRYABLE_CLIENT_ERRORS.has(outcome.status)
      throw new MailSendError(`${where}: ${outcome.error ?? 'the attempt failed'}`, permanent)
    },
    async close(deadline: number): Promise<void> {
      const timer = setTimeout(() => stopping.abort(), Math.max(0, deadline - performance.now()))
      await Promise.allSettled(inFlight)
      clearTimeout(timer)
    },
  }
}

/**
 * A problem with the mail hook's configuration: the variable to change, and what is wrong (config.ts prefixes the name,
 * or its _FILE).
 */
export interface HookSettingProblem {
  variable: 'MAIL_HOOK_URL' | 'MAIL_HOOK_SECRET'
  problem: string
}

const loopback = addressList([
  ['127.0.0.0', 8, 'ipv4'],
  ['::1', 128, 'ipv6'],
])
/** localhost and its subdomains, which always mean loopback (RFC 6761), with or without the root's dot. */
const LOCALHOST = /^(.+\.)?localhost\.?$/i

/** Whether a URL's host is this machine by its form alone (a name is not resolved). */
function isLoopbackHost(url: URL): boolean {
  const host = hostOf(url)
  const family = isIP(host)
  // An IPv4-mapped IPv6 address (::ffff:127.0.0.1) is matched against the IPv4 rule.
  return family === 0 ? LOCALHOST.test(host) : loopback.check(host, family === 4 ? 'ipv4' : 'ipv6')
}

/**
 * What is wrong with MAIL_HOOK_URL and MAIL_HOOK_SECRET (unset: undefined),
 * one problem per variable; none when both are unset (no hook) or both are
 * right. Never quotes the secret, nor the URL (its query may hold a key).
 */
export function hookSettingProblems(given: {
  url: string | undefined
  secret: string | undefined
  production: boolean
}): HookSettingProblem[] {
  const problems: HookSettingProblem[] = []
  if (given.url === undefined && given.secret === undefined) return problems
  if (given.url === undefined) {
    problems.push({
      variable: 'MAIL_HOOK_URL',
      problem: 'required with MAIL_HOOK_SECRET (set both to send mail through the hook, or neither)',
    })
  } else {
    const urlProblem = hookUrlProblem(given.url, given.production)
    if (urlProblem) problems.push({ variable: 'MAIL_HOOK_URL', problem: urlProblem })
  }
  if (given.secret === undefined) {
    problems.push({
      variable: 'MAIL_HOOK_SECRET',
      problem:
        "required with MAIL_HOOK_URL: the receiver tells the service's messages from forged ones by their signature",
    })
  } else {
    const secretProblem = signingSecretProblem(given.secret)
    if (secretProblem) problems.push({ variable: 'MAIL_HOOK_SECRET', problem: secretProblem })
  }
  return problems
}

function hookUrlProblem(raw: string, production: boolean): string | undefined {
  if (!URL.canParse(raw)) return 'must be an http:// or https:// URL (it does not parse as a URL)'
  const url = new URL(raw)
  if (url.protocol !== 'https:' && url.protocol !== 'http:')
    return `must be an http:// or https:// URL (not ${url.protocol}//)`
  if (!hostOf(url)) return 'must name a host'
  if (url.username || url.password)
    return 'must not carry a user name or password: the receiver knows the service by the signature (MAIL_HOOK_SECRET)'
  if (production && url.protocol === 'http:' && !isLoopbackHost(url)) {
    return (
      'must be https when NODE_ENV=production, unless it points at this host (localhost, 127.0.0.1, [::1]): ' +
      'every message carries a password-reset or verification link, a credential for the account'
    )
  }
  return undefined
}
