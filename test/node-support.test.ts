import assert from 'node:assert/strict'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import { endOfLifeNotice, RELEASE_LINES, supportedLines } from '../src/node-support.js'
import { launchService, projectRoot } from './fault-kit.js'
import { createTestDatabase } from './helpers/server.js'

// The supported Node.js release lines: the end-of-life table of src/node-support.ts,
// the warning the service logs at start on a line that has ended, and `engines`.

const day = (iso: string) => new Date(`${iso}T12:00:00Z`)

describe('which release lines are end-of-life', () => {
  test('in November 2026: 22, 24 and 26 are supported; 20 and older, 23 and 25 have ended', () => {
    const today = day('2026-11-25')
    assert.deepEqual(supportedLines(today), [22, 24, 26])
    for (const version of ['v18.20.8', 'v20.19.5', 'v21.7.3', 'v23.11.1', 'v25.9.0']) {
      const notice = endOfLifeNotice(version, today)
      assert.ok(notice, version)
      assert.match(notice.msg, new RegExp(`${version} is end-of-life.*\\(22, 24, 26\\)`))
      assert.deepEqual(notice.fields.supported_lines, [22, 24, 26])
    }
    for (const version of ['v22.0.0', 'v22.23.3', 'v24.21.0', 'v26.10.0'])
      assert.equal(endOfLifeNotice(version, today), undefined, version)
  })

  test('an ended line says when it ended: its date, or for a line older than the table, before the oldest', () => {
    const today = day('2026-11-25')
    const ended = { 'v20.19.5': '2026-04-30', 'v18.20.8': '2025-04-30', 'v21.7.3': '2024-06-01' }
    for (const [version, date] of Object.entries(ended)) {
      const notice = endOfLifeNotice(version, today)!
      assert.equal(notice.fields.end_of_life, date, version)
      assert.match(notice.msg, new RegExp(`^Node\\.js ${version} is end-of-life \\(ended ${date}\\) and gets no`))
    }
    const old = endOfLifeNotice('v16.20.2', today)!
    assert.equal(old.fields.end_of_life, `before ${RELEASE_LINES[0]!.endOfLife}`)
    assert.match(old.msg, /^Node\.js v16\.20\.2 is end-of-life \(ended before 2025-04-30\)/)
    for (const version of [...Object.keys(ended), 'v16.20.2', 'v23.11.1'])
      assert.notEqual(endOfLifeNotice(version, today)!.fields.end_of_life, null, version)
  })

  test('a line ends on its end-of-life day, and the lines to install move on with the date', () => {
    assert.equal(endOfLifeNotice('v25.9.0', day('2026-05-31')), undefined)
    assert.equal(endOfLifeNotice('v25.9.0', day('2026-06-01'))?.fields.end_of_life, '2026-06-01')
    assert.equal(endOfLifeNotice('v22.23.3', day('2027-04-29')), undefined)
    const after22 = endOfLifeNotice('v22.23.3', day('2027-04-30'))
    assert.deepEqual(after22?.fields, {
      node_version: 'v22.23.3',
      end_of_life: '2027-04-30',
      supported_lines: [24, 26],
    })
  })

  test('a line newer than the table is taken as supported', () => {
    const newest = RELEASE_LINES[RELEASE_LINES.length - 1]!.line
    assert.equal(endOfLifeNotice(`v${newest + 1}.0.0`, day('2026-11-25')), undefined)
  })

  test('package.json engines admits the supported lines and refuses the ended ones', () => {
    const engines = (
      JSON.parse(readFileSync(join(projectRoot, 'package.json'), 'utf8')) as { engines: { node: string } }
    ).engines.node
    // The range, read as npm reads it, for these two forms only: "^N.m.p" (line N) and ">=N.m.p" (N and later).
    const admits = (line: number) =>
      engines.split('||').some((part) => {
        const m = /^\s*(\^|>=)(\d+)(?:\.\d+){0,2}\s*$/.exec(part)
        assert.ok(m, `engines part "${part}" is of a form this test reads`)
        return m[1] === '^' ? Number(m[2]) === line : line >= Number(m[2])
      })
    for (const line of supportedLines(day('2026-11-25'))) assert.ok(admits(line), `engines ${engines} admits ${line}`)
    for (const line of [18, 20, 21, 23, 25]) assert.ok(!admits(line), `engines ${engines} refuses ${line}`)
  })
})

describe('the warning at start-up, through the real entry point', () => {
  // The entry point is run on the Node that runs the suite, told (by a module
  // loaded before it) that it is another version: process.version is what the
  // service reads.
  const dir = mkdtempSync(join(tmpdir(), 'upa-node-version-'))
  after(() => rmSync(dir, { recursive: true, force: true }))
  const pretending = (version: string) => {
    const file = join(dir, `node-${version}.mjs`)
    writeFileSync(file, `Object.defineProperty(process, 'version', { value: ${JSON.stringify(version)} })\n`)
    return { NODE_OPTIONS: `--import=${file}` }
  }
  const endOfLifeLines = (logs: Array<Record<string, unknown>>) => logs.filter((l) => /end-of-life/.test(String(l.msg)))

  test('on Node 20 the service warns once, naming the lines to install, and serves', async () => {
    const service = await launchService({ DATABASE_URL: await createTestDatabase(), ...pretending('v20.19.5') })
      .listening
    after(() => service.kill('SIGKILL'))
    const warnings = endOfLifeLines(service.logs)
    assert.equal(warnings.length, 1, JSON.stringify(service.logs))
    assert.equal(warnings[0]!.level, 'warn')
    assert.equal(warnings[0]!.node_version, 'v20.19.5')
    assert.equal(warnings[0]!.end_of_life, '2026-04-30')
    assert.deepEqual(warnings[0]!.supported_lines, supportedLines(new Date()))
    assert.ok(
      String(warnings[0]!.msg).endsWith(`install a supported release line (${supportedLines(new Date()).join(', ')})`),
      String(warnings[0]!.msg),
    )
    const health = await fetch(`${service.url}/healthz`)
    assert.equal(health.status, 200)
    assert.deepEqual(await health.json(), { status: 'ok' })
  })

  test('on the newest line of the table it does not warn', async () => {
    const newest = RELEASE_LINES[RELEASE_LINES.length - 1]!.line
    const service = await launchService({ DATABASE_URL: await createTestDatabase(), ...pretending(`v${newest}.10.0`) })
      .listening
    after(() => service.kill('SIGKILL'))
    assert.deepEqual(endOfLifeLines(service.logs), [])
    assert.ok(service.logs.some((l) => l.msg === 'listening'))
    assert.equal((await fetch(`${service.url}/healthz`)).status, 200)
  })
})
