import type { CeilingMeasurement, CeilingResults } from './ceiling.js'
import { ALL_KINDS, KINDS, type Kind } from './servers.js'

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
  /** wrk's mean latency, ms; absent in older figures. */
  mean?: number
  /** Busy share of the whole machine (every core) over the run, 0 to 1; absent in older figures. */
  machineBusy?: number
}

export const failed = (m: Measurement) => m.statusErrors + m.socketErrors + m.timeouts

/** Per endpoint key (or `key@connections`), per server, one measurement per round. */
export type Series = Record<string, Partial<Record<Kind, Measurement[]>>>

/** The servers' names in the report; `workers` is named with its count by the runner (`nameWorkers`). */
export const LABEL: Record<Kind, string> = {
  service: 'service',
  workers: 'service ×N workers',
  fastify: 'Fastify (equal work)',
  minimal: 'Fastify (minimal)',
  bare: 'bare',
}
export const nameWorkers = (n: number) => void (LABEL.workers = `service ×${n} workers`)

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

/** The service's figure (or `own`'s) ÷ the peer's, round by round (the same round: the same minute of the machine). */
export function ratios(
  s: Series[string],
  peer: Kind,
  pick: (m: Measurement) => number | undefined,
  ownKind: Kind = 'service',
): number[] {
  const own = s[ownKind] ?? []
  const other = s[peer] ?? []
  return finite(
    own.map((m, i) => {
      const a = pick(m)
      const b = other[i] === undefined ? undefined : pick(other[i]!)
      return a === undefined || b === undefined || !b ? undefined : a / b
    }),
  )
}

const medianRatio = (
  s: Series[string],
  peer: Kind,
  pick: (m: Measurement) => number | undefined,
  ownKind: Kind = 'service',
) => median(ratios(s, peer, pick, ownKind))

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
  /** The server's CPU plus its PostgreSQL backends'. */
  cost: (m: Measurement) => costPerRequest(m),
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
      out.push(
        `| ${kind === 'service' ? r.label : ''} ` +
          `| ${LABEL[kind]} | ${cell(ms.map(pick.rps), 0)} ` +
          `| ${cell(ms.map(pick.p50), 2)} | ${cell(ms.map(pick.p99), 2)} | ` +
          `${cell(ms.map(pick.cpu), 0)} ` +
          `| ${cell(ms.map(pick.db), 0)} | ${cell(ms.map(pick.rss), 0)} | ${ms.reduce((n, m) => n + failed(m), 0)} |`,
      )
    }
  }
  return out.join('\n')
}

/** Per endpoint and peer: the service's figure ÷ the peer's in the same round (median, min–max). */
export function ratioTable(rows: Row[], series: Series): string {
  const out = [
    '| endpoint | service ÷ | server CPU/req | server + PostgreSQL CPU/req | p99 | req/s | peak RSS |',
    '|---|---|--:|--:|--:|--:|--:|',
  ]
  for (const r of rows) {
    const s = series[r.key]
    if (!s) continue
    let first = true
    for (const peer of KINDS.filter((k) => k !== 'service' && s[k]?.length)) {
      const c = (f: (m: Measurement) => number | undefined) => cell(ratios(s, peer, f), 2)
      out.push(
        `| ${first ? r.label : ''} ` +
          `| ${LABEL[peer]} | ${c(pick.cpu)} | ${c(pick.cost)} | ${c(pick.p99)} | ${c(pick.rps)} | ${c(pick.rss)} |`,
      )
      first = false
    }
  }
  return out.join('\n')
}

/**
 * The targets against the minimal Fastify peer (issue 25), as the
 * service ÷ that peer with PASS or FAIL, one row per endpoint.
 */
export const MINIMAL_TARGETS: ReadonlyArray<[string, (m: Measurement) => number | undefined, number]> = [
  ['server CPU/req', pick.cpu, 0.9],
  ['server + PostgreSQL CPU/req', pick.cost, 1.0],
  ['p99', pick.p99, 1.0],
  ['peak RSS', pick.rss, 1.0],
]

/** The endpoints issue 25 sets those targets on; the other endpoints' ratios are shown without a mark. */
export const MINIMAL_TARGET_KEYS: readonly string[] = ['user', 'users-keyset', 'products-first', 'post-user']

export function minimalTable(rows: Row[], series: Series): string {
  const out = [
    `| endpoint | ${MINIMAL_TARGETS.map(([what, , limit]) => `${what} ≤ ${limit.toFixed(1)} ×`).join(' | ')} |`,
    `|---|${MINIMAL_TARGETS.map(() => '--:').join('|')}|`,
  ]
  for (const r of rows) {
    const s = series[r.key]
    if (!s?.minimal?.length) continue
    out.push(
      `| ${r.label} | ${MINIMAL_TARGETS.map(([, f, limit]) => {
        const v = medianRatio(s, 'minimal', f)
        const ok = MINIMAL_TARGET_KEYS.includes(r.key) ? within(v, limit) : undefined
        return `${x(v)} ${ok === undefined ? '' : ok ? 'PASS' : 'FAIL'}`.trim()
      }).join(' | ')} |`,
    )
  }
  return out.join('\n')
}

/** Per server, the highest peak RSS of the main series (every endpoint's medians), and the service's ÷ each peer's. */
export function peakRssLine(rows: Row[], series: Series): string {
  const peak = (kind: Kind) =>
    Math.max(...rows.map((r) => median(series[r.key]?.[kind]?.map(pick.rss) ?? [])).filter(Number.isFinite))
  const own = peak('service')
  const parts = KINDS.filter((k) => Number.isFinite(peak(k))).map(
    (k) => `${LABEL[k]} ${peak(k).toFixed(0)} MB${k === 'service' ? '' : ` (service ÷ it ${x(own / peak(k))})`}`,
  )
  return `Peak RSS, the highest endpoint median of the main series: ${parts.join(', ')}.`
}

/**
 * Issue 39: `operations` product creations in one POST /batch (`batchKey`)
 * against as many single POST /products (`singleKey`), per server. Sets of
 * `operations` creations per second: the batch's requests/s, the single
 * requests' ÷ `operations`; costs per creation. Latencies stay those of one
 * request as sent: `operations` × a single request's would not be the time
 * of that many requests (the sum of N latencies is not N × their p50 or p99,
 * and in a closed loop latency is connections ÷ throughput, which the
 * throughput column already says).
 */
export function batchTable(batchKey: string, singleKey: string, operations: number, series: Series): string {
  const n = operations
  const out = [
    `| server | ${n} creations as | sets of ${n}/s | creations/s | p50 ms of a request | p99 ms of a request ` +
      `| CPU µs/creation | DB CPU µs/creation | server + PostgreSQL µs/creation | errors |`,
    '|---|---|--:|--:|--:|--:|--:|--:|--:|--:|',
  ]
  const ratioRows: string[] = []
  for (const kind of KINDS) {
    const batch = series[batchKey]?.[kind] ?? []
    const single = series[singleKey]?.[kind] ?? []
    if (!batch.length && !single.length) continue
    const perCreation = (ms: Measurement[], f: (m: Measurement) => number | undefined, per: number) =>
      cell(
        ms.map((m) => {
          const v = f(m)
          return v === undefined ? undefined : v / per
        }),
        0,
      )
    const row = (what: string, ms: Measurement[], per: number, first: boolean) =>
      `| ${first ? LABEL[kind] : ''} | ${what} | ${cell(
        ms.map((m) => (m.rps * per) / n),
        1,
      )} | ${cell(
        ms.map((m) => m.rps * per),
        0,
      )} | ${cell(ms.map(pick.p50), 1)} | ${cell(ms.map(pick.p99), 1)} ` +
      `| ${perCreation(ms, pick.cpu, per)} | ${perCreation(ms, pick.db, per)} | ${perCreation(ms, pick.cost, per)} ` +
      `| ${ms.reduce((k, m) => k + failed(m), 0)} |`
    if (batch.length) out.push(row('one POST /batch', batch, n, true))
    if (single.length) out.push(row(`${n} × POST /products`, single, 1, !batch.length))
    if (batch.length && single.length) {
      const of = (ms: Measurement[], f: (m: Measurement) => number | undefined, per: number) =>
        median(finite(ms.map(f))) / per
      ratioRows.push(
        `| ${LABEL[kind]} | ${x(of(batch, pick.cpu, n) / of(single, pick.cpu, 1))} ` +
          `| ${x(of(batch, pick.cost, n) / of(single, pick.cost, 1))} ` +
          `| ${x((of(batch, pick.rps, 1) * n) / of(single, pick.rps, 1))} |`,
      )
    }
  }
  if (ratioRows.length)
    out.push(
      '',
      `One batch ÷ ${n} single requests, per creation (ratios of the medians above, measured in different cells):`,
      '',
      '| server | server CPU/creation | server + PostgreSQL CPU/creation | creations/s |',
      '|---|--:|--:|--:|',
      ...ratioRows,
    )
  return out.join('\n')
}

export const concurrencyKey = (key: string, connections: number) => `${key}@${connections}`

export function concurrencyTable(rows: Row[], levels: number[], series: Series): string {
  const out = [
    '| endpoint | connections | server | req/s | p50 ms | p99 ms | non-2xx | socket errors | time-outs | CPU µs/req ' +
      '| peak RSS MB |',
    '|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|',
  ]
  for (const r of rows) {
    for (const c of levels) {
      const s = series[concurrencyKey(r.key, c)]
      if (!s) continue
      for (const kind of ALL_KINDS) {
        const ms = s[kind]
        if (!ms?.length) continue
        const sum = (f: (m: Measurement) => number) => ms.reduce((n, m) => n + f(m), 0).toLocaleString('en')
        out.push(
          `| ${kind === 'service' ? r.label : ''} ` +
            `| ${kind === 'service' ? c.toLocaleString('en') : ''} | ${LABEL[kind]} | ` +
            `${cell(ms.map(pick.rps), 0)} | ${cell(ms.map(pick.p50), 2)} | ${cell(ms.map(pick.p99), 2)} | ` +
            `${sum((m) => m.statusErrors)} ` +
            `| ${sum((m) => m.socketErrors)} ` +
            `| ${sum((m) => m.timeouts)} | ${cell(ms.map(pick.cpu), 0)} | ${cell(ms.map(pick.rss), 0)} |`,
        )
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

/**
 * Per write: its figures with events written and discarded, and the ratio of the two costs (service + database CPU)
 * round by round.
 */
export function outboxTable(rows: Row[], series: Series): string {
  const out = [
    '| write | outbox | req/s | p99 ms | CPU µs/req | DB CPU µs/req | CPU + DB µs/req | on ÷ off |',
    '|---|---|--:|--:|--:|--:|--:|--:|',
  ]
  for (const r of rows) {
    const on = series[outboxKey(r.key, 'on')]?.service ?? []
    const off = series[outboxKey(r.key, 'off')]?.service ?? []
    for (const [mode, ms] of [
      ['on', on],
      ['off', off],
    ] as const) {
      out.push(
        `| ${mode === 'on' ? r.label : ''} ` +
          `| ${mode} | ${cell(ms.map(pick.rps), 0)} | ${cell(ms.map(pick.p99), 2)} | ${cell(ms.map(pick.cpu), 0)} | ` +
          `${cell(ms.map(pick.db), 0)} ` +
          `| ${cell(ms.map(costPerRequest), 0)} | ${mode === 'on' ? cell(outboxRatios(on, off), 2) : ''} |`,
      )
    }
  }
  return out.join('\n')
}

const outboxRatios = (on: Measurement[], off: Measurement[]) =>
  finite(
    on.map((m, i) => {
      const a = costPerRequest(m)
      const b = off[i] === undefined ? undefined : costPerRequest(off[i]!)
      return a === undefined || b === undefined || !b ? undefined : a / b
    }),
  )

/** The outbox adds at most 15 % to a write's CPU, the database's included. */
export function outboxTargets(rows: Row[], series: Series, out: string[]): void {
  const check = checker(out)
  for (const r of rows) {
    const v = median(
      outboxRatios(series[outboxKey(r.key, 'on')]?.service ?? [], series[outboxKey(r.key, 'off')]?.service ?? []),
    )
    check(within(v, 1.15), `the events outbox adds ≤ 15 % CPU (service + database) per write, ${r.label}: ${x(v)}`)
  }
}

const costPerRequest = (m: Measurement) =>
  m.dbCpuPerRequest === undefined ? undefined : m.cpuPerRequest + m.dbCpuPerRequest

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
        return (
          `${med(pick.rps).toFixed(0)} req/s, ` +
          `p50 ${med(pick.p50).toFixed(2)} ms, CPU ${med(pick.cpu).toFixed(0)} µs, ` +
          `DB ${Number.isFinite(db) ? db.toFixed(0) : 'n/a'} µs${z.notes[r.key] ? ` ${z.notes[r.key]}` : ''}`
        )
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

/**
 * Per endpoint of MINIMAL_TARGET_KEYS, against the minimal Fastify peer (issue 25): server CPU ≤ 0.9 ×,
 * server + PostgreSQL CPU ≤ 1.0 ×, p99 ≤ 1.0 ×, peak RSS ≤ 1.0 ×; against
 * the equal-work Fastify peer and the bare one: CPU ≤ 0.9 × and ≤ 1.1 ×,
 * p99 and peak RSS ≤ 1.0 × Fastify's.
 */
export function mainTargets(rows: Row[], series: Series, out: string[]): void {
  const check = checker(out)
  const targets: Array<[string, Kind, (m: Measurement) => number | undefined, number]> = [
    ...MINIMAL_TARGETS.map(([what, f, limit]): [string, Kind, (m: Measurement) => number | undefined, number] => [
      `${what} ≤ ${limit.toFixed(1)} × ${LABEL.minimal}`,
      'minimal',
      f,
      limit,
    ]),
    [`server CPU/req ≤ 0.9 × ${LABEL.fastify}`, 'fastify', pick.cpu, 0.9],
    ['server CPU/req ≤ 1.1 × bare', 'bare', pick.cpu, 1.1],
    [`p99 ≤ ${LABEL.fastify}`, 'fastify', pick.p99, 1],
    [`peak RSS ≤ ${LABEL.fastify}`, 'fastify', pick.rss, 1],
  ]
  for (const [text, peer, f, limit] of targets) {
    for (const r of rows) {
      const s = series[r.key]
      if (!s?.[peer]?.length || (peer === 'minimal' && !MINIMAL_TARGET_KEYS.includes(r.key))) continue
      const v = medianRatio(s, peer, f)
      check(within(v, limit), `${text}, ${r.label}: ${x(v)}`)
    }
  }
}

const failures = (ms: Measurement[]) => {
  const sum = (f: (m: Measurement) => number) => ms.reduce((k, m) => k + f(m), 0)
  const n = sum(failed)
  return {
    n,
    detail: n
      ? ` (non-2xx ${sum((m) => m.statusErrors)}, ` +
        `socket ${sum((m) => m.socketErrors)}, time-outs ${sum((m) => m.timeouts)})`
      : '',
  }
}

/**
 * Per endpoint and number of connections: no failed request for the service,
 * and its p99 ≤ 1.2 × the equal-work Fastify's. For the service with WORKERS
 * (when measured): no failed request and no time-out in each of at least
 * `workersRuns` consecutive runs at `workersConnections`, no failed request
 * at the other counts, and its p99 ≤ 1.2 × the minimal Fastify's (the
 * equal-work one's beside it).
 */
export function concurrencyTargets(
  rows: Row[],
  levels: number[],
  series: Series,
  out: string[],
  workers?: { runs: number; connections: number },
): void {
  const check = checker(out)
  for (const [own, peer, also] of [
    ['service', 'fastify', undefined],
    ['workers', 'minimal', 'fastify'],
  ] as Array<[Kind, Kind, Kind | undefined]>) {
    for (const r of rows) {
      for (const c of levels) {
        const s = series[concurrencyKey(r.key, c)]
        const ms = s?.[own]
        if (!s || !ms?.length) continue
        const where = `${LABEL[own]}, ${r.label} at ${c.toLocaleString('en')} connections`
        const { n, detail } = failures(ms)
        if (own === 'workers' && workers && c === workers.connections) {
          const perRun = ms.map((m) => failed(m).toLocaleString('en')).join(', ')
          check(
            ms.length >= workers.runs && n === 0,
            `0 failed requests and 0 time-outs ` +
              `in ${workers.runs} consecutive runs, ${where}: ${ms.length} run(s), failed ${perRun}${detail}`,
          )
        } else {
          check(n === 0, `0 failed requests, ${where}: ${n.toLocaleString('en')}${detail}`)
        }
        const v = medianRatio(s, peer, pick.p99, own)
        const beside = also && s[also]?.length ? ` (÷ ${LABEL[also]}: ${x(medianRatio(s, also, pick.p99, own))})` : ''
        const what = `p99 ≤ 1.2 × ${LABEL[peer]}, ${where}: ${x(v)}${beside}`
        // wrk's percentiles cover every answer: quick refusals would
        // make a p99 that says nothing about the requests served.
        if (n) check(undefined, `${what}, over answers that include the failed requests: not comparable`)
        else check(within(v, 1.2), what)
      }
    }
  }
}

// ---- WORKERS: throughput of N workers against one -------------------------------

/**
 * When the database is not the limit: the database ceiling (bench/ceiling.ts:
 * pgbench running the request's statements on the same machine) is at least
 * CEILING_MARGIN × the workers' req/s; when the ceiling was not measured, the
 * backends of the server measured used under DB_SHARE_LIMIT of the machine's
 * cores. Reads by id are answered from shared buffers and each worker has a
 * pool of its own, so the database can limit them only by its CPU.
 */
export const DB_SHARE_LIMIT = 1 / 3
export const CEILING_MARGIN = 2

/** The cores a measurement's server (its process tree) and its PostgreSQL backends kept busy on average. */
const coresOf = (m: Measurement) => ({
  server: (m.cpuPerRequest * m.rps) / 1e6,
  db: m.dbCpuPerRequest === undefined ? NaN : (m.dbCpuPerRequest * m.rps) / 1e6,
})

export interface WorkersVerdict {
  key: string
  connections: number
  ratio: number
  dbShare: number
  ceilingRatio: number
  dbNotLimit: boolean | undefined
  /** The machine's busy share with one process and with N workers. */
  busy: [number, number]
}

/**
 * Per endpoint and connection count measured with both: req/s of one
 * process and of N workers, their ratio round by round, and what shows
 * whether the database was the limit: the cores the server and its backends
 * used (CPU µs/req × req/s), the backends' share of the machine, the
 * machine's busy share, and the database ceiling's tx/s ÷ the workers' req/s.
 */
export function workersTable(
  rows: Row[],
  levels: number[],
  series: Series,
  cores: number,
  ceilingTps: Record<string, number>,
): { text: string; verdicts: WorkersVerdict[] } {
  const out = [
    `| endpoint | connections | req/s, service | ` +
      `req/s, ${LABEL.workers} | ×N ÷ ×1 | server cores ×1 / ×N | PostgreSQL cores ×1 / ×N | PostgreSQL share ` +
      `of ${cores} cores (×N) | machine busy ×1 / ×N | DB ceiling ÷ ×N req/s | database not the limit |`,
    '|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|',
  ]
  const verdicts: WorkersVerdict[] = []
  const f = (v: number, digits: number) =>
    Number.isFinite(v)
      ? v.toLocaleString('en', { minimumFractionDigits: digits, maximumFractionDigits: digits })
      : 'n/a'
  for (const r of rows) {
    for (const c of levels) {
      const s = series[concurrencyKey(r.key, c)]
      const one = s?.service ?? []
      const many = s?.workers ?? []
      if (!one.length || !many.length) continue
      const med = (ms: Measurement[], g: (m: Measurement) => number | undefined) => median(finite(ms.map(g)))
      const ratio = medianRatio(s!, 'service', pick.rps, 'workers')
      const dbShare = med(many, (m) => coresOf(m).db) / cores
      const ceiling = ceilingTps[r.key]
      const ceilingRatio = ceiling === undefined ? NaN : ceiling / med(many, pick.rps)
      const dbNotLimit = Number.isFinite(ceilingRatio)
        ? ceilingRatio >= CEILING_MARGIN
        : Number.isFinite(dbShare)
          ? dbShare < DB_SHARE_LIMIT
          : undefined
      const busy: [number, number] = [med(one, (m) => m.machineBusy), med(many, (m) => m.machineBusy)]
      verdicts.push({ key: r.key, connections: c, ratio, dbShare, ceilingRatio, dbNotLimit, busy })
      const pct = (v: number) => (Number.isFinite(v) ? `${(v * 100).toFixed(0)} %` : 'n/a')
      out.push(
        `| ${r.label} | ${c.toLocaleString('en')} ` +
          `| ${f(med(one, pick.rps), 0)} ` +
          `| ${f(med(many, pick.rps), 0)} | ${cell(ratios(s!, 'service', pick.rps, 'workers'), 2)} | ` +
          `${f(
            med(one, (m) => coresOf(m).server),
            2,
          )} / ${f(
            med(many, (m) => coresOf(m).server),
            2,
          )} | ${f(
            med(one, (m) => coresOf(m).db),
            2,
          )} / ${f(
            med(many, (m) => coresOf(m).db),
            2,
          )} | ` +
          `${pct(dbShare)} | ${pct(med(one, (m) => m.machineBusy))} ` +
          `/ ${pct(med(many, (m) => m.machineBusy))} ` +
          `| ${ceiling === undefined ? 'not measured' : f(ceilingRatio, 1)} | ` +
          `${dbNotLimit === undefined ? 'n/a' : dbNotLimit ? 'yes' : 'no'} |`,
      )
    }
  }
  return { text: out.join('\n'), verdicts }
}

/** Reads by id: N workers serve ≥ 1.5 × one process's req/s, where the database is not the limit (n/a where it is). */
export function workersTargets(
  verdicts: WorkersVerdict[],
  labels: Record<string, string>,
  readsById: readonly string[],
  out: string[],
): void {
  const check = checker(out)
  for (const v of verdicts.filter((w) => readsById.includes(w.key))) {
    const what =
      `${LABEL.workers} ≥ 1.5 × the req/s of ` +
      `one, ${labels[v.key]} at ${v.connections.toLocaleString('en')} connections: ${x(v.ratio)}`
    const pct = (f: number) => (Number.isFinite(f) ? `${(f * 100).toFixed(0)} %` : 'n/a')
    const db =
      `PostgreSQL ${pct(v.dbShare)} of the machine` +
      (Number.isFinite(v.ceilingRatio) ? `, its ceiling ${v.ceilingRatio.toFixed(1)} × the workers' req/s` : '') +
      `; machine busy ${pct(v.busy[0])} with one process, ${pct(v.busy[1])} with the workers`
    if (v.dbNotLimit === false) check(undefined, `${what}: the database may be the limit (${db})`)
    else check(Number.isFinite(v.ratio) ? v.ratio >= 1.5 : undefined, `${what} (${db})`)
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
    '| request | clients | tx/s | latency ms | DB CPU µs/tx | of which publisher | cluster CPU µs/tx | WAL bytes/tx ' +
      '| pgbench CPU µs/tx | pgbench share of the machine | machine busy | failed |',
    '|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
  ]
  const pct = (xs: number[]) =>
    cell(
      xs.map((x) => x * 100),
      0,
    ) + ' %'
  for (const [key, all] of Object.entries(c.series)) {
    for (const [i, clients] of c.clients.entries()) {
      const ms = byClients(all, clients)
      if (!ms.length) continue
      out.push(
        `| ${i === 0 ? c.labels[key] : ''} | ${clients} | ${cell(
          ms.map((m) => m.tps),
          0,
        )} | ${cell(
          ms.map((m) => m.latencyMs),
          2,
        )} | ` +
          `${cell(
            ms.map((m) => m.dbCpuPerTx),
            0,
          )} | ${
            ms.some((m) => m.publisherCpuPerTx !== undefined)
              ? cell(
                  ms.map((m) => m.publisherCpuPerTx),
                  0,
                )
              : ''
          } | ` +
          `${cell(
            ms.map((m) => m.clusterCpuPerTx),
            0,
          )} | ${cell(
            ms.map((m) => m.walBytesPerTx),
            0,
          )} | ${cell(
            ms.map((m) => m.pgbenchCpuPerTx),
            0,
          )} | ${pct(ms.map((m) => m.pgbenchShare))} | ` +
          `${pct(ms.map((m) => m.machineBusy))} | ${ms.reduce((n, m) => n + m.failed, 0)} |`,
      )
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
    `| request | database ceiling, tx/s (clients) | DB CPU µs/tx ` +
      `| ${cores} cores for the database alone (paper), tx/s | service req/s | service CPU µs/req | service DB CPU ` +
      `µs/req | ceiling ÷ service | paper ÷ service |`,
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
    const f = (v: number, digits = 0) =>
      Number.isFinite(v)
        ? v.toLocaleString('en', { maximumFractionDigits: digits, minimumFractionDigits: digits })
        : 'n/a'
    out.push(
      `| ${c.labels[key]} | ${f(tps)} ` +
        `(${best.clients}) | ${f(db)} | ${f(paper)} | ${service.length ? f(rps) : 'not measured'} | ` +
        `${f(median(service.map(pick.cpu)))} ` +
        `| ${f(median(finite(service.map(pick.db))))} | ${f(tps / rps, 1)} | ${f(paper / rps, 1)} |`,
    )
  }
  return out.join('\n')
}

/** Per request key, the database ceiling's best median tx/s over the client counts. */
export function ceilingBest(c: CeilingResults | undefined): Record<string, number> {
  if (!c) return {}
  return Object.fromEntries(
    Object.entries(c.series).map(([key, all]) => [
      key,
      Math.max(
        ...c.clients.map((clients) => median(byClients(all, clients).map((m) => m.tps))).filter(Number.isFinite),
      ),
    ]),
  )
}
