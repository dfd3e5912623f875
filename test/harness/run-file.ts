import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { setTimeout as sleep } from 'node:timers/promises'

// One test file in a process of its own, run directly (`node --import tsx <file>` runs its tests; `--test`
// would start a second process per file to do the same). The file leads a process group of its own, so
// ending it also ends what it started and left running (nginx, PgBouncer, the service's processes).

/** How long a file's process group has to exit after SIGTERM before it is killed. */
const TERMINATE_GRACE_MS = 5_000
/** How long output written by the file's leftovers is waited for once the file has exited. */
const OUTPUT_GRACE_MS = 2_000

export interface FileRun {
  seconds: number
  /** Exit code, or null when a signal ended it. */
  code: number | null
  signal: NodeJS.Signals | null
  timedOut: boolean
  /** Ended because `signal` aborted (the run was interrupted). */
  aborted: boolean
  stdout: string
  stderr: string
}

export interface RunOptions {
  env: NodeJS.ProcessEnv
  timeoutMs: number
  /** Ends the file when aborted. */
  signal: AbortSignal
}

export async function runFile(path: string, options: RunOptions): Promise<FileRun> {
  const started = performance.now()
  const child = spawn(process.execPath, ['--import', 'tsx', '--test-reporter=tap', path], {
    env: options.env,
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  })
  let stdout = ''
  let stderr = ''
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk))
  child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk))
  const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>
  const closed = once(child, 'close')

  let timedOut = false
  let aborted = false
  let ending: Promise<void> | undefined
  const end = () => void (ending ??= terminateGroup(child.pid!))
  const timer = setTimeout(() => {
    timedOut = true
    end()
  }, options.timeoutMs)
  const onAbort = () => {
    aborted = true
    end()
  }
  if (options.signal.aborted) onAbort()
  else options.signal.addEventListener('abort', onAbort, { once: true })

  const [code, signal] = await exited
  const seconds = (performance.now() - started) / 1000
  clearTimeout(timer)
  options.signal.removeEventListener('abort', onAbort)
  // Whatever the file left running in its group ends with it.
  await (ending ?? signalGroup(child.pid!, 'SIGKILL'))
  const drained = await Promise.race([closed.then(() => true), sleep(OUTPUT_GRACE_MS, false, { ref: false })])
  if (!drained) {
    child.stdout.destroy()
    child.stderr.destroy()
  }
  return { seconds, code, signal, timedOut, aborted, stdout, stderr }
}

/** SIGTERM to the whole group (its servers shut down cleanly), SIGKILL to what is left after the grace. */
async function terminateGroup(pid: number): Promise<void> {
  if (!signalGroup(pid, 'SIGTERM')) return
  const deadline = Date.now() + TERMINATE_GRACE_MS
  while (Date.now() < deadline && groupRunning(pid)) await sleep(50)
  signalGroup(pid, 'SIGKILL')
}

/**
 * Whether a process of the group led by `pid` still runs. Its ended members stay zombies until init
 * collects them (over a second in some containers), and the group exists as long as they do: on Linux
 * /proc tells the two apart; elsewhere the group's existence has to do.
 */
function groupRunning(pid: number): boolean {
  if (!existsSync('/proc/self/stat')) return signalGroup(pid, 0)
  return readdirSync('/proc').some((entry) => {
    if (!/^\d+$/.test(entry)) return false
    try {
      // After the command's closing parenthesis: state, parent, group.
      const [state, , group] = readFileSync(`/proc/${entry}/stat`, 'utf8').split(') ').pop()!.split(' ')
      return Number(group) === pid && state !== 'Z'
    } catch {
      return false
    }
  })
}

/** Whether any process of the group led by `pid` received `signal` (0: whether one is left). */
function signalGroup(pid: number, signal: NodeJS.Signals | 0): boolean {
  try {
    process.kill(-pid, signal)
    return true
  } catch {
    return false
  }
}
