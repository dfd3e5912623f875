import { relative } from 'node:path'
import { fileURLToPath } from 'node:url'

/** postgres.js is not the patched copy this service needs (`assertDriverPatched`). */
export class DriverPatchError extends Error {}

/**
 * The patch postgres.js must carry, as the composition root knows it (src/start.ts
 * passes src/driver-patch/postgres.mjs's): core imports nothing outside itself, so
 * the patch's own check and its script are handed in.
 */
export interface DriverPatch {
  /** Why the postgres package in `packageDir` is not the copy the patch makes, or undefined when it is. */
  problem(packageDir: string): string | undefined
  /** The script that applies the patch (an absolute path), named in the error as the command to run. */
  script: string
}

/**
 * Refuses to run on a postgres.js that is not the copy the patch makes
 * (applied by npm's postinstall): the patch is what keeps a database restart
 * from crashing the process. The package checked is the one this module
 * resolves, the one src/core/db/connect.ts loads. Every patched file, ESM and
 * CommonJS, must have the SHA-256 the patch expects, so an install with
 * --ignore-scripts, an upgrade the patch no longer fits, a copy patched by
 * an older edit list or a file edited since stops start-up here instead of
 * failing at the first database outage.
 */
export function assertDriverPatched(patch: DriverPatch): void {
  const problem = patch.problem(fileURLToPath(new URL('..', import.meta.resolve('postgres'))))
  if (problem) {
    // The script's path relative to where the process runs: in a checkout and in the image alike.
    const script = relative(process.cwd(), patch.script)
    throw new DriverPatchError(
      `${problem}; run \`node ${script}\` to patch it (npm runs it after installing, unless with --ignore-scripts)`,
    )
  }
}
