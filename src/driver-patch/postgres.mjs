// A small patch to postgres.js (3.4.9), applied by `npm install`/`npm ci`
// (package.json "postinstall") to node_modules/postgres, so that losing the
// database cannot crash, hang or mis-answer this service. Plain JavaScript:
// it must run in a production install, where tsx is absent. It imports nothing
// of the project, and the project's core imports nothing of it: start-up
// (src/start.ts) hands `patchProblem` to the check in src/core/db/driver-check.ts.
//
// What it fixes, each reproduced here by killing a backend or restarting
// PostgreSQL under load (test/fault-driver.test.ts, test/fault-db-outage.test.ts
// fail without it):
//
// 1. porsager/postgres#1154, #1066, #1208: when a connection dies while a
//    `sql.begin` callback is running, postgres.js sends that transaction's
//    ROLLBACK on the dead connection; the write is queued with setImmediate
//    and then dereferences the null socket: `TypeError: Cannot read
//    properties of null (reading 'write')`, thrown from a timer, which kills
//    the process.
// 2. A closed connection keeps the state of its dead session: the query it
//    was running, that ROLLBACK, the server's last error (57P01 "terminating
//    connection"), a cancelled but non-null write timer. When the pool opens
//    it again, the first query gets the old error, answers can be matched to
//    the wrong queries, and writes are never flushed: requests hang for
//    seconds after a restart. And a connection lost while it fetched the
//    array types rejects a promise nobody awaits (an unhandled rejection).
// 3. #1133 (PR #1155): a statement a transaction callback issues after its
//    connection died runs on whatever that connection object serves next,
//    outside any transaction, and commits; statements queued inside the
//    transaction never settle (#1186).
// 4. #1097: sql.end() waits forever for the stale query of a closed connection.
//    And sql.end() leaves behind a connection that is still opening (its socket
//    connects later and holds a backend until PostgreSQL's authentication
//    timeout) or waiting to reconnect (its timer opens a new session after the
//    end), and a connection closing during the end reconnected to serve the
//    queries still queued, then stayed open: after an outage, the process that
//    closed its pool could not exit (test/lifecycle.test.ts).
//
// And four for speed and memory (bench/README.md, findings 1, 6 and 7):
//
// 5. A statement counter (the `onquery` option, for db_queries_total): the
//    only hook postgres.js has, `debug`, makes it capture a stack trace
//    (`new Error()`) for every query and fragment built, a large part of
//    the CPU of a list request (bench/README.md).
// 6. The pool slows down the longer it stays saturated (porsager/postgres#747):
//    its queues (src/queue.js) are consumed with shift(), which leaves a hole
//    and resets the array only when it empties, which a busy queue under load
//    never does; every move of a connection then scans all the holes, so
//    CPU per statement keeps growing under load; bench/pool-drift.ts shows it.
// 7. Every failed `sql.unsafe` statement (the compiled list SQL) leaves an
//    entry behind for good: the stack cache of src/query.js is keyed by
//    the query's strings array, which unsafe makes anew for every call.
// 8. Queries are promoted to V8's old generation with their rows whenever
//    the process runs in a certain state (bench/README.md, "The promotion
//    puzzle"): the Query constructor
//    assigns two arrow functions straight to properties, which V8's parser
//    marks for allocation in old space; each such closure (dead once the
//    query settled, but old garbage lives until the next mark-compact)
//    holds its young Query through the remembered set, so the Query
//    survives two scavenges and is promoted. Declared first, then
//    assigned, the closures are young like their Query.
//
// And one for a transaction pooler (src/core/db/connect.ts, `pooled`):
//
// 9. With `max_pipeline: 0` (no statement sent behind another, which
//    PgBouncer 1.18 cannot follow) every `sql.begin` fails with
//    UNSAFE_TRANSACTION: the BEGIN reserves its connection in a callback
//    that is called only while the pipeline has room, so never. The edit
//    calls it first; the same failure hits a BEGIN sent as the 100th
//    statement of a full pipeline.
//
// And one more for speed:
//
// 10. A row's columns are decoded with Buffer's utf8Slice, not
//     toString('utf8', start, end): toString re-checks its arguments and
//     looks the encoding up in JavaScript before it calls the same
//     utf8Slice, once per column, 300 times for a 50-row page of users
//     (bench/README.md). The offsets come from the message and are in range.
//
// Each edit in `edits` below names its fix (the numbers above) and, on its
// `Upstream:` line, the change to postgres.js that would let us delete it: none
// is released (3.4.9 is the latest release), so each names the open issue or
// pull request, or what would be needed where none is filed. When one is
// released, upgrade and delete the edits it covers (test/fault-driver.test.ts
// shows whether the behaviour stays fixed).
//
// Nineteen textual replacements in src/connection.js, src/index.js,
// src/queue.js and src/query.js, and the
// same in the CommonJS copy (cjs/src/), each marked in the patched file with
// "users-products-api patch", and each patched file ends with a stamp naming
// the digest of the edits (`STAMP_PREFIX` + PATCH_DIGEST): of the files, texts
// and replacements, not of this file, so that a comment or a message changed
// here leaves an installed copy valid. What counts is the content: every
// patched file, ESM and CommonJS, must have the SHA-256 in PATCHED_SHA256 (its
// stamp line left out). The patch checks that before it writes anything, and
// start-up does too (`patchProblem`, src/core/db/driver-check.ts): a stamp
// appended to an unpatched file, a copy patched by another version of the
// edits (an `npm install` that kept an old node_modules) or a file edited
// since are all refused. The Makefile installs again when this file changes.
// Files are written to a temporary file and renamed over the original, so a
// crash never leaves a truncated driver. Idempotent. If a text to replace is
// not found (postgres.js was upgraded and its code changed), it fails loudly
// and `npm ci` fails with it: check whether the new version has the changes
// the `Upstream:` lines name, then adapt or delete this file. After changing
// the edits (or the version), the failed check prints the new PATCHED_SHA256
// to paste here.
//
// Usage: node src/driver-patch/postgres.mjs [folder of the postgres package]

import { createHash } from 'node:crypto'
import { existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

export const MARKER = 'users-products-api patch'
/** This script, by its absolute path: start-up names it as the command to run on an unpatched copy. */
export const PATCH_SCRIPT = fileURLToPath(import.meta.url)
/** This script as messages name it, from the project's folder. */
const SCRIPT_NAME = 'src/driver-patch/postgres.mjs'

export const STAMP_PREFIX = `// ${MARKER}: edit list `
const STAMP = /\n\/\/ users-products-api patch: edit list [0-9a-f]{16}\n$/

/** SHA-256 of each file as this patch leaves it, its last line (the stamp) left out: the patched postgres.js 3.4.9. */
export const PATCHED_SHA256 = {
  'src/connection.js': 'cc3fe1f67d2e8ed33192fd67fc8236110639885a66e09759517abe13705d7332',
  'src/index.js': 'ee883aae754fa11e9421b380bbabc9ad3ef72693e115c1d254e109ace3eb77cb',
  'src/queue.js': 'ecd984173a68d4af085c77af43135c82af7ee9b48dcb0e257d4579b76810287a',
  'src/query.js': 'e0ee0faee52fbda19d3c777a0d7d06108de8fc70cbf9141b2c8733d7c8188479',
  'cjs/src/connection.js': '7ab270e4ea594b15581d159cd43b25f96d4ca168b588106ec94ec46d9a6b29e2',
  'cjs/src/index.js': '6f933cb217fd4be362d6545cfda90d5cb8cccc188759e919674720a01f6b887e',
  'cjs/src/queue.js': '021fe60656a61dd28e502efa6b33d5b51cee4bb016bc92d0e2482171f75e4820',
  'cjs/src/query.js': '2c011b36ae8be513e46eb5f37318a1673f0dcf957d5736c7261b722bfa183776',
}

/** [file inside the package's source folder, text to find, its replacement] */
export const edits = [
  // 10. Upstream: none filed upstream; would need: src/connection.js to decode columns with utf8Slice.
  [
    'connection.js',
    `            ? x.toString('utf8', index, index += length)
            : column.parser.array === true
              ? column.parser(x.toString('utf8', index + 1, index += length))
              : column.parser(x.toString('utf8', index, index += length))
`,
    `            // ${MARKER}: utf8Slice is what toString calls, without re-checking the offsets and the encoding per column
            ? x.utf8Slice(index, index += length)
            : column.parser.array === true
              ? column.parser(x.utf8Slice(index + 1, index += length))
              : column.parser(x.utf8Slice(index, index += length))
`,
  ],
  // 1. Upstream: PR #1155 (open, for #1133: a closed connection is marked terminated, so execute() refuses
  // the statement) or PR #1209 (open, fixes #1208: a write on a closed socket fails its query).
  [
    'connection.js',
    `  function execute(q) {
    if (terminated)
      return queryError(q, Errors.connection('CONNECTION_DESTROYED', options))
`,
    `  function execute(q) {
    if (terminated)
      return queryError(q, Errors.connection('CONNECTION_DESTROYED', options))

    // ${MARKER}: a connection without a socket takes no statement (true: keep it in its queue)
    if (!socket)
      return (queryError(q, Errors.connection('CONNECTION_CLOSED', options)), true)
`,
  ],
  // 1. Upstream: PR #1209 (open, fixes #1208) or PR #1155 (open, for #1133); both guard nextWrite().
  [
    'connection.js',
    `  function nextWrite(fn) {
    const x = socket.write(chunk, fn)
`,
    `  function nextWrite(fn) {
    // ${MARKER}: the socket closed after the write was queued; its query has been failed
    if (!socket)
      return (chunk = nextWriteTimer = null, false)
    const x = socket.write(chunk, fn)
`,
  ],
  // 2. Upstream: PR #1215 (open, fixes #1216): a closed connection's pending write is cleared before reuse.
  [
    'connection.js',
    `      error(Errors.connection('CONNECTION_DESTROYED', options))

    clearImmediate(nextWriteTimer)
`,
    `      error(Errors.connection('CONNECTION_DESTROYED', options))

    clearImmediate(nextWriteTimer)
    chunk = nextWriteTimer = null // ${MARKER}
`,
  ],
  // 2. Upstream: PR #1215 (open, fixes #1216) resets the dead session's write, query, result and error;
  // failing its queries also after an 'error', which ended an end() waiting on them: PR #1142 (open; #1097, #1130).
  [
    'connection.js',
    `    incomings = null
    clearImmediate(nextWriteTimer)
    socket.removeListener('data', data)
    socket.removeListener('connect', connected)
    idleTimer.cancel()
    lifeTimer.cancel()
    connectTimer.cancel()

    socket.removeAllListeners()
    socket = null

    if (initial)
      return reconnect()

    !hadError && (query || sent.length) && error(Errors.connection('CONNECTION_CLOSED', options, socket))
`,
    `    incomings = null
    clearImmediate(nextWriteTimer)
    chunk = nextWriteTimer = null // ${MARKER}
    socket.removeListener('data', data)
    socket.removeListener('connect', connected)
    idleTimer.cancel()
    lifeTimer.cancel()
    connectTimer.cancel()

    socket.removeAllListeners()
    socket = null

    if (initial)
      return reconnect()

    // ${MARKER}: fail whatever the dead session still had (also after an 'error'), then forget
    // it, its last error included: the next session's first query must not receive the old FATAL
    ;(query || sent.length) && error(Errors.connection('CONNECTION_CLOSED', options, socket))
    query = results = errorResponse = null
    result = new Result()
    rows = 0
    ended && (ended(), ended = null)
`,
  ],
  // 4. Upstream: none filed upstream; would need: terminate() to cancel a pending reconnect (its timer
  // kept, as here).
  [
    'connection.js',
    `    , delay = 0
`,
    `    , delay = 0
    , reconnectTimer = null // ${MARKER}: see reconnect()
`,
  ],
  // 4. Upstream: none filed upstream; would need: terminate() to cancel a pending reconnect (its timer
  // kept, as here).
  [
    'connection.js',
    `  function reconnect() {
    setTimeout(connect, closedTime ? Math.max(0, closedTime + delay - performance.now()) : 0)
`,
    `  function reconnect() {
    // ${MARKER}: kept, so that terminate() can cancel it; a reconnect due after sql.end() opened a session nobody ends
    clearTimeout(reconnectTimer)
    reconnectTimer = setTimeout(connect, closedTime ? Math.max(0, closedTime + delay - performance.now()) : 0)
`,
  ],
  // 4. Upstream: none filed upstream; would need: terminate() to destroy a socket still connecting and
  // cancel a pending reconnect.
  [
    'connection.js',
    `      socket.readyState === 'open' && socket.end(b().X().end())
    }
`,
    `      // ${MARKER}: a socket still connecting is destroyed; left alone, it connected after sql.end() and held a backend
      socket.readyState === 'open' ? socket.end(b().X().end()) : socket.readyState === 'opening' && socket.destroy()
    }
    clearTimeout(reconnectTimer) // ${MARKER}
`,
  ],
  // 4. Upstream: none filed upstream; would need: a connection that closes during sql.end() to fail the
  // queued queries (as those made after end() fail) instead of reconnecting to serve them.
  [
    'index.js',
    `    options.onclose && options.onclose(c.id)
    queries.length && connect(c, queries.shift())
`,
    `    options.onclose && options.onclose(c.id)
    // ${MARKER}: after sql.end() no connection opens again (one that did served the queued query and then stayed
    // open, its end already over): the queued queries fail as those made after end() do
    if (ending)
      while (queries.length) queries.shift().reject(Errors.connection('CONNECTION_ENDED', options, options))
    queries.length && connect(c, queries.shift())
`,
  ],
  // 2. Upstream: #1192, #1205, #1223 (open issues, no pull request): would need: ReadyForQuery to handle
  // the rejection of fetchArrayTypes().
  [
    'connection.js',
    `  async function fetchArrayTypes() {
    needsTypes = false
    const types = await new Query([\`
      select b.oid, b.typarray
      from pg_catalog.pg_type a
      left join pg_catalog.pg_type b on b.oid = a.typelem
      where a.typcategory = 'A'
      group by b.oid, b.typarray
      order by b.oid
    \`], [], execute)
`,
    `  async function fetchArrayTypes() {
    needsTypes = false
    const types = await new Query([\`
      select b.oid, b.typarray
      from pg_catalog.pg_type a
      left join pg_catalog.pg_type b on b.oid = a.typelem
      where a.typcategory = 'A'
      group by b.oid, b.typarray
      order by b.oid
    \`], [], execute).catch(() => null) // ${MARKER}: a connection lost here rejected nobody's promise
    if (!types)
      return (needsTypes = options.fetch_types, undefined)
`,
  ],
  // 3. Upstream: PR #1215 (open, fixes #1216 and the queued statements of #1186) or PR #1155 (open, for #1133).
  [
    'index.js',
    `      , prepare = null

    try {
      await sql.unsafe('begin ' + options.replace(/[^a-z ]/ig, ''), [], { onexecute }).execute()
      return await Promise.race([
        scope(connection, fn),
        new Promise((_, reject) => connection.onclose = reject)
      ])
`,
    `      , prepare = null
      , closedError = null // ${MARKER}

    try {
      await sql.unsafe('begin ' + options.replace(/[^a-z ]/ig, ''), [], { onexecute }).execute()
      return await Promise.race([
        scope(connection, fn),
        new Promise((_, reject) => connection.onclose = (e) => {
          // ${MARKER}: the transaction died with its connection; none of its statements may run anywhere now
          closedError = e
          while (queries.length)
            queries.shift().reject(e)
          reject(e)
        })
      ])
`,
  ],
  // 5. Upstream: #461 (open: query hooks, none released); would need: a per-statement hook that, unlike
  // `debug`, captures no stack trace.
  [
    'connection.js',
    `    typeof options.debug === 'function' && options.debug(id, string, parameters, types)
`,
    `    typeof options.debug === 'function' && options.debug(id, string, parameters, types)
    typeof options.onquery === 'function' && options.onquery() // ${MARKER}: a statement counter without debug's stack traces
`,
  ],
  // 5. Upstream: #461 (open: query hooks, none released); would need: a per-statement hook that, unlike
  // `debug`, captures no stack trace.
  [
    'index.js',
    `    onclose         : o.onclose,
`,
    `    onclose         : o.onclose,
    onquery         : o.onquery, // ${MARKER}
`,
  ],
  // 6. Upstream: #747 (open, the slowdown; no pull request); would need: src/queue.js to drop the front
  // shift() consumed, or remove() not to scan it.
  [
    'queue.js',
    `    remove: (x) => {
      const index = xs.indexOf(x)
      return index === -1
        ? null
        : (xs.splice(index, 1), x)
    },
`,
    `    remove: (x) => {
      // ${MARKER}: search from the first live entry, not through every hole shift() left
      const at = xs.indexOf(x, index)
      return at === -1
        ? null
        : (xs.splice(at, 1), x)
    },
`,
  ],
  // 6. Upstream: #747 (open, the slowdown; no pull request); would need: src/queue.js to drop the front
  // shift() consumed, or remove() not to scan it.
  [
    'queue.js',
    `      } else {
        xs[index - 1] = undefined
      }
`,
    `      } else {
        xs[index - 1] = undefined
        // ${MARKER}: drop the consumed front once it is most of the array; under
        // sustained load a busy queue never empties, and the holes grew without bound
        if (index > 64 && index * 2 > xs.length)
          (xs = xs.slice(index), index = 0)
      }
`,
  ],
  // 8. Upstream: none filed upstream; would need: the Query constructor not to assign its resolve/reject
  // closures straight to properties.
  [
    'query.js',
    `    this.resolve = x => (this.active = false, resolve(x))
    this.reject = x => (this.active = false, reject(x))
`,
    `    // ${MARKER}: a function literal assigned straight to a property is allocated in
    // old space by V8, and there kept each young Query and its rows alive until the next mark-compact
    const onresolve = x => (this.active = false, resolve(x))
        , onreject = x => (this.active = false, reject(x))
    this.resolve = onresolve
    this.reject = onreject
`,
  ],
  // 7. Upstream: none filed upstream (#273, closed, stopped capturing a stack for untagged queries, not this
  // cache); would need: `origin` to cache nothing for an untagged query.
  [
    'query.js',
    `  get origin() {
    return (this.handler.debug
`,
    `  get origin() {
    // ${MARKER}: an untagged query (sql.unsafe) has no origin to give, yet its
    // fresh strings array was remembered forever in the cache below, once per failed query
    if (!this.tagged && !this.handler.debug)
      return ''
    return (this.handler.debug
`,
  ],
  // 9. Upstream: #1210 (open); PR #1211 and PR #1218 (both open) make this change.
  [
    'connection.js',
    `      build(q)
      return write(toBuffer(q))
        && !q.describeFirst
        && !q.cursorFn
        && sent.length < max_pipeline
        && (!q.options.onexecute || q.options.onexecute(connection))
`,
    `      build(q)
      // ${MARKER}: a BEGIN reserves its connection whatever room the pipeline has (max_pipeline 0 has none)
      return write(toBuffer(q))
        && !q.describeFirst
        && !q.cursorFn
        && (!q.options.onexecute || q.options.onexecute(connection))
        && sent.length < max_pipeline
`,
  ],
  // 3. Upstream: PR #1215 (open, fixes #1216) or PR #1155 (open, for #1133): statements of a transaction
  // whose connection closed are rejected.
  [
    'index.js',
    `      function handler(q) {
        q.catch(e => uncaughtError || (uncaughtError = e))
        c.queue === full
`,
    `      function handler(q) {
        q.catch(e => uncaughtError || (uncaughtError = e))
        if (closedError) // ${MARKER}
          return q.reject(closedError)
        c.queue === full
`,
  ],
]

/**
 * What a patched file is stamped with: the digest of the edits alone, so that it changes with what the
 * patch writes and with nothing else (comments, messages, where this file lives).
 */
export const PATCH_DIGEST = createHash('sha256').update(JSON.stringify(edits)).digest('hex').slice(0, 16)

/** The source folders of the package that Node can load: ESM (`import`) and CommonJS (`require`). */
const sourceFolders = ['src', 'cjs/src']
/** Every file the patch writes, as the keys of PATCHED_SHA256 name them. */
const patchedFiles = () =>
  sourceFolders.flatMap((folder) => [...new Set(edits.map(([file]) => file))].map((file) => `${folder}/${file}`))

export class PatchError extends Error {}

const sha256 = (text) => createHash('sha256').update(text).digest('hex')
const stampLine = `${STAMP_PREFIX}${PATCH_DIGEST}\n`

/**
 * Why `text`, the file `name` ('cjs/src/query.js') of the package, is not what this patch makes of it; undefined when
 * it is.
 */
function fileProblem(name, text) {
  if (!text.includes(STAMP_PREFIX)) return `is not patched (${name})`
  if (!text.endsWith(stampLine)) return `was patched by another version of ${SCRIPT_NAME} (${name})`
  const actual = sha256(text.slice(0, -stampLine.length))
  if (actual !== PATCHED_SHA256[name])
    return `is not the copy this patch makes (${name}: SHA-256 ${actual}, expected ${PATCHED_SHA256[name]})`
  return undefined
}

/**
 * Why the package at `packageDir` is not postgres.js as this patch leaves
 * it, ESM and CommonJS copies alike, or undefined when it is: the check
 * start-up runs (src/core/db/driver-check.ts, given it by src/start.ts).
 */
export function patchProblem(packageDir) {
  for (const name of patchedFiles()) {
    const problem = fileProblem(name, readFileSync(join(packageDir, name), 'utf8'))
    if (problem) return `postgres.js at ${packageDir} ${problem}`
  }
  return undefined
}

/**
 * Applies every edit to every source folder of the package at `packageDir`.
 * Returns what it did per file; throws PatchError, changing nothing, when a
 * text is neither found exactly once nor already patched, or when a file
 * it would leave is not the one PATCHED_SHA256 expects.
 */
export function patchPostgres(packageDir) {
  const version = JSON.parse(readFileSync(join(packageDir, 'package.json'), 'utf8')).version
  const pending = new Map()
  const report = []
  for (const folder of sourceFolders) {
    for (const [file, find, replace] of edits) {
      const path = join(packageDir, folder, file)
      if (!existsSync(path)) throw new PatchError(`postgres.js ${version}: ${path} does not exist`)
      let text = pending.get(path) ?? readFileSync(path, 'utf8').replace(STAMP, '\n')
      if (text.includes(replace)) {
        report.push(`${join(folder, file)}: already patched`)
        continue
      }
      const at = text.indexOf(find)
      if (at === -1 || text.indexOf(find, at + 1) !== -1) {
        throw new PatchError(
          `postgres.js ${version}: the code ${SCRIPT_NAME} patches has changed in ${join(folder, file)}:\n${find}\n` +
            'Check whether this version fixes porsager/postgres#1154/#1208 (write on a closed socket), #1133 ' +
            '(transaction statements after its connection closed), #1097 (end() hangs) and the other changes ' +
            'the `Upstream:` lines of the edits name, then adapt or remove the patch.',
        )
      }
      text = text.slice(0, at) + replace + text.slice(at + find.length)
      pending.set(path, text)
      report.push(`${join(folder, file)}: patched`)
    }
  }
  for (const folder of sourceFolders) {
    for (const file of new Set(edits.map(([f]) => f))) {
      const path = join(packageDir, folder, file)
      const unstamped = pending.get(path) ?? readFileSync(path, 'utf8').replace(STAMP, '\n')
      const stamped = `${unstamped.replace(/\n$/, '')}\n${STAMP_PREFIX}${PATCH_DIGEST}\n`
      if (stamped !== readFileSync(path, 'utf8')) pending.set(path, stamped)
      else pending.delete(path)
    }
  }
  // Checked before anything is written: what `npm ci` leaves must pass start-up's check.
  const results = patchedFiles().map((name) => {
    const path = join(packageDir, name)
    const text = pending.get(path) ?? readFileSync(path, 'utf8')
    return { name, problem: fileProblem(name, text), sha256: sha256(text.slice(0, -stampLine.length)) }
  })
  const wrong = results.filter((r) => r.problem)
  if (wrong.length) {
    throw new PatchError(
      `postgres.js ${version}: the patched files are not the ones expected:\n` +
        `${wrong.map((r) => `  ${r.problem}`).join('\n')}\n` +
        'This is not the package the patch was made for (check the version and the lock file), or the edits ' +
        `changed: then, with the patched files reviewed, set PATCHED_SHA256 in ${SCRIPT_NAME} to\n` +
        JSON.stringify(Object.fromEntries(results.map((r) => [r.name, r.sha256])), null, 2),
    )
  }
  for (const [path, text] of pending) {
    // Written beside it, then renamed over it: a crash leaves the old file or the new one, never half of one.
    const temporary = `${path}.${process.pid}.tmp`
    writeFileSync(temporary, text)
    renameSync(temporary, path)
  }
  return { version, report }
}

if (process.argv[1] && PATCH_SCRIPT === process.argv[1]) {
  const packageDir = process.argv[2] ?? fileURLToPath(new URL('../../node_modules/postgres/', import.meta.url))
  try {
    const { version, report } = patchPostgres(packageDir)
    const changed = report.filter((r) => r.endsWith(': patched')).length
    const done = changed ? `${changed} changes applied` : 'already patched'
    console.log(`postgres.js ${version}: ${done} (${SCRIPT_NAME})`)
  } catch (err) {
    console.error(err instanceof PatchError ? `\n${err.message}\n` : err)
    process.exit(1)
  }
}
