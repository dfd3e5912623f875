import { spawn, spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { isIP } from 'node:net'
import { selfSignedCertificate, type TestCertificate } from './certificates.js'
import { onFreePorts, PortTaken } from './ports.js'
import { installedProgram } from './programs.js'

// A real nginx (Debian's package; `make test` installs it when missing) running
// the configuration we ship, deploy/nginx.conf, with the changes a test
// needs: its two servers listen on free loopback ports, the 443 one with a
// certificate made for the test, its upstream servers are the test's
// instances (addresses: the shipped `api:3000` is a name no DNS here knows),
// its temporary files go to a folder of its own, and its per-client request
// rate is lifted unless the test is about that rate (the load tests send
// thousands a second from one address). Each change must find exactly what
// it replaces, so a
// reshaped deploy/nginx.conf fails here instead of being tested in a form
// nobody ships.

const SHIPPED = new URL('../../deploy/nginx.conf', import.meta.url)
/** Requests a second per client when lifted: far above what any test sends, so only the shipped rate refuses. */
const LIFTED_RATE = '1000000r/s'

export interface NginxOptions {
  /**
   * The API server speaks TLS as shipped; without, plain HTTP on the same server (no HSTS: it is sent over HTTPS only).
   */
  tls?: boolean
  /** The per-client rate of limit_req as shipped; without, lifted. */
  shippedRate?: boolean
  /** The event stream's location answers 204 itself instead of passing the request on: which paths it takes. */
  probeStreamLocation?: boolean
}

export interface Nginx {
  /** The API server (the shipped 443 one): https:// with `tls`, else http://. */
  url: string
  port: number
  /** The plain HTTP server (the shipped port 80 one). */
  httpUrl: string
  /** The certificate of the API server, for a client's `ca`. */
  ca: string
  /** What nginx wrote to its error log (stderr). */
  errors(): string
  /** The configuration as run. */
  config: string
  /** The master process and its workers (for CPU figures). */
  pids(): number[]
  /** Fast shutdown (SIGTERM); resolves when the master process has exited. */
  stop(): Promise<void>
}

function replaceOnce(
  text: string,
  pattern: RegExp,
  replacement: string | ((match: string, ...groups: string[]) => string),
  what: string,
): string {
  const found = text.match(new RegExp(pattern.source, pattern.flags + 'g'))?.length ?? 0
  if (found !== 1) throw new Error(`deploy/nginx.conf: expected exactly one ${what}, found ${found}`)
  return typeof replacement === 'string' ? text.replace(pattern, replacement) : text.replace(pattern, replacement)
}

/**
 * The shipped configuration with its commented `resolve` alternative (nginx 1.27.3 or later) taken: the `resolver`
 * lines uncommented, and the upstream's commented `server … resolve;` line in place of the one above it.
 */
export function withResolve(config: string): string {
  config = replaceOnce(config, /^(\s*)# (resolver \S+ [^;]*;)$/m, '$1$2', 'commented `resolver`')
  config = replaceOnce(config, /^(\s*)# (resolver_timeout [^;]*;)$/m, '$1$2', 'commented `resolver_timeout`')
  const alternative = /^(\s*)# (server api:3000 [^;]* resolve;)\n/m
  const line = alternative.exec(config)?.[2]
  config = replaceOnce(config, alternative, '', 'commented `server api:3000 … resolve;`')
  return replaceOnce(config, /^(\s*)server api:3000( [^;]*)?;$/m, `$1${line}`, 'upstream `server api:3000`')
}

export interface RenderOptions extends NginxOptions {
  /** The API server's port and the plain HTTP server's. */
  ports: { api: number; http: number }
  /** host:port each; `resolve` stays only on a name. */
  upstreams: readonly string[]
  /** The commented `resolve` alternative taken (withResolve). */
  resolve?: boolean
  /** The temporary folder (and where the certificate is). */
  dir: string
  certificate: TestCertificate
}

/** `resolve` looks a name up again and again; an address has nothing to look up. */
const upstreamParams = (upstream: string, params: string) =>
  isIP(upstream.slice(0, upstream.lastIndexOf(':')).replace(/^\[|\]$/g, '')) ? params.replace(/ resolve\b/, '') : params

/** The shipped configuration with the test's ports, upstream servers, certificate, temporary folder and rate. */
export function renderConfig(o: RenderOptions): string {
  let config = readFileSync(SHIPPED, 'utf8')
  if (o.resolve) config = withResolve(config)
  config = replaceOnce(
    config,
    /^(\s*)listen 443 ssl;$/m,
    `$1listen 127.0.0.1:${o.ports.api}${o.tls ? ' ssl' : ''};`,
    '`listen 443 ssl;`',
  )
  config = replaceOnce(config, /^(\s*)listen 80;$/m, `$1listen 127.0.0.1:${o.ports.http};`, '`listen 80;`')
  config = replaceOnce(
    config,
    /^(\s*)server api:3000( [^;]*)?;$/m,
    (_, indent = '', params = '') =>
      o.upstreams.map((u) => `${indent}server ${u}${upstreamParams(u, params)};`).join('\n'),
    'upstream `server api:3000`',
  )
  config = replaceOnce(
    config,
    /^(\s*)ssl_certificate \S+;$/m,
    `$1ssl_certificate ${o.certificate.cert};`,
    '`ssl_certificate`',
  )
  config = replaceOnce(
    config,
    /^(\s*)ssl_certificate_key \S+;$/m,
    `$1ssl_certificate_key ${o.certificate.key};`,
    '`ssl_certificate_key`',
  )
  if (!o.shippedRate)
    config = replaceOnce(
      config,
      /(limit_req_zone [^;]* rate=)[0-9]+r\/s;/,
      `$1${LIFTED_RATE};`,
      'limit_req_zone with a rate',
    )
  if (o.probeStreamLocation)
    config = replaceOnce(
      config,
      /^(\s*)proxy_buffering off;$/m,
      '$1return 204;\n$1proxy_buffering off;',
      "the stream location's `proxy_buffering off;`",
    )
  const temp = ['client_body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']
    .map((t) => `    ${t}_temp_path ${join(o.dir, t)};`)
    .join('\n')
  return replaceOnce(config, /^http \{$/m, `http {\n${temp}`, '`http {`')
}

/** The command-line globals of a test's nginx: in the foreground, its pid file in `dir`. */
export function nginxGlobals(dir: string): string {
  // As root, the workers run as root too: the temporary folder is root's (outside a test, nginx's own user applies).
  return `daemon off; pid ${join(dir, 'nginx.pid')};${process.getuid?.() === 0 ? ' user root;' : ''}`
}

/** `nginx -t` of a configuration: its exit status and what it said. */
export function checkConfig(config: string, dir: string): { status: number | null; output: string } {
  const file = join(dir, 'nginx-t.conf')
  writeFileSync(file, config)
  const r = spawnSync(
    installedProgram('nginx'),
    ['-t', '-e', 'stderr', '-p', dir, '-c', file, '-g', nginxGlobals(dir)],
    { encoding: 'utf8' },
  )
  return { status: r.status, output: r.stdout + r.stderr }
}

/** nginx with deploy/nginx.conf in front of `upstreams` (host:port each). */
export async function startNginx(upstreams: readonly string[], options: NginxOptions = {}): Promise<Nginx> {
  const binary = installedProgram('nginx')
  const dir = mkdtempSync(join(tmpdir(), 'upa-nginx-'))
  const certificate = selfSignedCertificate(dir, 'proxy')
  const started = onFreePorts(2, async ([api, http]): Promise<Nginx> => {
    const ports = { api: api!, http: http! }
    const config = renderConfig({ ...options, ports, upstreams, dir, certificate })
    writeFileSync(join(dir, 'nginx.conf'), config)
    const pidFile = join(dir, 'nginx.pid')
    rmSync(pidFile, { force: true })
    const args = ['-e', 'stderr', '-p', dir, '-c', join(dir, 'nginx.conf'), '-g', nginxGlobals(dir)]
    const child = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe'] })
    let stderr = ''
    child.stderr.setEncoding('utf8').on('data', (text: string) => (stderr += text))
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
    let running = true
    void exited.then(() => (running = false))

    // nginx writes its pid file once it holds its listening sockets: then the ports are its own.
    for (const deadline = Date.now() + 30_000; !existsSync(pidFile);) {
      if (!running && /Address already in use/.test(stderr)) throw new PortTaken(stderr)
      if (!running || Date.now() > deadline) {
        child.kill('SIGKILL')
        throw new Error(`nginx did not start: ${stderr}`)
      }
      await sleep(20)
    }
    return {
      url: `${options.tls ? 'https' : 'http'}://127.0.0.1:${ports.api}`,
      port: ports.api,
      httpUrl: `http://127.0.0.1:${ports.http}`,
      ca: certificate.pem,
      config,
      errors: () => stderr,
      pids: () => {
        const workers = spawnSync('pgrep', ['-P', String(child.pid)], { encoding: 'utf8' }).stdout
        return [child.pid!, ...workers.split('\n').filter(Boolean).map(Number)]
      },
      async stop() {
        if (running) child.kill('SIGTERM')
        await exited
        rmSync(dir, { recursive: true, force: true })
      },
    }
  })
  return started.catch((err: unknown) => {
    rmSync(dir, { recursive: true, force: true })
    throw err
  })
}
