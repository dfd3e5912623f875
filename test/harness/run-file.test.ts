import assert from 'node:assert/strict'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { test } from 'node:test'
import { waitUntil } from '../helpers/wait.js'
import { runFile } from './run-file.js'

// A test file the harness runs ends with everything it started: at its time-out, when the run is
// interrupted, and when it finishes but leaves a process behind.

const dir = mkdtempSync(join(tmpdir(), 'upa-run-file-'))
test.after(() => rmSync(dir, { recursive: true, force: true }))

/** A test file that starts `sleep` (as nginx or PgBouncer would be), writes its pid, then passes or hangs. */
function fixture(name: string, then: 'pass' | 'hang'): { path: string; pidFile: string } {
  const path = join(dir, `${name}.test.mjs`)
  const pidFile = join(dir, `${name}.pid`)
  writeFileSync(
    path,
    `import { test } from 'node:test'
import { spawn } from 'node:child_process'
import { writeFileSync } from 'node:fs'
test('starts a server', async () => {
  const server = spawn('sleep', ['1000'], { stdio: 'ignore' })
  server.unref()
  writeFileSync(${JSON.stringify(pidFile)}, String(server.pid))
  ${then === 'hang' ? 'await new Promise(() => setInterval(() => {}, 1000))' : ''}
})
`,
  )
  return { path, pidFile }
}

/** Running and not a zombie (a zombie whose parent died waits for init to collect it). */
function running(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'))
  } catch {
    return false
  }
}

const serverPid = (pidFile: string) => Number(readFileSync(pidFile, 'utf8'))

test('a file that finishes reports its TAP, and what it left running is ended', async () => {
  const { path, pidFile } = fixture('passes', 'pass')
  const run = await runFile(path, { env: process.env, timeoutMs: 120_000, signal: new AbortController().signal })
  assert.equal(run.code, 0)
  assert.equal(run.timedOut, false)
  assert.match(run.stdout, /^# pass 1$/m)
  await waitUntil('the left-behind server to end', () => !running(serverPid(pidFile)))
})

test('an interrupted file is ended with the processes it started', async () => {
  const { path, pidFile } = fixture('interrupted', 'hang')
  const interruption = new AbortController()
  const run = runFile(path, { env: process.env, timeoutMs: 120_000, signal: interruption.signal })
  await waitUntil('the file to start its server', () => existsSync(pidFile), 60_000)
  interruption.abort()
  const { aborted, timedOut, signal } = await run
  assert.deepEqual({ aborted, timedOut, signal }, { aborted: true, timedOut: false, signal: 'SIGTERM' })
  await waitUntil('the server to end', () => !running(serverPid(pidFile)))
})

test('a file still running at its time-out is ended and says so', async () => {
  const { path } = fixture('hangs', 'hang')
  const run = await runFile(path, { env: process.env, timeoutMs: 300, signal: new AbortController().signal })
  assert.equal(run.timedOut, true)
  assert.doesNotMatch(run.stdout, /^# tests/m)
})
