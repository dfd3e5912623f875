import { monitorEventLoopDelay } from 'node:perf_hooks'

// Prometheus text exposition (format 0.0.4), hand-written: three families of
// request figures, query counts from postgres.js, and process figures. Labels
// are the route template, method and status, all from small fixed sets, so
// the number of series is bounded.

const BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]

interface Histogram {
  counts: number[]
  sum: number
  count: number
}

export class Metrics {
  private readonly requests = new Map<string, number>()
  private readonly durations = new Map<string, Histogram>()
  private readonly loopDelay = monitorEventLoopDelay({ resolution: 20 })
  queries = 0
  queryErrors = 0
  inFlight = 0
  /** Connections closed on arrival because MAX_CONNECTIONS were open. */
  connectionsDropped = 0
  /** The application's own counters (counter()), rendered after the rest. */
  private readonly counters = new Map<string, { help: string; value: number }>()

  constructor(private readonly pool: { max: number }) {
    this.loopDelay.enable()
  }

  /**
   * A counter of the application's (mail sent, say): one family without labels; the same name gives the same counter.
   */
  counter(name: string, help: string): { inc(): void; readonly value: number } {
    counterName(name)
    let entry = this.counters.get(name)
    if (!entry) this.counters.set(name, (entry = { help, value: 0 }))
    const counted = entry
    return {
      inc: () => void counted.value++,
      get value() {
        return counted.value
      },
    }
  }

  /**
   * A counter its owner keeps (the password hasher's derivations, say), read at each render: one family without labels.
   */
  counterOf(name: string, help: string, read: () => number): void {
    this.counters.set(counterName(name), {
      help,
      get value() {
        return read()
      },
    })
  }

  observe(method: string, route: string | null, status: number, seconds: number): void {
    const labels = `method="${method}",route="${escape(route ?? 'unmatched')}"`
    const key = `${labels},status="${status}"`
    this.requests.set(key, (this.requests.get(key) ?? 0) + 1)
    let h = this.durations.get(labels)
    if (!h) this.durations.set(labels, (h = { counts: BUCKETS.map(() => 0), sum: 0, count: 0 }))
    for (let i = 0; i < BUCKETS.length; i++) if (seconds <= BUCKETS[i]!) h.counts[i]!++
    h.sum += seconds
    h.count++
  }

  render(): string {
    const lines: string[] = []
    const family = (name: string, type: string, help: string) =>
      lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`)
    family('http_requests_total', 'counter', 'HTTP requests by method, route template and status.')
    for (const [labels, n] of this.requests) lines.push(`http_requests_total{${labels}} ${n}`)
    family('http_request_duration_seconds', 'histogram', 'Time from request to response, by method and route template.')
    for (const [labels, h] of this.durations) {
      BUCKETS.forEach((b, i) => lines.push(`http_request_duration_seconds_bucket{${labels},le="${b}"} ${h.counts[i]}`))
      lines.push(`http_request_duration_seconds_bucket{${labels},le="+Inf"} ${h.count}`)
      lines.push(
        `http_request_duration_seconds_sum{${labels}} ${h.sum}`,
        `http_request_duration_seconds_count{${labels}} ${h.count}`,
      )
    }
    family('http_requests_in_flight', 'gauge', 'Requests being handled now.')
    lines.push(`http_requests_in_flight ${this.inFlight}`)
    family(
      'http_connections_dropped_total',
      'counter',
      'Connections closed on arrival because MAX_CONNECTIONS were open.',
    )
    lines.push(`http_connections_dropped_total ${this.connectionsDropped}`)
    family('db_pool_max_connections', 'gauge', 'Size of the database connection pool.')
    lines.push(`db_pool_max_connections ${this.pool.max}`)
    family('db_queries_total', 'counter', 'Statements sent to the database.')
    lines.push(`db_queries_total ${this.queries}`)
    family('db_errors_total', 'counter', 'Requests that failed because of the database (503 database_unavailable).')
    lines.push(`db_errors_total ${this.queryErrors}`)
    for (const [name, { help, value }] of this.counters) {
      family(name, 'counter', help)
      lines.push(`${name} ${value}`)
    }
    const memory = process.memoryUsage()
    const cpu = process.cpuUsage()
    family('process_resident_memory_bytes', 'gauge', 'Resident set size.')
    lines.push(`process_resident_memory_bytes ${memory.rss}`)
    family('process_heap_used_bytes', 'gauge', 'V8 heap in use.')
    lines.push(`process_heap_used_bytes ${memory.heapUsed}`)
    family('process_cpu_seconds_total', 'counter', 'User and system CPU time.')
    lines.push(`process_cpu_seconds_total ${(cpu.user + cpu.system) / 1e6}`)
    family('process_uptime_seconds', 'gauge', 'Seconds since the process started.')
    lines.push(`process_uptime_seconds ${process.uptime()}`)
    family('nodejs_eventloop_delay_seconds', 'gauge', 'Event-loop delay since start: p50, p99 and max.')
    for (const [q, v] of [
      ['0.5', this.loopDelay.percentile(50)],
      ['0.99', this.loopDelay.percentile(99)],
      ['1', this.loopDelay.max],
    ] as const) {
      lines.push(`nodejs_eventloop_delay_seconds{quantile="${q}"} ${v / 1e9}`)
    }
    return lines.join('\n') + '\n'
  }
}

function counterName(name: string): string {
  if (!/^[a-z_][a-z0-9_]*_total$/.test(name))
    throw new Error(`counter "${name}": lower case, digits and _, ending in _total`)
  return name
}

const escape = (value: string) => value.replace(/[\\"\n]/g, (c) => (c === '\n' ? '\\n' : `\\${c}`))
