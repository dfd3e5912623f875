// Types of postgres.mjs (plain JavaScript: it runs at install time, without tsx).
export declare const MARKER: string
/** The script's absolute path: start-up names it as the command to run on an unpatched copy. */
export declare const PATCH_SCRIPT: string
/** The digest of the edits (not of the patch file), stamped at the end of every patched file after STAMP_PREFIX. */
export declare const PATCH_DIGEST: string
export declare const STAMP_PREFIX: string
/** [file inside the package's source folder, text to find, its replacement] */
export declare const edits: Array<[file: string, find: string, replace: string]>
/** SHA-256 of each patched file ('src/query.js', 'cjs/src/query.js', ...), its stamp line left out. */
export declare const PATCHED_SHA256: Record<string, string>
export declare class PatchError extends Error {}
/**
 * Why the package at `packageDir` is not postgres.js as this patch leaves it (ESM and CommonJS),
 * or undefined when it is.
 */
export declare function patchProblem(packageDir: string): string | undefined
export declare function patchPostgres(packageDir: string): { version: string; report: string[] }
