import { readdirSync } from 'node:fs'
import { join } from 'node:path'

/** The files under `dir`, at any depth, whose paths (relative to `dir`) match `pattern`, as full paths, sorted. */
export const sourceFiles = (dir: string, pattern: RegExp): string[] =>
  (readdirSync(dir, { recursive: true }) as string[])
    .filter((f) => pattern.test(f))
    .sort()
    .map((f) => join(dir, f))
