import { spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { accepts, freePort } from './ports.js'
import { installedProgram } from './programs.js'

// A real nginx (Debian's package; `make test` installs it when missing) running
// the configuration we ship, deploy/nginx.conf, with three changes a test
// needs: it listens on a free loopback port, its upstream servers are the
// test's instances, and its temporary files go to a folder of its own. Each
// change must find exactly what it replaces, so a reshaped deploy/nginx.conf
// fails here instead of being tested in a form nobody ships.

const SHIPPED = new URL('../../deploy/nginx.conf', import.meta.url)

export interface Nginx {
  url: string
  port: number
  /** What nginx wrote to its error log (stderr). */
  errors(): string
  /** The configuration as run. */
  config: string
  /** The master process and its workers (for CPU figures). */
  pids(): number[]
  /** Fast shutdown (SIGTERM); resolves when the master process has exited. */
  stop(): Promise<void>
}

function replaceOnce(text: string, pattern: RegExp, replacement: string | ((match: string, ...groups: string[]) => string), what: string): string {
  const found = text.match(new RegExp(pattern.source, pattern.flags + 'g'))?.length ?? 0
  if (found !== 1) throw new Error(`deploy/nginx.conf: expected exactly one ${what}, found ${found}`)
  return typeof replacement === 'string' ? text.replace(pattern, replacement) : text.replace(pattern, replacement)
}

/** The shipped configuration with the test's listen port, upstream servers and temporary folder. */
export function renderConfig(port: number, upstreams: readonly string[], dir: string): string {
  let config = readFileSync(SHIPPED, 'utf8')
  config = replaceOnce(config, /^(\s*)listen 80;$/m, `$1listen 127.0.0.1:${port};`, '`listen 80;`')
  config = replaceOnce(config, /^(\s*)server api:3000( [^;]*)?;$/m, (_, indent = '', params = '') =>
    upstreams.map((u) => `${indent}server ${u}${params};`).join('\n'), 'upstream `server api:3000`')
  const temp = ['client_body', 'proxy', 'fastcgi', 'uwsgi', 'scgi'].map((t) => `    ${t}_temp_path ${join(dir, t)};`).join('\n')
  return replaceOnce(config, /^http \{$/m, `http {\n${temp}`, '`http {`')
}

/** nginx with deploy/nginx.conf in front of `upstreams` (host:port each). */
export async function startNginx(upstreams: readonly string[]): Promise<Nginx> {
  const binary = installedProgram('nginx')
  const dir = mkdtempSync(join(tmpdir(), 'upa-nginx-'))
  const port = await freePort()
  const config = renderConfig(port, upstreams, dir)
  writeFileSync(join(dir, 'nginx.conf'), config)
  // As root, the workers run as root too: the temporary folder is root's (outside a test, nginx's own user applies).
  const globals = `daemon off; pid ${join(dir, 'nginx.pid')};${process.getuid?.() === 0 ? ' user root;' : ''}`
  const child = spawn(binary, ['-e', 'stderr', '-p', dir, '-c', join(dir, 'nginx.conf'), '-g', globals], { stdio: ['ignore', 'ignore', 'pipe'] })
  let stderr = ''
  child.stderr.setEncoding('utf8').on('data', (text: string) => (stderr += text))
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  let running = true
  void exited.then(() => (running = false))

  for (const deadline = Date.now() + 10_000; !(await accepts(port));) {
    if (!running || Date.now() > deadline) {
      child.kill('SIGKILL')
      throw new Error(`nginx did not start: ${stderr}`)
    }
    await sleep(20)
  }
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    config,
    errors: () => stderr,
    pids: () => [child.pid!, ...spawnSync('pgrep', ['-P', String(child.pid)], { encoding: 'utf8' }).stdout.split('\n').filter(Boolean).map(Number)],
    async stop() {
      if (running) child.kill('SIGTERM')
      await exited
      rmSync(dir, { recursive: true, force: true })
    },
  }
}
