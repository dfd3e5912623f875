import { spawn } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { superviseChild } from './child-process.js'
import { onFreePorts, PortTaken } from './ports.js'
import { installedProgram } from './programs.js'

// A real Prometheus (Debian's package, 2.42; `make test` installs it when
// missing) on a free loopback port, with its storage and its files in a
// temporary folder of its own, which its stop removes. Stopped in `after` of
// the test file that starts it.

export interface Prometheus {
  url: string
  /** Its temporary folder (configuration, files, storage). */
  dir: string
  /** GET of its HTTP API (`/api/v1/...`): the `data` of a `success` answer; throws with the error otherwise. */
  api<T>(path: string, query?: Record<string, string>): Promise<T>
  /** What it logged (stderr). */
  log(): string
  /** SIGTERM; resolves once it has exited and its folder is removed. */
  stop(): Promise<void>
}

export interface PrometheusOptions {
  /** Its prometheus.yml, given the folder its files are in. */
  config: (dir: string) => string
  /** Files written into its folder first, readable by their owner only (a key file, say). */
  files?: Record<string, string>
}

export async function startPrometheus(options: PrometheusOptions): Promise<Prometheus> {
  const binary = installedProgram('prometheus')
  const dir = mkdtempSync(join(tmpdir(), 'upa-prometheus-'))
  const removeDir = () => {
    rmSync(dir, { recursive: true, force: true })
    if (existsSync(dir)) throw new Error(`${dir} is still there`)
  }
  for (const [name, content] of Object.entries(options.files ?? {}))
    writeFileSync(join(dir, name), content, { mode: 0o600 })
  writeFileSync(join(dir, 'prometheus.yml'), options.config(dir))
  const storage = join(dir, 'data')
  const started = onFreePorts(1, async ([port]): Promise<Prometheus> => {
    const url = `http://127.0.0.1:${port}`
    const args = [
      `--config.file=${join(dir, 'prometheus.yml')}`,
      `--storage.tsdb.path=${storage}`,
      `--web.listen-address=127.0.0.1:${port}`,
      '--log.level=warn',
    ]
    const child = spawn(binary, args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] })
    let stderr = ''
    child.stderr.setEncoding('utf8').on('data', (text: string) => (stderr += text))
    const supervised = superviseChild(child)
    const api = async <T>(path: string, query: Record<string, string> = {}): Promise<T> => {
      const res = await fetch(`${url}${path}?${new URLSearchParams(query)}`, { signal: AbortSignal.timeout(5000) })
      const body = (await res.json()) as { status: string; data: T; error?: string }
      if (body.status !== 'success') throw new Error(`Prometheus ${path} ${JSON.stringify(query)}: ${body.error}`)
      return body.data
    }
    const fail = async (err: Error) => {
      await supervised.stop()
      rmSync(storage, { recursive: true, force: true })
      throw err
    }
    // Ready, and ours: the one told this storage folder (another program may have taken the port first).
    for (const deadline = Date.now() + 20_000; ; await sleep(50)) {
      if (!supervised.running() && /address already in use/.test(stderr)) return fail(new PortTaken(stderr))
      if (!supervised.running() || Date.now() > deadline)
        return fail(new Error(`Prometheus did not start on port ${port}:\n${stderr}`))
      const ready = await fetch(`${url}/-/ready`).then(
        (res) => res.ok,
        () => false,
      )
      if (!ready) continue
      const flags = await api<Record<string, string>>('/api/v1/status/flags').catch(
        () => ({}) as Record<string, string>,
      )
      if (flags['storage.tsdb.path'] !== storage) return fail(new PortTaken(`another program answers on port ${port}`))
      break
    }
    let stopping: Promise<void> | undefined
    const stop = () => (stopping ??= supervised.stop().then(removeDir))
    return { url, dir, api, log: () => stderr, stop }
  })
  const prometheus = await started.catch((err: unknown) => {
    removeDir()
    throw err
  })
  after(() => prometheus.stop())
  return prometheus
}
