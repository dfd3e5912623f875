import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { test } from 'node:test'
import { projectRoot } from './fault-kit.js'

// The Makefile as an operator meets it: `make help` lists every target, one line each, and `make admin` without
// EMAIL says how to call it and does nothing else. make is run for real, with `help` (which runs nothing) or `-n`
// (which prints what it would run); never a target that installs or starts anything.

const makefile = readFileSync(join(projectRoot, 'Makefile'), 'utf8')
const make = (...args: string[]) =>
  spawnSync('make', ['--no-print-directory', ...args], { cwd: projectRoot, encoding: 'utf8', timeout: 60_000 })

/** The targets of every `.PHONY:` line. */
const phony = [...makefile.matchAll(/^\.PHONY:(.*)$/gm)].flatMap((m) => m[1]!.trim().split(/\s+/))

test('`make help` gives every .PHONY target one line, and lists no target that does not exist', () => {
  const help = make('-s', 'help')
  assert.equal(help.status, 0, help.stderr)
  const lines = help.stdout.split('\n').filter(Boolean)
  const listed = lines.map((line) => /^make ([a-z-]+)/.exec(line)?.[1])
  assert.ok(
    listed.every((t) => t !== undefined),
    `every line is "make <target> …": ${lines.join(' | ')}`,
  )
  assert.ok(phony.includes('help') && phony.includes('admin'), phony.join(' '))
  for (const target of phony) {
    assert.equal(listed.filter((t) => t === target).length, 1, `make help: one line for ${target}`)
    assert.match(makefile, new RegExp(`^${target}:`, 'm'), `${target} has a rule`)
  }
  for (const target of listed) assert.ok(phony.includes(target!), `make help lists ${target}, not a .PHONY target`)
  for (const line of lines) assert.match(line, /^make \S+(?: EMAIL=…)? +\S/, `a description: ${line}`)
})

test('`make admin` without EMAIL prints its usage and fails, before installing or starting anything', () => {
  for (const args of [['admin'], ['admin', 'EMAIL='], ['admin', 'EMAIL= ']]) {
    const run = make('-n', ...args)
    assert.notEqual(run.status, 0, args.join(' '))
    assert.match(run.stderr, /usage: make admin EMAIL=you@example\.com/, args.join(' '))
    assert.equal(run.stdout, '', `${args.join(' ')}: nothing would run`)
  }
  const given = make('-n', 'admin', 'EMAIL=root@example.com')
  assert.equal(given.status, 0, given.stderr)
  assert.match(given.stdout, /src\/main\.ts admin "root@example\.com"$/m)
})
