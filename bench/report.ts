import type { CeilingMeasurement, CeilingResults } from './ceiling.js'
import { KINDS, type Kind } from './servers.js'

// The report of `make bench`: tables of medians (min–max) over rounds, the
// service's ratios to each peer in the same round, and the targets.

export interface Measurement {
  /** Responses received, any status. */
  requests: number
  /** Successful responses (status below 400) per second. */
  rps: number
  p50: number
  p99: number
  /** utime + stime of the server process over the run ÷ successful responses. */
  cpuPerRequest: number
  /** The same for the PostgreSQL backends of its pool; undefined when not readable (a remote server). */
  dbCpuPerRequest: number | undefined
  peakRssMb: number
  /** Responses with a status above 399 (wrk's status errors). */
  statusErrors: number
  /** Connect, read and write errors. */
  socketErrors: number
  /** Requests without an answer within wrk's --timeout. */
  timeouts: number
}

export const failed = (m: Measurement) => m.statusErrors + m.socketErrors + m.timeouts

/** Per endpoint key (or `key@connections`), per server, one measurement per round. */
export type Series = Record<string, Partial<Record<Kind, Measurement[]>>>

export const LABEL: Record<Kind, string> = { service: 'service', fastify: 'Fastify', bare: 'bare' }

export const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b)
  if (!s.length) return NaN
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2
}

const finite = (xs: Array<number | undefined>) => xs.filter((x): x is number => x !== undefined && Number.isFinite(x))

/** `median (min–max)`, or the one value, or n/a. */
export function cell(xs: Array<number | undefined>, digits: number): string {
  const v = finite(xs)
  if (!v.length) return 'n/a'
  const f = (x: number) => x.toLocaleString('en', { minimumFractionDigits: digits, maximumFractionDigits: digits })
  if (v.length === 1) return f(v[0]!)
  return `${f(median(v))} (${f(Math.min(...v))}–${f(Math.max(...v))})`
}

/** The service's figure ÷ the peer's, round by round (the same round: the same minute of the machine). */
export function ratios(s: Series[string], peer: Kind, pick: (m: Measurement) => number | undefined): number[] {
  const own = s.service ?? []
  const other = s[peer] ?? []
  return finite(own.map((m, i) => {
    const a = pick(m)
    const b = other[i] === undefined ? undefined : pick(other[i]!)
    return a === undefined || b === undefined || !b ? undefined : a / b
  }))
}

const medianRatio = (s: Series[string], peer: Kind, pick: (m: Measurement) => number | undefined) => median(ratios(s, peer, pick))

export interface Row {
  key: string
  label: string
}

const pick = {
  rps: (m: Measurement) => m.rps,
  p50: (m: Measurement) => m.p50,
  p99: (m: Measurement) => m.p99,
  cpu: (m: Measurement) => m.cpuPerRequest,
  db: (m: Measurement) => m.dbCpuPerRequest,
  rss: (m: Measurement) => m.peakRssMb,
}

export function mainTable(rows: Row[], series: Series): string {
  const out = [
    '| endpoint | server | req/s | p50 ms | p99 ms | CPU µs/req | DB CPU µs/req | peak RSS MB | errors |',
    '|---|---|--:|--:|--:|--:|--:|--:|--:|',
  ]
  for (const r of rows) {
    for (const kind of KINDS) {
      const ms = series[r.key]?.[kind]
      if (!ms?.length) continue
      out.push(`| ${kind === 'service' ? r.label : ''} | ${LABEL[kind]} | ${cell(ms.map(pick.rps), 0)} | ${cell(ms.map(pick.p50), 2)} | ${cell(ms.map(pick.p99), 2)} | ` +
        `${cell(ms.map(pick.cpu), 0)} | ${cell(ms.map(pick.db), 0)} | ${cell(ms.map(pick.rss), 0)} | ${ms.reduce((n, m) => n + failed(m), 0)} |`)
    }
  }
  return out.join('\n')
}

export function ratioTable(rows: Row[], series: Series): string {
  const out = [
    '| endpoint | CPU ÷ Fastify | CPU ÷ bare | p50 ÷ Fastify | p50 ÷ bare | p99 ÷ Fastify | p99 ÷ bare | req/s ÷ Fastify | req/s ÷ bare | peak RSS ÷ Fastify | peak RSS ÷ bare |',
    '|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
  ]
  for (const r of rows) {
    const s = series[r.key]
    if (!s) continue
    const c = (peer: Kind, f: (m: Measurement) => number | undefined) => cell(ratios(s, peer, f), 2)
    out.push(`| ${r.label} | ${c('fastify', pick.cpu)} | ${c('bare', pick.cpu)} | ${c('fastify', pick.p50)} | ${c('bare', pick.p50)} | ` +
      `${c('fastify', pick.p99)} | ${c('bare', pick.p99)} | ${c('fastify', pick.rps)} | ${c('bare', pick.rps)} | ${c('fastify', pick.rss)} | ${c('bare', pick.rss)} |`)
  }
  return out.join('\n')
}

export const concurrencyKey = (key: string, connections: number) => `${key}@${connections}`

export function concurrencyTable(rows: Row[], levels: number[], series: Series): string {
  const out = [
    '| endpoint | connections | server | req/s | p50 ms | p99 ms | non-2xx | socket errors | time-outs | CPU µs/req | peak RSS MB |',
    '|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|',
  ]
  for (const r of rows) {
    for (const c of levels) {
      const s = series[concurrencyKey(r.key, c)]
      if (!s) continue
      for (const kind of KINDS) {
        const ms = s[kind]
        if (!ms?.length) continue
        const sum = (f: (m: Measurement) => number) => ms.reduce((n, m) => n + f(m), 0).toLocaleString('en')
        out.push(`| ${kind === 'service' ? r.label : ''} | ${kind === 'service' ? c.toLocaleString('en') : ''} | ${LABEL[kind]} | ` +
          `${cell(ms.map(pick.rps), 0)} | ${cell(ms.map(pick.p50), 2)} | ${cell(ms.map(pick.p99), 2)} | ` +
          `${sum((m) => m.statusErrors)} | ${sum((m) => m.socketErrors)} | ${sum((m) => m.timeouts)} | ${cell(ms.map(pick.cpu), 0)} | ${cell(ms.map(pick.rss), 0)} |`)
      }
    }
  }
  return out.join('\n')
}

export interface GrowthSize {
  rows: number
  series: Series
  /** Per endpoint key, what differs with the size (e.g. the N of id[gt]=N). */
  notes: Record<string, string>
}

/** Cost of a request: the server's CPU plus its PostgreSQL backends' (the part that could grow with the table). */
/** The outbox series' key of a write endpoint in one mode. */
export const outboxKey = (key: string, mode: 'on' | 'off') => `${key} outbox ${mode}`

/** Per write: its figures with events written and discarded, and the ratio of the two costs (service + database CPU) round by round. */
export function outboxTable(rows: Row[], series: Series): string {
  const out = [
    '| write | outbox | req/s | p99 ms | CPU µs/req | DB CPU µs/req | CPU + DB µs/req | on ÷ off |',
    '|---|---|--:|--:|--:|--:|--:|--:|',
  ]
  for (const r of rows) {
    const on = series[outboxKey(r.key, 'on')]?.service ?? []
    const off = series[outboxKey(r.key, 'off')]?.service ?? []
    for (const [mode, ms] of [['on', on], ['off', off]] as const) {
      out.push(`| ${mode === 'on' ? r.label : ''} | ${mode} | ${cell(ms.map(pick.rps), 0)} | ${cell(ms.map(pick.p99), 2)} | ${cell(ms.map(pick.cpu), 0)} | ` +
        `${cell(ms.map(pick.db), 0)} | ${cell(ms.map(costPerRequest), 0)} | ${mode === 'on' ? cell(outboxRatios(on, off), 2) : ''} |`)
    }
  }
  return out.join('\n')
}

const outboxRatios = (on: Measurement[], off: Measurement[]) =>
  finite(on.map((m, i) => {
    const a = costPerRequest(m)
    const b = off[i] === undefined ? undefined : costPerRequest(off[i]!)
    return a === undefined || b === undefined || !b ? undefined : a / b
  }))

/** The outbox adds at most 15 % to a write's CPU, the database's included. */
export function outboxTargets(rows: Row[], series: Series, out: string[]): void {
  const check = checker(out)
  for (const r of rows) {
    const v = median(outboxRatios(series[outboxKey(r.key, 'on')]?.service ?? [], series[outboxKey(r.key, 'off')]?.service ?? []))
    check(within(v, 1.15), `the events outbox adds ≤ 15 % CPU (service + database) per write, ${r.label}: ${x(v)}`)
  }
}

const costPerRequest = (m: Measurement) => (m.dbCpuPerRequest === undefined ? undefined : m.cpuPerRequest + m.dbCpuPerRequest)

export function growthTable(rows: Row[], sizes: GrowthSize[], kinds: readonly Kind[]): string {
  const out = [
    `| request | server | ${sizes.map((z) => `${z.rows.toLocaleString('en')} rows`).join(' | ')} |`,
    `|---|---|${sizes.map(() => '--:').join('|')}|`,
  ]
  for (const r of rows) {
    for (const kind of kinds) {
      const cells = sizes.map((z) => {
        const ms = z.series[r.key]?.[kind]
        if (!ms?.length) return 'n/a'
        const med = (f: (m: Measurement) => number | undefined) => median(finite(ms.map(f)))
        const db = med(pick.db)
        return `${med(pick.rps).toFixed(0)} req/s, p50 ${med(pick.p50).toFixed(2)} ms, CPU ${med(pick.cpu).toFixed(0)} µs, ` +
          `DB ${Number.isFinite(db) ? db.toFixed(0) : 'n/a'} µs${z.notes[r.key] ? ` ${z.notes[r.key]}` : ''}`
      })
      out.push(`| ${kind === 'service' ? r.label : ''} | ${LABEL[kind]} | ${cells.join(' | ')} |`)
    }
  }
  return out.join('\n')
}

// ---- targets -----------------------------------------------------------------

type Check = (ok: boolean | undefined, text: string) => void

function checker(out: string[]): Check {
  return (ok, text) => void out.push(`- ${ok === undefined ? 'n/a ' : ok ? 'PASS' : 'FAIL'} ${text}`)
}

const x = (v: number) => (Number.isFinite(v) ? `${v.toFixed(2)} ×` : 'n/a')
const within = (v: number, limit: number) => (Number.isFinite(v) ? v <= limit : undefined)

/** Per endpoint: CPU ≤ 0.9 × Fastify and ≤ 1.1 × bare; p99 ≤ Fastify; peak RSS ≤ Fastify. */
export function mainTargets(rows: Row[], series: Series, out: string[]): void {
  const check = checker(out)
  const targets: Array<[string, Kind, (m: Measurement) => number | undefined, number]> = [
    ['CPU per request ≤ 0.9 × Fastify', 'fastify', pick.cpu, 0.9],
    ['CPU per request ≤ 1.1 × bare', 'bare', pick.cpu, 1.1],
    ['p99 ≤ Fastify', 'fastify', pick.p99, 1],
    ['peak RSS ≤ Fastify', 'fastify', pick.rss, 1],
  ]
  for (const [text, peer, f, limit] of targets) {
    for (const r of rows) {
      const s = series[r.key]
      if (!s) continue
      const v = medianRatio(s, peer, f)
      check(within(v, limit), `${text}, ${r.label}: ${x(v)}`)
    }
  }
}

/** Per endpoint and number of connections: no failed request for the service; p99 ≤ 1.2 × Fastify. */
export function concurrencyTargets(rows: Row[], levels: number[], series: Series, out: string[]): void {
  const check = checker(out)
  for (const r of rows) {
    for (const c of levels) {
      const s = series[concurrencyKey(r.key, c)]
      if (!s?.service?.length) continue
      const own = s.service
      const n = own.reduce((k, m) => k + failed(m), 0)
      const detail = n ? ` (non-2xx ${own.reduce((k, m) => k + m.statusErrors, 0)}, socket ${own.reduce((k, m) => k + m.socketErrors, 0)}, time-outs ${own.reduce((k, m) => k + m.timeouts, 0)})` : ''
      check(n === 0, `0 failed requests, ${r.label} at ${c.toLocaleString('en')} connections: ${n.toLocaleString('en')}${detail}`)
      const v = medianRatio(s, 'fastify', pick.p99)
      const what = `p99 ≤ 1.2 × Fastify, ${r.label} at ${c.toLocaleString('en')} connections: ${x(v)}`
      // wrk's percentiles cover every answer: quick refusals would make a p99 that says nothing about the requests served.
      if (n) check(undefined, `${what}, over answers that include the failed requests: not comparable`)
      else check(within(v, 1.2), what)
    }
  }
}

/**
 * Growth: the service's cost per request (its CPU plus its PostgreSQL
 * backends') at the largest size within 1.2 × of the smallest; req/s when the
 * backends cannot be read.
 */
export function growthTargets(rows: Row[], sizes: GrowthSize[], out: string[]): void {
  const check = checker(out)
  if (sizes.length < 2) return
  const first = sizes[0]!
  const last = sizes[sizes.length - 1]!
  const span = `${first.rows.toLocaleString('en')} → ${last.rows.toLocaleString('en')} rows`
  for (const r of rows) {
    const a = first.series[r.key]?.service
    const b = last.series[r.key]?.service
    if (!a?.length || !b?.length) continue
    const cost = (ms: Measurement[]) => median(finite(ms.map(costPerRequest)))
    let v = cost(b) / cost(a)
    let what = 'CPU + DB CPU per request'
    if (!Number.isFinite(v)) {
      v = median(a.map(pick.rps)) / median(b.map(pick.rps))
      what = 'inverse of req/s'
    }
    check(within(v, 1.2), `flat within 1.2 × (${what}), ${r.label}, ${span}: ${x(v)}`)
  }
}

// ---- the database ceiling (bench/ceiling.ts) ----------------------------------

const byClients = (ms: CeilingMeasurement[], clients: number) => ms.filter((m) => m.clients === clients)

/** Each request at each client count: pgbench's throughput and what it cost the database, pgbench and the machine. */
export function ceilingTable(c: CeilingResults): string {
  const out = [
    '| request | clients | tx/s | latency ms | DB CPU µs/tx | of which publisher | cluster CPU µs/tx | WAL bytes/tx | pgbench CPU µs/tx | pgbench share of the machine | machine busy | failed |',
    '|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
  ]
  const pct = (xs: number[]) => cell(xs.map((x) => x * 100), 0) + ' %'
  for (const [key, all] of Object.entries(c.series)) {
    for (const [i, clients] of c.clients.entries()) {
      const ms = byClients(all, clients)
      if (!ms.length) continue
      out.push(`| ${i === 0 ? c.labels[key] : ''} | ${clients} | ${cell(ms.map((m) => m.tps), 0)} | ${cell(ms.map((m) => m.latencyMs), 2)} | ` +
        `${cell(ms.map((m) => m.dbCpuPerTx), 0)} | ${ms.some((m) => m.publisherCpuPerTx !== undefined) ? cell(ms.map((m) => m.publisherCpuPerTx), 0) : ''} | ` +
        `${cell(ms.map((m) => m.clusterCpuPerTx), 0)} | ${cell(ms.map((m) => m.walBytesPerTx), 0)} | ${cell(ms.map((m) => m.pgbenchCpuPerTx), 0)} | ${pct(ms.map((m) => m.pgbenchShare))} | ` +
        `${pct(ms.map((m) => m.machineBusy))} | ${ms.reduce((n, m) => n + m.failed, 0)} |`)
    }
  }
  return out.join('\n')
}

/**
 * Per request: the best median throughput over the client counts, the same
 * database CPU spread over every core on paper, and the service's own
 * figures for the request in the main series of the same run.
 */
export function ceilingAgainstService(c: CeilingResults, main: Series, cores: number): string {
  const out = [
    `| request | database ceiling, tx/s (clients) | DB CPU µs/tx | ${cores} cores for the database alone (paper), tx/s | service req/s | service CPU µs/req | service DB CPU µs/req | ceiling ÷ service | paper ÷ service |`,
    '|---|--:|--:|--:|--:|--:|--:|--:|--:|',
  ]
  for (const [key, all] of Object.entries(c.series)) {
    const levels = c.clients.map((clients) => ({ clients, ms: byClients(all, clients) })).filter((l) => l.ms.length)
    const best = levels.reduce((a, b) => (median(b.ms.map((m) => m.tps)) > median(a.ms.map((m) => m.tps)) ? b : a))
    const tps = median(best.ms.map((m) => m.tps))
    const db = median(finite(best.ms.map((m) => m.dbCpuPerTx)))
    const paper = Number.isFinite(db) && db > 0 ? (cores * 1e6) / db : NaN
    const service = main[key]?.service ?? []
    const rps = median(service.map(pick.rps))
    const f = (v: number, digits = 0) => (Number.isFinite(v) ? v.toLocaleString('en', { maximumFractionDigits: digits, minimumFractionDigits: digits }) : 'n/a')
    out.push(`| ${c.labels[key]} | ${f(tps)} (${best.clients}) | ${f(db)} | ${f(paper)} | ${service.length ? f(rps) : 'not measured'} | ` +
      `${f(median(service.map(pick.cpu)))} | ${f(median(finite(service.map(pick.db))))} | ${f(tps / rps, 1)} | ${f(paper / rps, 1)} |`)
  }
  return out.join('\n')
}
