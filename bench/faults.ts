import { readFileSync, writeFileSync } from 'node:fs'
import { cpus, totalmem } from 'node:os'
import { fileURLToPath } from 'node:url'
import type { FaultSection } from './faults/section.js'

// `make bench-faults`: the figures the fault tests do not assert (latencies,
// percentiles, the wait against its target, answers per second during a
// drain, how soon the service answers after a fault), each beside a baseline
// measured in the same run. Each section is a module of bench/faults/ whose
// `measure()` gives one table; they run one after another, their tables are
// printed, and each is written into bench/README.md between the markers
// `<!-- faults:begin -->` and `<!-- faults:end -->`, under its own marker, with
// when and on what it was measured: a run of some sections
// (BENCH_FAULTS_ONLY=hostile,shutdown) replaces only theirs.

/** Every section, in the order they run and appear: its topic (BENCH_FAULTS_ONLY's word) and its module. */
const SECTIONS: ReadonlyArray<[topic: string, load: () => Promise<{ measure(): Promise<FaultSection> }>]> = [
  ['hostile', () => import('./faults/hostile.js')],
  ['admission', () => import('./faults/admission.js')],
  ['pool-stall', () => import('./faults/pool-stall.js')],
  ['db-outage', () => import('./faults/db-outage.js')],
  ['shutdown', () => import('./faults/shutdown.js')],
  ['streams', () => import('./faults/streams.js')],
  ['driver', () => import('./faults/driver.js')],
  ['timing-channels', () => import('./faults/timing-channels.js')],
]

const README = fileURLToPath(new URL('README.md', import.meta.url))
const BEGIN = '<!-- faults:begin -->'
const END = '<!-- faults:end -->'
const sectionMarker = (topic: string) => `<!-- faults:${topic} -->`

function chosen(): typeof SECTIONS {
  const only = process.env.BENCH_FAULTS_ONLY?.split(',')
    .map((t) => t.trim())
    .filter(Boolean)
  if (!only) return SECTIONS
  const unknown = only.filter((t) => !SECTIONS.some(([topic]) => topic === t))
  if (unknown.length) {
    const topics = SECTIONS.map(([t]) => t).join(', ')
    console.error(`BENCH_FAULTS_ONLY: no section ${unknown.join(', ')}; the sections are ${topics}`)
    process.exit(2)
  }
  return SECTIONS.filter(([topic]) => only.includes(topic))
}

function machine(): string {
  const cores = cpus()
  const day = new Date().toISOString().slice(0, 16).replace('T', ' ')
  const cpu = cores[0]?.model.trim() ?? 'unknown CPU'
  return `${day} UTC; Node ${process.version}; ${cores.length} cores (${cpu}), ${(totalmem() / 2 ** 30).toFixed(0)} GiB`
}

function markdown(topic: string, section: FaultSection, measuredOn: string): string {
  const cell = (text: string) => text.replaceAll('|', '\\|')
  return [
    sectionMarker(topic),
    `### ${section.title}`,
    '',
    `_${measuredOn}_`,
    '',
    `| ${section.columns.map(cell).join(' | ')} |`,
    `|${section.columns.map(() => '---').join('|')}|`,
    ...section.rows.map((row) => `| ${row.map(cell).join(' | ')} |`),
    ...(section.note ? ['', section.note] : []),
    '',
  ].join('\n')
}

/**
 * bench/README.md with these sections' blocks written between the markers:
 * the text before the first block (the section's introduction) and the other
 * sections' blocks kept, the blocks in SECTIONS' order.
 */
function withSections(readme: string, written: Map<string, string>): string {
  const begin = readme.indexOf(BEGIN)
  const end = readme.indexOf(END)
  if (begin === -1 || end < begin) throw new Error(`bench/README.md lacks the markers ${BEGIN} and ${END}`)
  const inside = readme.slice(begin + BEGIN.length, end)
  const firstBlock = inside.indexOf('<!-- faults:')
  const intro = (firstBlock === -1 ? inside : inside.slice(0, firstBlock)).trimEnd()
  const blocks = new Map<string, string>()
  for (const [topic] of SECTIONS) {
    const at = inside.indexOf(sectionMarker(topic))
    if (at === -1) continue
    const next = inside.indexOf('<!-- faults:', at + 1)
    blocks.set(topic, inside.slice(at, next === -1 ? undefined : next).trimEnd() + '\n')
  }
  for (const [topic, block] of written) blocks.set(topic, block)
  const ordered = SECTIONS.map(([topic]) => blocks.get(topic)).filter((b) => b !== undefined)
  return `${readme.slice(0, begin + BEGIN.length)}${intro}\n\n${ordered.join('\n')}\n${readme.slice(end)}`
}

const written = new Map<string, string>()
const failed: string[] = []
for (const [topic, load] of chosen()) {
  const started = performance.now()
  console.log(`\n== ${topic}`)
  try {
    const section = await (await load()).measure()
    const block = markdown(topic, section, machine())
    written.set(topic, block)
    console.log(block)
    console.log(`(${topic}: ${((performance.now() - started) / 1000).toFixed(0)} s)`)
  } catch (err) {
    failed.push(topic)
    console.error(`${topic} failed:`, err)
  }
}
if (written.size) {
  writeFileSync(README, withSections(readFileSync(README, 'utf8'), written))
  console.log(`\nbench/README.md: ${[...written.keys()].join(', ')} written`)
}
if (failed.length) {
  console.error(`failed: ${failed.join(', ')}`)
  process.exit(1)
}
// Handles a section left open (a keep-alive socket, a timer) must not keep the run from ending.
process.exit(0)
