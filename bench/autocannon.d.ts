// The part of autocannon's programmatic API the benchmark uses (the package
// ships no types, and @types/autocannon would be one more dependency).
declare module 'autocannon' {
  interface Request {
    method?: string
    path?: string
    headers?: Record<string, string>
    body?: string | Buffer
    setupRequest?: (request: Request & { path: string }, context: Record<string, unknown>) => Request | undefined
  }
  interface Options {
    url: string
    connections?: number
    duration?: number
    pipelining?: number
    timeout?: number
    method?: string
    headers?: Record<string, string>
    body?: string
    requests?: Request[]
    idReplacement?: boolean
  }
  interface Histogram {
    average: number
    mean: number
    stddev: number
    min: number
    max: number
    total: number
    p50: number
    p90: number
    p97_5: number
    p99: number
  }
  interface Result {
    requests: Histogram
    latency: Histogram
    throughput: Histogram
    duration: number
    errors: number
    timeouts: number
    non2xx: number
    '1xx': number
    '2xx': number
    '3xx': number
    '4xx': number
    '5xx': number
    statusCodeStats: Record<string, { count: number }>
  }
  /** A running benchmark: an EventEmitter that is also a promise of its result. */
  interface Instance extends PromiseLike<Result> {
    on(event: 'response', listener: (client: unknown, statusCode: number, resBytes: number, responseTime: number) => void): this
    stop(): void
  }
  function autocannon(options: Options): Instance
  export default autocannon
}
