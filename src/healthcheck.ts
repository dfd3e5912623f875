import { request as httpRequest, type IncomingMessage } from 'node:http'
import { request as httpsRequest } from 'node:https'
import { isIP } from 'node:net'
import { ConfigError } from './core/config-error.js'
import { loadConfig, type Config } from './config.js'

// `node dist/main.js healthcheck [--ready]`: the image's HEALTHCHECK. It reads
// the configuration the server reads (PORT, HOST, API_PREFIX, TLS_CERT_FILE)
// and asks the service on its own address, so a prefix or HTTPS cannot make a
// healthy container look dead. It runs every few seconds beside the service:
// no database, no migration, no logger, one request with a short time-out.
// Exit 0 when healthy, 1 otherwise (Docker reserves 2), with one line saying
// what was asked and what came back.

/** Well inside the Dockerfile's `HEALTHCHECK --timeout=3s`, so the reason is ours, not Docker's "timed out". */
export const HEALTHCHECK_TIMEOUT_MS = 2000
/** /healthz and /readyz answer a few dozen bytes; more is not the service. */
const MAX_BODY_BYTES = 4096

export type Probe = 'liveness' | 'readiness'

const PROBES: Record<Probe, { path: string; status: string }> = {
  // The process answers: what a supervisor restarts a container for.
  liveness: { path: '/healthz', status: 'ok' },
  // The database answers and the instance is not draining: what a load balancer routes by.
  readiness: { path: '/readyz', status: 'ready' },
}

/**
 * Where the service answers, seen from its own host: an unspecified listen
 * address (0.0.0.0, ::) is reached on loopback, any other on itself.
 */
export function healthUrl(config: Pick<Config, 'host' | 'port' | 'apiPrefix' | 'tls'>, probe: Probe): URL {
  const host = config.host === '0.0.0.0' ? '127.0.0.1' : config.host === '::' ? '::1' : config.host
  const authority = isIP(host) === 6 ? `[${host}]` : host
  return new URL(
    `${config.tls ? 'https' : 'http'}://${authority}:${config.port}${config.apiPrefix}${PROBES[probe].path}`,
  )
}

/** Undefined when the service answers the probe as a healthy one does; otherwise why not, in a few words. */
export function checkHealth(
  config: Pick<Config, 'host' | 'port' | 'apiPrefix' | 'tls'>,
  probe: Probe,
  timeoutMs = HEALTHCHECK_TIMEOUT_MS,
): Promise<string | undefined> {
  const url = healthUrl(config, probe)
  const expected = PROBES[probe].status
  const request = config.tls ? httpsRequest : httpRequest
  return new Promise((resolve) => {
    let settled = false
    const finish = (reason: string | undefined) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      req.destroy()
      resolve(reason)
    }
    const req = request(
      url,
      {
        headers: { accept: 'application/json', connection: 'close' },
        agent: false,
        // The certificate is issued for the service's public name, not for the loopback address asked here, and may
        // be signed by a CA this container does not hold. Nothing secret is sent and only a status is read, from this
        // host's own service, so its identity is not checked: a renewal
        // in progress must not make a live service "dead".
        rejectUnauthorized: false,
      },
      (res) =>
        readBody(res).then(
          (body) => finish(judge(res.statusCode, body, expected, config)),
          (err: unknown) => finish(failure(err, config)),
        ),
    )
    req.on('error', (err) => finish(failure(err, config)))
    req.end()
    const timer = setTimeout(() => finish(`no answer within ${timeoutMs / 1000} s`), timeoutMs)
  })
}

function readBody(res: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = ''
    res.setEncoding('utf8')
    res.on('data', (chunk: string) => {
      text += chunk
      if (text.length > MAX_BODY_BYTES) res.destroy(new Error(`an answer of over ${MAX_BODY_BYTES} bytes`))
    })
    res.on('end', () => resolve(text))
    res.on('error', reject)
  })
}

function judge(
  status: number | undefined,
  body: string,
  expected: string,
  config: Pick<Config, 'apiPrefix' | 'tls'>,
): string | undefined {
  if (status === 200) {
    try {
      if ((JSON.parse(body) as { status?: unknown }).status === expected) return undefined
    } catch {}
    return `answered 200 without {"status":"${expected}"}: another program on this port?`
  }
  if (status === 404) return `answered 404: does the service run with API_PREFIX=${JSON.stringify(config.apiPrefix)}?`
  let detail = ''
  try {
    const problem = JSON.parse(body) as { code?: unknown; detail?: unknown }
    if (typeof problem.code === 'string') detail = ` ${problem.code}`
    // Plain HTTP to the service's HTTPS port: its 400 says so (src/app.ts).
    if (status === 400 && !config.tls && /speaks HTTPS only/.test(String(problem.detail))) return httpsHere(detail)
  } catch {}
  return `answered ${status}${detail}`
}

/** Plain HTTP asked of an HTTPS port, however it refused: what to set. */
const httpsHere = (answer: string) =>
  `${answer ? `answered 400${answer}, as` : 'closed without an answer, as'} an HTTPS port does to plain HTTP: does ` +
  'the service serve HTTPS here (then TLS_CERT_FILE must be set for this check too)?'

function failure(err: unknown, config: Pick<Config, 'port' | 'tls'>): string {
  const { code, message } = err as NodeJS.ErrnoException
  if (code === 'ECONNREFUSED') return `connection refused: is the service running, on PORT=${config.port}?`
  // HTTPS to a plain HTTP server: its answer is no TLS record.
  if (config.tls && (code === 'EPROTO' || /^ERR_SSL_/.test(code ?? '')))
    return `TLS handshake failed (${code}): does the service serve HTTPS (TLS_CERT_FILE), on PORT=${config.port}?`
  // Plain HTTP to an HTTPS server that closes the connection without an answer (this service answers it: judge).
  if (!config.tls && (code === 'ECONNRESET' || message === 'socket hang up')) return httpsHere('')
  return `${message}${code && !message.includes(code) ? ` (${code})` : ''}`
}

/** The command: `healthcheck` asks liveness, `healthcheck --ready` readiness; the exit code for Docker. */
export async function healthcheckCommand(
  args: readonly string[],
  env: Record<string, string | undefined>,
): Promise<0 | 1> {
  if (args.length > 1 || (args.length === 1 && args[0] !== '--ready')) {
    process.stderr.write(
      `healthcheck: unknown ` +
        `argument ${JSON.stringify(args.find((a) => a !== '--ready'))}; usage: healthcheck [--ready]\n`,
    )
    return 1
  }
  const probe: Probe = args[0] === '--ready' ? 'readiness' : 'liveness'
  let config: Config
  try {
    config = loadConfig(env)
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err
    process.stderr.write(`healthcheck: the configuration does not load: ${err.message}\n`)
    return 1
  }
  if (config.port === 0) {
    process.stderr.write('healthcheck: PORT=0 lets the system pick the port, which this check cannot know; set PORT\n')
    return 1
  }
  const started = performance.now()
  const reason = await checkHealth(config, probe)
  const asked = `${probe}: GET ${healthUrl(config, probe).href}`
  if (reason !== undefined) {
    process.stderr.write(`healthcheck: unhealthy, ${asked} ${reason}\n`)
    return 1
  }
  process.stdout.write(`healthcheck: healthy, ${asked} answered 200 in ${Math.round(performance.now() - started)} ms\n`)
  return 0
}
