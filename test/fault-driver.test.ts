import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import {
  cpSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { promisify } from 'node:util'
import type { Sql } from 'postgres'
import { connect } from '../src/core/db/connect.js'
import {
  edits,
  MARKER,
  PATCH_DIGEST,
  PATCHED_SHA256,
  patchProblem,
  STAMP_PREFIX,
} from '../src/driver-patch/postgres.mjs'
import { projectRoot, settledHeap, waitFor } from './fault-kit.js'
import { createTestDatabase } from './helpers/server.js'

// The postgres.js traps (porsager/postgres#1154/#1066/#1208, #1133, #1186,
// #1097), each caused for real by pg_terminate_backend on a connection of this
// test's own, and the install-time patch that closes them
// (src/driver-patch/postgres.mjs). Without the patch, the first test crashes this
// process, the second commits a statement outside its transaction, the third
// leaves a promise pending forever and the fourth hangs in sql.end(). If an
// upgrade of postgres.js changes the patched code, `npm ci` fails; if it
// changes it in a way the patch still fits but the behaviour returns, these
// tests fail.

const run = promisify(execFile)
const patchEdits = edits
const patchedFiles = [...new Set(edits.map(([file]) => file))]

let url: string
let killer: Sql

before(async () => {
  url = await createTestDatabase()
  killer = connect(url, { max: 1, statementTimeoutMs: 10_000 })
  await killer`CREATE TABLE fault_notes (note text NOT NULL)`
})
after(async () => {
  await killer.end({ timeout: 2 })
})

/** Waits until backend `pid` is running a statement matching `like`, then terminates it. */
async function terminateWhileRunning(pid: number, like: string): Promise<void> {
  await waitFor(
    `backend ${pid} running ${like}`,
    async () => {
      const [row] =
        await killer`SELECT 1 FROM pg_stat_activity WHERE pid = ${pid} AND state = 'active' AND query LIKE ${like}`
      return row !== undefined
    },
    5000,
    10,
  )
  const [{ terminated }] = await killer<[{ terminated: boolean }]>`SELECT pg_terminate_backend(${pid}) AS terminated`
  assert.equal(terminated, true)
}

const isConnectionLoss = (err: unknown) =>
  ['CONNECTION_CLOSED', '57P01'].includes((err as { code?: string })?.code ?? '')

/** Every uncaught exception while `fn` runs (the unpatched driver throws one from a timer). */
async function collectUncaught(fn: () => Promise<void>): Promise<unknown[]> {
  const seen: unknown[] = []
  const listener = (err: unknown) => void seen.push(err)
  process.on('uncaughtException', listener)
  try {
    await fn()
    await sleep(50) // the crash came from a setImmediate after the rejection
  } finally {
    process.off('uncaughtException', listener)
  }
  return seen
}

describe('postgres.js when a connection dies in a transaction', () => {
  test(
    'a backend killed while a transaction runs a statement: the transaction fails with a connection error, ' +
      'nothing throws outside it, the pool serves the next query (#1154, #1208)',
    async () => {
      const sql = connect(url, { max: 2, statementTimeoutMs: 30_000 })
      try {
        const uncaught = await collectUncaught(async () => {
          for (let round = 0; round < 5; round++) {
            let pid: number | undefined
            const tx = sql.begin(async (t) => {
              ;[{ pid }] = await t<[{ pid: number }]>`SELECT pg_backend_pid() AS pid`
              await t`INSERT INTO fault_notes VALUES ('killed transaction')`
              await t`SELECT pg_sleep(30)`
            })
            const outcome = tx.then(
              () => 'committed',
              (err: unknown) => err,
            )
            await waitFor('the transaction to start', () => pid !== undefined, 5000, 5)
            await terminateWhileRunning(pid!, 'SELECT pg_sleep%')
            const err = await outcome
            assert.ok(isConnectionLoss(err), `round ${round}: ${String(err)}`)
            const [row] = await sql<[{ one: number }]>`SELECT 1 AS one`
            assert.equal(row.one, 1)
          }
        })
        assert.deepEqual(uncaught.map(String), [])
        assert.equal((await killer`SELECT 1 FROM fault_notes WHERE note = 'killed transaction'`).length, 0)
      } finally {
        await sql.end({ timeout: 2 })
      }
    },
  )

  test(
    'a statement a transaction issues after its connection died runs nowhere: nothing of the transaction commits, ' +
      'though the connection was reopened meanwhile (#1133)',
    async () => {
      // One connection: the query queued behind the transaction makes the pool
      // reopen that very connection object once its backend is gone.
      const sql = connect(url, { max: 1, statementTimeoutMs: 30_000 })
      try {
        let pid: number | undefined
        let resume!: () => void
        const paused = new Promise<void>((resolve) => (resume = resolve))
        const tx = sql.begin(async (t) => {
          ;[{ pid }] = await t<[{ pid: number }]>`SELECT pg_backend_pid() AS pid`
          await t`INSERT INTO fault_notes VALUES ('before the kill')`
          // The callback waits on something that is not the database (a password hash, another service).
          await paused
          await t`INSERT INTO fault_notes VALUES ('after the kill')`
        })
        const outcome = tx.then(
          () => 'committed',
          (err: unknown) => err,
        )
        await waitFor('the transaction to start', () => pid !== undefined, 5000, 5)
        const queued = sql<[{ backend: number }]>`SELECT pg_backend_pid() AS backend`.then((rows) => rows[0]!.backend)
        await waitFor(
          `backend ${pid} idle in its transaction`,
          async () =>
            (await killer`SELECT 1 FROM pg_stat_activity WHERE pid = ${pid!} AND state = 'idle in transaction'`)
              .length > 0,
          5000,
          10,
        )
        await killer`SELECT pg_terminate_backend(${pid!})`
        const otherBackend = await queued
        assert.notEqual(otherBackend, pid, 'the queued query ran on a new backend')
        resume()
        const err = await outcome
        assert.ok(isConnectionLoss(err), String(err))
        await sleep(100)
        const committed = await killer<
          Array<{ note: string }>
        >`SELECT note FROM fault_notes WHERE note IN ('before the kill', 'after the kill')`
        assert.deepEqual(
          committed.map((r) => r.note),
          [],
        )
        // The pool goes on working.
        assert.equal((await sql<[{ one: number }]>`SELECT 1 AS one`)[0].one, 1)
      } finally {
        await sql.end({ timeout: 2 })
      }
    },
  )

  test(
    'a statement waiting in the queue of a transaction whose connection died is rejected, not left pending ' +
      '(#1186)',
    async () => {
      const sql = connect(url, { max: 2, statementTimeoutMs: 30_000 })
      try {
        let pid: number | undefined
        let queued: Promise<unknown> | undefined
        const tx = sql.begin(async (t) => {
          ;[{ pid }] = await t<[{ pid: number }]>`SELECT pg_backend_pid() AS pid`
          // A statement with a parameter is described first; the next one waits in the transaction's own queue.
          const running = t`SELECT pg_sleep(${30})`.execute()
          const next = t`SELECT 2 AS two`
          queued = next.then(
            () => 'resolved',
            (err: { code?: string }) => err.code,
          )
          await Promise.all([running, next])
        })
        const outcome = tx.then(
          () => 'committed',
          (err: unknown) => err,
        )
        await waitFor('the transaction to start', () => pid !== undefined && queued !== undefined, 5000, 5)
        await terminateWhileRunning(pid!, 'SELECT pg_sleep%')
        assert.ok(isConnectionLoss(await outcome))
        const settled = await Promise.race([queued!, sleep(3000).then(() => 'still pending after 3 s')])
        assert.ok(['CONNECTION_CLOSED', '57P01'].includes(settled as string), String(settled))
      } finally {
        await sql.end({ timeout: 2 })
      }
    },
  )

  test('sql.end() without a time-out returns after a connection died under a running query (#1097)', async () => {
    const sql = connect(url, { max: 1, statementTimeoutMs: 30_000 })
    const [{ pid }] = await sql<[{ pid: number }]>`SELECT pg_backend_pid() AS pid`
    const slow = sql`SELECT pg_sleep(30)`.then(
      () => 'finished',
      (err: unknown) => err,
    )
    await terminateWhileRunning(pid, 'SELECT pg_sleep%')
    assert.ok(isConnectionLoss(await slow))
    // Unpatched it never returns: 3 s tells a hang from a return however busy the machine (how long it
    // takes is a figure of `make bench-faults`, bench/faults/driver.ts).
    const ended = await Promise.race([sql.end().then(() => 'ended'), sleep(3000).then(() => 'hung')])
    assert.equal(ended, 'ended')
  })
})

describe("postgres.js's pool queue (src/queue.js) under sustained load", () => {
  interface Queue<T> {
    readonly length: number
    push(x: T): T
    shift(): T
    remove(x: T): T | null
  }
  const load = async (): Promise<<T>() => Queue<T>> =>
    (await import(join(projectRoot, 'node_modules', 'postgres', 'src', 'queue.js'))).default

  test(
    'a queue that never empties keeps first-in first-out order and removes what it is asked to, as an array ' + 'would',
    async () => {
      // The patch compacts the consumed front of the array; this drives it
      // through thousands of compactions against a plain array as the model.
      const queue = (await load())<number>()
      const model: number[] = []
      let next = 0
      let seed = 7
      const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed / 2 ** 31)
      for (let step = 0; step < 200_000; step++) {
        const r = random()
        if (r < 0.5 || model.length < 3) {
          queue.push(next)
          model.push(next++)
        } else if (r < 0.9) {
          assert.equal(queue.shift(), model.shift())
        } else {
          const victim = model[Math.floor(random() * model.length)]!
          assert.equal(queue.remove(victim), victim)
          model.splice(model.indexOf(victim), 1)
        }
        assert.equal(queue.length, model.length)
      }
      assert.equal(queue.remove(-1), null)
      while (model.length) assert.equal(queue.shift(), model.shift())
    },
  )

  test('the cost of a remove does not grow with the statements the queue has seen', async () => {
    // Unpatched, each shift() leaves a hole that remove() scans: after 200,000
    // pipelined statements a remove searched 200,000 holes. Counted, not timed:
    // the work of remove() is the indexOf it runs, so it is measured by how
    // many entries the array behind the queue holds (visible to indexOf).
    const queue = (await load())<object>()
    const live = Array.from({ length: 10 }, () => ({}))
    for (const x of live) queue.push(x)
    let scanned = 0
    const indexOf = Array.prototype.indexOf
    Array.prototype.indexOf = function (this: unknown[], ...args: [unknown, number?]) {
      scanned += this.length - (args[1] ?? 0)
      return indexOf.apply(this, args)
    }
    try {
      for (let i = 0; i < 200_000; i++) queue.push(queue.shift())
      scanned = 0
      for (let i = 0; i < 100; i++) queue.push(queue.remove(live[i % 10]!)!)
    } finally {
      Array.prototype.indexOf = indexOf
    }
    assert.ok(scanned / 100 < 200, `a remove scanned ${scanned / 100} entries on average`)
  })
})

test(
  'failed sql.unsafe statements leave nothing behind in postgres.js (the compiled list SQL runs through ' + 'unsafe)',
  async () => {
    const sql = connect(url, { max: 2, statementTimeoutMs: 10_000 })
    try {
      const fail = () =>
        sql
          .unsafe('SELECT 1 / $1::int AS x', [0], { prepare: true })
          .catch((err: { code?: string }) => assert.equal(err.code, '22012'))
      for (let i = 0; i < 500; i++) await fail()
      const before = await settledHeap()
      for (let i = 0; i < 10_000; i += 50) await Promise.all(Array.from({ length: 50 }, fail))
      const grown = (await settledHeap()) - before
      // Unpatched: about 100 bytes each, 1 MB in all (patched, the heap grows by about 0.3 MB, as much after 20,000).
      assert.ok(grown < 500_000, `the heap grew by ${(grown / 1e6).toFixed(2)} MB over 10,000 failed statements`)
    } finally {
      await sql.end({ timeout: 2 })
    }
  },
)

test(
  'transactions run on a pool that pipelines nothing (max_pipeline 0, as behind PgBouncer), also many at ' + 'once',
  async () => {
    // Unpatched: every sql.begin fails with UNSAFE_TRANSACTION, its BEGIN never reserving the connection.
    const sql = connect(url, { max: 2, statementTimeoutMs: 10_000, pooled: true })
    try {
      const sums = await Promise.all(
        Array.from({ length: 20 }, (_, i) =>
          sql.begin(async (tx) => {
            const [{ n }] = await tx<[{ n: number }]>`SELECT ${i}::int AS n`
            const [{ m }] = await tx<[{ m: number }]>`SELECT ${n}::int + 1 AS m`
            return m
          }),
        ),
      )
      assert.deepEqual(
        sums,
        Array.from({ length: 20 }, (_, i) => i + 1),
      )
    } finally {
      await sql.end({ timeout: 2 })
    }
  },
)

describe('the install-time patch (src/driver-patch/postgres.mjs)', () => {
  const installed = join(projectRoot, 'node_modules', 'postgres')
  const folders = ['src', join('cjs', 'src')]

  test('the installed postgres.js carries every edit, in its ESM and CommonJS copies', () => {
    assert.ok(patchEdits.length >= 7)
    assert.deepEqual(
      Object.keys(PATCHED_SHA256).sort(),
      folders.flatMap((f) => patchedFiles.map((file) => `${f}/${file}`)).sort(),
      'start-up checks every file the patch edits, in both copies',
    )
    for (const folder of folders) {
      for (const [file, , replace] of patchEdits) {
        assert.ok(replace.includes(MARKER), 'each replacement is marked')
        assert.ok(
          readFileSync(join(installed, folder, file), 'utf8').includes(replace),
          `${folder}/${file} lacks: ${replace.slice(0, 200)}`,
        )
      }
    }
  })

  /** A copy of the package as npm installs it: the patch undone. */
  function pristineCopy(): string {
    const dir = mkdtempSync(join(tmpdir(), 'upa-pg-'))
    cpSync(installed, dir, { recursive: true })
    for (const folder of folders) {
      for (const [file, find, replace] of patchEdits) {
        const path = join(dir, folder, file)
        writeFileSync(
          path,
          readFileSync(path, 'utf8')
            .replace(replace, find)
            .replace(/\n\/\/ users-products-api patch: edit list [0-9a-f]{16}\n$/, '\n'),
        )
      }
      for (const file of patchedFiles) assert.ok(!readFileSync(join(dir, folder, file), 'utf8').includes(MARKER))
    }
    return dir
  }
  const patchScript = join(projectRoot, 'src', 'driver-patch', 'postgres.mjs')
  const snapshot = (dir: string) =>
    folders.flatMap((f) => patchedFiles.map((file) => readFileSync(join(dir, f, file), 'utf8')))

  test(
    'applied to the package as published, it gives exactly the installed files; applied again, it changes ' + 'nothing',
    async () => {
      const dir = pristineCopy()
      try {
        const first = await run(process.execPath, [patchScript, dir])
        assert.match(first.stdout, new RegExp(`${patchEdits.length * 2} changes applied`))
        assert.deepEqual(snapshot(dir), snapshot(installed))
        const second = await run(process.execPath, [patchScript, dir])
        assert.match(second.stdout, /already patched/)
        assert.deepEqual(snapshot(dir), snapshot(installed))
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    },
  )

  test(
    'start-up accepts only the copy this patch makes: an unpatched one or one patched by another edit list is ' +
      'refused, saying what it is',
    () => {
      assert.equal(patchProblem(installed), undefined, 'the real install passes')
      const dir = pristineCopy()
      try {
        assert.match(patchProblem(dir) ?? '', /is not patched \(src\/connection\.js\)/)
        cpSync(installed, dir, { recursive: true })
        const path = join(dir, 'src', 'query.js')
        writeFileSync(
          path,
          readFileSync(path, 'utf8').replace(/edit list [0-9a-f]{16}\n$/, 'edit list 0123456789abcdef\n'),
        )
        assert.match(patchProblem(dir) ?? '', /another version of src\/driver-patch\/postgres\.mjs \(src\/query\.js\)/)
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    },
  )

  test(
    'start-up compares contents, not stamps: an unpatched file with the stamp appended, an unpatched CommonJS ' +
      'copy, or a patched file edited since are refused',
    () => {
      const dir = pristineCopy()
      try {
        // Each file as npm installs it, with the current stamp appended.
        for (const folder of folders) {
          for (const file of patchedFiles) {
            const path = join(dir, folder, file)
            writeFileSync(path, `${readFileSync(path, 'utf8')}${STAMP_PREFIX}${PATCH_DIGEST}\n`)
          }
        }
        assert.match(
          patchProblem(dir) ?? '',
          /is not the copy this patch makes \(src\/connection\.js: SHA-256 [0-9a-f]{64}, expected [0-9a-f]{64}\)/,
        )

        // The ESM copy patched, the CommonJS one (what `require('postgres')` loads) left as published.
        cpSync(join(installed, 'src'), join(dir, 'src'), { recursive: true })
        assert.match(patchProblem(dir) ?? '', /is not the copy this patch makes \(cjs\/src\/connection\.js: /)

        // Everything patched, then one line of one file changed.
        cpSync(installed, dir, { recursive: true })
        assert.equal(patchProblem(dir), undefined)
        const path = join(dir, 'cjs', 'src', 'queue.js')
        writeFileSync(path, readFileSync(path, 'utf8').replace(MARKER, 'an edit of our own'))
        assert.match(patchProblem(dir) ?? '', /is not the copy this patch makes \(cjs\/src\/queue\.js: /)
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    },
  )

  test('the service refuses to start on such a copy, naming the file and what to run', async () => {
    const dir = pristineCopy()
    try {
      for (const file of patchedFiles) {
        const path = join(dir, 'cjs', 'src', file)
        writeFileSync(path, `${readFileSync(path, 'utf8')}${STAMP_PREFIX}${PATCH_DIGEST}\n`)
      }
      cpSync(join(installed, 'src'), join(dir, 'src'), { recursive: true })
      // A project whose node_modules/postgres is that copy (the other packages linked): what `npm ci --ignore-scripts`
      // and a hand-made stamp leave. Its own dist/ (and src/, for the patch script), since Node resolves packages from
      // a module's real path.
      const project = mkdtempSync(join(tmpdir(), 'upa-project-'))
      try {
        for (const entry of ['dist', 'src', 'sql', 'package.json'])
          cpSync(join(projectRoot, entry), join(project, entry), { recursive: true })
        mkdirSync(join(project, 'node_modules'))
        for (const entry of readdirSync(join(projectRoot, 'node_modules'))) {
          if (entry !== 'postgres')
            symlinkSync(join(projectRoot, 'node_modules', entry), join(project, 'node_modules', entry))
        }
        cpSync(dir, join(project, 'node_modules', 'postgres'), { recursive: true })
        const failed = await run(process.execPath, [join(project, 'dist', 'main.js'), 'migrate'], {
          cwd: project,
          env: { ...process.env, DATABASE_URL: url },
        }).then(
          () => undefined,
          (err: { code: number; stderr: string }) => err,
        )
        assert.ok(failed, 'start-up must fail')
        assert.equal(failed.code, 1)
        // The script to run, not `npm ci`, which would bring the development
        // dependencies back where they were left out.
        assert.match(
          failed.stderr,
          /Cannot start: postgres\.js at .* is not the copy this patch makes \(cjs\/src\/connection\.js: .*; run `node src\/driver-patch\/postgres\.mjs` to patch it/,
        )
      } finally {
        rmSync(project, { recursive: true, force: true })
      }
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })

  test(
    'it writes each file whole: to a temporary file renamed over the original (a new inode), leaving no temporary ' +
      'file',
    async () => {
      const dir = pristineCopy()
      try {
        const path = join(dir, 'src', 'connection.js')
        const before = statSync(path).ino
        await run(process.execPath, [patchScript, dir])
        assert.notEqual(statSync(path).ino, before, 'the file was replaced, not written in place')
        assert.deepEqual(
          readdirSync(join(dir, 'src')).filter((f) => f.endsWith('.tmp')),
          [],
        )
        assert.ok(readFileSync(path, 'utf8').endsWith(`${STAMP_PREFIX}${PATCH_DIGEST}\n`))
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    },
  )

  test(
    'a package that is not the one the patch was made for fails the install even where every edit applies: each ' +
      "file's SHA-256 is checked before anything is written",
    async () => {
      const dir = pristineCopy()
      try {
        const path = join(dir, 'cjs', 'src', 'query.js')
        writeFileSync(path, `${readFileSync(path, 'utf8')}module.exports.extra = 1\n`)
        const before = snapshot(dir)
        const failed = await run(process.execPath, [patchScript, dir]).then(
          () => undefined,
          (err: { code: number; stderr: string }) => err,
        )
        assert.ok(failed, 'the patch script must fail')
        assert.equal(failed.code, 1)
        assert.match(
          failed.stderr,
          /is not the copy this patch makes \(cjs\/src\/query\.js: SHA-256 [0-9a-f]{64}, expected [0-9a-f]{64}\)/,
        )
        assert.match(failed.stderr, /set PATCHED_SHA256 in src\/driver-patch\/postgres\.mjs to/)
        assert.doesNotMatch(failed.stderr, /\((src|cjs\/src)\/connection\.js/, 'only the file that differs is named')
        assert.deepEqual(snapshot(dir), before, 'no file was written')
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    },
  )

  test(
    'when the code it patches has changed (an upgrade), it fails loudly, names what to check, and changes ' + 'nothing',
    async () => {
      const dir = pristineCopy()
      try {
        const path = join(dir, 'src', 'connection.js')
        writeFileSync(
          path,
          readFileSync(path, 'utf8').replace(
            'const x = socket.write(chunk, fn)',
            'const x = socket && socket.write(chunk, fn)',
          ),
        )
        const before = snapshot(dir)
        const failed = await run(process.execPath, [patchScript, dir]).then(
          () => undefined,
          (err: { code: number; stderr: string }) => err,
        )
        assert.ok(failed, 'the patch script must fail')
        assert.equal(failed.code, 1)
        assert.match(failed.stderr, /has changed in src\/connection\.js/)
        assert.match(failed.stderr, /#1154/)
        assert.deepEqual(snapshot(dir), before, 'no file was written')
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    },
  )
})
