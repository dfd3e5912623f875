import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { cpSync, mkdtempSync, rmSync, statSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import postgres from 'postgres'
import { OUTSIDE_ROOT } from '../src/dev/local-cluster.js'

// The two commands set up their own PostgreSQL where many people check out
// as root: in root's home (mode 0700) or a `mktemp -d` folder, which the
// `postgres` account the server runs as cannot enter. A copy of the
// project's source in such a folder starts its cluster (in a folder of its
// own under /var/tmp, keyed by the checkout), answers on its socket, and
// `remove` deletes it.

const root = fileURLToPath(new URL('../', import.meta.url))
const asRoot = process.getuid?.() === 0

function cluster(checkout: string, command: string): { status: number | null; out: string } {
  const r = spawnSync(process.execPath, ['--import', 'tsx', join(checkout, 'src/dev/local-cluster.ts'), command], {
    cwd: root,
    encoding: 'utf8',
    timeout: 120_000,
  })
  return { status: r.status, out: `${r.stdout}${r.stderr}` }
}

test(
  'as root, a checkout in a folder the postgres account cannot enter gets a cluster it can reach, and remove deletes ' +
    'it',
  { skip: !asRoot && 'runs as root only (the server then runs as an unprivileged account)' },
  async () => {
    // mkdtemp makes the folder 0700, as `mktemp -d` does.
    const checkout = mkdtempSync(join(tmpdir(), 'upa-closed-'))
    after(() => rmSync(checkout, { recursive: true, force: true }))
    assert.equal(statSync(checkout).mode & 0o777, 0o700)
    cpSync(join(root, 'src'), join(checkout, 'src'), { recursive: true })
    cpSync(join(root, 'package.json'), join(checkout, 'package.json'))
    symlinkSync(join(root, 'node_modules'), join(checkout, 'node_modules'))

    const started = cluster(checkout, 'start')
    after(() => cluster(checkout, 'remove'))
    assert.equal(started.status, 0, started.out)
    const url = /postgres:\/\/\S+/.exec(started.out)?.[0]
    assert.ok(url, started.out)
    const socket = decodeURIComponent(new URL(url).searchParams.get('host')!)
    assert.ok(
      socket.startsWith(`${OUTSIDE_ROOT}/users-products-api-`) || socket.startsWith(tmpdir()),
      `socket at ${socket}`,
    )

    const sql = postgres({ host: socket, database: 'postgres', user: 'postgres', max: 1 })
    try {
      const [row] = await sql<[{ one: number }]>`SELECT 1 AS one`
      assert.equal(row.one, 1)
    } finally {
      await sql.end({ timeout: 5 })
    }

    const removed = cluster(checkout, 'remove')
    assert.equal(removed.status, 0, removed.out)
    assert.match(removed.out, /stopped\. Removed \/var\/tmp\/users-products-api-[0-9a-f]{12}\./)
    assert.equal(spawnSync('test', ['-e', socket]).status, 1, 'the cluster folder is gone')
  },
)
