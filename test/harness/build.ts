import { execFile } from 'node:child_process'
import { join } from 'node:path'
import { promisify } from 'node:util'

// The tests that start the service as a process run it as production does: compiled JavaScript under
// plain node (dist/main.js, test/fault-kit.ts's `mainScript`), which also starts on under half the CPU
// `--import tsx` takes, and the suite starts some hundred and fifty of them. `make test` has just
// type-checked the same sources, so this build only emits (--noCheck): about 3 s of CPU.

/** Compiles src/ into dist/ (tsconfig.json), as `make build` does but without its type check. */
export async function buildService(projectRoot: string): Promise<void> {
  const tsc = join(projectRoot, 'node_modules', 'typescript', 'bin', 'tsc')
  try {
    await promisify(execFile)(process.execPath, [tsc, '-p', 'tsconfig.json', '--noCheck'], { cwd: projectRoot })
  } catch (err) {
    const { stdout = '', stderr = '' } = err as { stdout?: string; stderr?: string }
    throw new Error(`building dist/ for the tests failed:\n${stdout}${stderr}`)
  }
}
