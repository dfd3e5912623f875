import type { ChildProcess } from 'node:child_process'
import { setTimeout as sleep } from 'node:timers/promises'

/** A server process a test started (PgBouncer, the SMTP server), and how to end it. */
export interface SupervisedChild {
  running(): boolean
  /** SIGTERM, then SIGKILL if it has not exited within 5 s; resolves once it has exited. */
  stop(): Promise<void>
}

/**
 * Watches `child`; if this process exits without stopping it (a test cancelled at its time-out, a crash), it is killed,
 * not left behind.
 */
export function superviseChild(child: ChildProcess): SupervisedChild {
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
  let running = true
  const orphaned = () => void child.kill('SIGKILL')
  process.once('exit', orphaned)
  void exited.then(() => {
    running = false
    process.off('exit', orphaned)
  })
  return {
    running: () => running,
    async stop() {
      if (running) child.kill('SIGTERM')
      // Unreferenced: once the child has exited, the pending kill must not keep the test process alive.
      await Promise.race([exited, sleep(5000, undefined, { ref: false }).then(() => child.kill('SIGKILL'))])
    },
  }
}
