import { readFileSync } from 'node:fs'
import { relative } from 'node:path'
import { fileURLToPath } from 'node:url'

// Aggregates a V8 .cpuprofile (node --cpu-prof) into self time by function,
// by area (our code per file, postgres.js, TypeBox, Node internals, GC) and
// total (inclusive) time of the project's own functions, optionally only over
// a time window (the load, not start-up) and per request.
//
//   node --import tsx bench/profile.ts <file.cpuprofile> [--requests N] [--top N]

interface CallFrame {
  functionName: string
  url: string
  lineNumber: number
  columnNumber: number
}
interface ProfileNode {
  id: number
  callFrame: CallFrame
  children?: number[]
}
interface CpuProfile {
  nodes: ProfileNode[]
  startTime: number
  endTime: number
  samples: number[]
  timeDeltas: number[]
}

export interface Row {
  name: string
  micros: number
  share: number
}

export interface Summary {
  /** µs of samples inside the window, idle excluded. */
  busyMicros: number
  idleMicros: number
  selfByFunction: Row[]
  selfByArea: Row[]
  /** Inclusive time of functions in the project's own files (dist/, src/, bench/). */
  totalByOwnFunction: Row[]
}

const projectRoot = fileURLToPath(new URL('../', import.meta.url))

function shortUrl(url: string): string {
  if (!url) return ''
  const path = url.startsWith('file://') ? fileURLToPath(url) : url
  if (path.startsWith(projectRoot)) return relative(projectRoot, path)
  return path
}

function area(frame: CallFrame): string {
  const url = shortUrl(frame.url)
  if (!url) {
    const fn = frame.functionName
    if (fn === '(garbage collector)') return 'GC'
    if (fn === '(program)') return '(program: V8/native, not attributed)'
    if (fn === '(idle)') return '(idle)'
    return `native: ${fn || '(anonymous)'}`
  }
  if (url.startsWith('node:')) {
    if (/^node:internal\/(http|_http|streams\/|stream_base|net|dns|tls)|^node:(_http|http|net)/.test(url))
      return 'node: http/net/streams'
    if (/^node:internal\/crypto|^node:crypto/.test(url)) return 'node: crypto'
    if (/^node:internal\/(fs|console)|^node:(fs|console)|tty|pipe/.test(url)) return 'node: fs/tty (stdout writes)'
    if (/^node:internal\/(process\/task_queues|timers|async_hooks)|^node:timers/.test(url))
      return 'node: timers/microtasks'
    return 'node: other'
  }
  const m = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url)
  if (m) return m[1]!
  return url
}

const fnLabel = (f: CallFrame) =>
  `${f.functionName || '(anonymous)'} ${shortUrl(f.url) ? `${shortUrl(f.url)}:${f.lineNumber + 1}` : ''}`.trim()

/**
 * Self and inclusive time; `window` is [from, to] in the profile's clock (µs), as process.hrtime in another process.
 */
export function summarize(file: string, window?: [number, number]): Summary {
  const profile = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile
  const byId = new Map<number, ProfileNode>()
  const parent = new Map<number, number>()
  for (const node of profile.nodes) {
    byId.set(node.id, node)
    for (const child of node.children ?? []) parent.set(child, node.id)
  }
  const self = new Map<string, number>()
  const areas = new Map<string, number>()
  const inclusive = new Map<string, number>()
  let busy = 0
  let idle = 0
  let t = profile.startTime
  for (let i = 0; i < profile.samples.length; i++) {
    t += profile.timeDeltas[i]!
    // A sample's delta is the time since the previous one: charge it to this sample.
    const delta = profile.timeDeltas[i + 1] ?? 0
    if (window && (t < window[0] || t > window[1])) continue
    const node = byId.get(profile.samples[i]!)!
    const frame = node.callFrame
    if (frame.functionName === '(idle)') {
      idle += delta
      continue
    }
    busy += delta
    const label = fnLabel(frame)
    self.set(label, (self.get(label) ?? 0) + delta)
    const a = area(frame)
    areas.set(a, (areas.get(a) ?? 0) + delta)
    // Inclusive: each distinct own function on the stack once.
    const seen = new Set<string>()
    for (let id: number | undefined = node.id; id !== undefined; id = parent.get(id)) {
      const f = byId.get(id)!.callFrame
      const u = shortUrl(f.url)
      if (!/^(dist|src|bench)\//.test(u)) continue
      const l = fnLabel(f)
      if (seen.has(l)) continue
      seen.add(l)
      inclusive.set(l, (inclusive.get(l) ?? 0) + delta)
    }
  }
  const rows = (m: Map<string, number>) =>
    [...m]
      .map(([name, micros]) => ({ name, micros, share: busy ? micros / busy : 0 }))
      .sort((a, b) => b.micros - a.micros)
  return {
    busyMicros: busy,
    idleMicros: idle,
    selfByFunction: rows(self),
    selfByArea: rows(areas),
    totalByOwnFunction: rows(inclusive),
  }
}

export function formatSummary(s: Summary, requests: number | undefined, top = 25): string {
  const per = (us: number) => (requests ? `${(us / requests).toFixed(1).padStart(7)} µs/req` : '')
  const line = (r: Row) => `  ${(r.share * 100).toFixed(1).padStart(5)}% ${per(r.micros)}  ${r.name}`
  const out: string[] = []
  out.push(
    `busy ${(s.busyMicros / 1000).toFixed(0)} ms` +
      (requests ? `, ${requests} requests, ${(s.busyMicros / requests).toFixed(1)} µs/req on the main thread` : ''),
  )
  out.push('self time by area:', ...s.selfByArea.slice(0, 14).map(line))
  out.push(`self time by function (top ${top}):`, ...s.selfByFunction.slice(0, top).map(line))
  out.push(
    `total (inclusive) time of the project's functions (top ${top}):`,
    ...s.totalByOwnFunction.slice(0, top).map(line),
  )
  return out.join('\n')
}

/** Two profiles side by side, per request, by area: where the first spends more than the second. */
export function formatComparison(
  a: Summary,
  requestsA: number,
  b: Summary,
  requestsB: number,
  names: [string, string],
): string {
  const areas = new Map<string, [number, number]>()
  for (const r of a.selfByArea) areas.set(r.name, [r.micros / requestsA, 0])
  for (const r of b.selfByArea) areas.set(r.name, [areas.get(r.name)?.[0] ?? 0, r.micros / requestsB])
  const rows = [...areas].map(([name, [x, y]]) => ({ name, x, y, d: x - y })).sort((p, q) => q.d - p.d)
  const f = (v: number) => v.toFixed(1).padStart(7)
  const out = [`main-thread µs/req by area: ${names[0]} | ${names[1]} | difference`]
  out.push(
    `  ${f(a.busyMicros / requestsA)} ` +
      `| ${f(b.busyMicros / requestsB)} | ${f(a.busyMicros / requestsA - b.busyMicros / requestsB)}  all`,
  )
  for (const r of rows) if (Math.abs(r.d) >= 0.5) out.push(`  ${f(r.x)} | ${f(r.y)} | ${f(r.d)}  ${r.name}`)
  return out.join('\n')
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const args = process.argv.slice(2)
  const file = args.find((a) => !a.startsWith('--') && !/^\d+$/.test(a))
  const opt = (name: string) => {
    const i = args.indexOf(name)
    return i === -1 ? undefined : Number(args[i + 1])
  }
  if (!file) {
    console.error('usage: node --import tsx bench/profile.ts <file.cpuprofile> [--requests N] [--top N]')
    process.exit(2)
  }
  console.log(formatSummary(summarize(file), opt('--requests'), opt('--top') ?? 30))
}
