import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { allRoutes } from '../src/app.js'
import { mergeExpositions } from '../src/cluster/metrics.js'
import { Metrics } from '../src/core/metrics.js'
import { startServer, type TestResponse } from './helpers/server.js'
import { waitUntil } from './helpers/wait.js'
import { answerWith, startReceiver } from './helpers/webhook-receiver.js'

// GET /metrics: admin only, Prometheus text format 0.0.4. The whole output is
// parsed by the small parser below (which is strict: HELP and TYPE well formed
// and once per family, every sample's family declared by TYPE before it,
// families contiguous, no series twice), then checked for its meaning: request
// counts by route template (never a raw path), cumulative histogram buckets,
// the database query counter, process figures.
//
// Top-level tests run one after another (node:test's default).

const api = await startServer()

// ---------------------------------------------------------------------------
// A Prometheus text-format (0.0.4) parser

interface Sample {
  name: string
  family: string
  labels: Record<string, string>
  value: number
}

interface Exposition {
  types: Map<string, string>
  help: Map<string, string>
  samples: Sample[]
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"/y
const VALUE = /^(?:[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]Inf|NaN)$/
const TYPES = new Set(['counter', 'gauge', 'histogram', 'summary', 'untyped'])
const SUFFIXES: Record<string, string[]> = { histogram: ['_bucket', '_sum', '_count'], summary: ['_sum', '_count'] }

const unescapeLabel = (v: string) => v.replace(/\\(["\\n])/g, (_, c: string) => (c === 'n' ? '\n' : c))
const parseValue = (v: string) => (v === '+Inf' ? Infinity : v === '-Inf' ? -Infinity : Number(v))

function parseExposition(text: string): Exposition {
  assert.ok(text.endsWith('\n'), 'the output ends with a line feed')
  const types = new Map<string, string>()
  const help = new Map<string, string>()
  const samples: Sample[] = []
  const seenSeries = new Set<string>()
  const finished = new Set<string>()
  let current: string | undefined
  const enter = (family: string, where: string) => {
    if (family === current) return
    assert.ok(!finished.has(family), `${where}: family ${family} appears again after other families`)
    if (current) finished.add(current)
    current = family
  }

  text
    .slice(0, -1)
    .split('\n')
    .forEach((line, i) => {
      const where = `line ${i + 1} (${JSON.stringify(line)})`
      assert.notEqual(line, '', `${where}: no empty lines`)
      if (line.startsWith('#')) {
        const m = /^# (HELP|TYPE) (\S+) (.*)$/.exec(line)
        assert.ok(m, `${where}: a comment is # HELP or # TYPE`)
        const [, kind, name, rest] = m as unknown as [string, 'HELP' | 'TYPE', string, string]
        assert.match(name, METRIC_NAME, `${where}: metric name`)
        enter(name, where)
        if (kind === 'TYPE') {
          assert.ok(TYPES.has(rest), `${where}: known type`)
          assert.ok(!types.has(name), `${where}: one TYPE per family`)
          assert.ok(!samples.some((s) => s.family === name), `${where}: TYPE comes before the samples`)
          types.set(name, rest)
        } else {
          assert.ok(!help.has(name), `${where}: one HELP per family`)
          assert.ok(
            rest.length > 0 && /^(?:[^\\]|\\[\\n])*$/.test(rest),
            `${where}: HELP text with only \\\\ and \\n escapes`,
          )
          help.set(name, rest)
        }
        return
      }
      const nameMatch = /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(line)
      assert.ok(nameMatch, `${where}: a sample starts with a metric name`)
      const name = nameMatch[0]
      let at = name.length
      const labels: Record<string, string> = {}
      if (line[at] === '{') {
        at++
        while (line[at] !== '}') {
          LABEL.lastIndex = at
          const l = LABEL.exec(line)
          assert.ok(l, `${where}: a label name="value" at column ${at}`)
          assert.ok(!(l[1]! in labels), `${where}: label ${l[1]} once`)
          labels[l[1]!] = unescapeLabel(l[2]!)
          at = LABEL.lastIndex
          if (line[at] === ',') at++
          else assert.equal(line[at], '}', `${where}: labels end with }`)
        }
        at++
      }
      const rest = line.slice(at)
      const v = /^ (\S+)(?: (-?[0-9]+))?$/.exec(rest)
      assert.ok(v, `${where}: one space, then the value (and an optional timestamp)`)
      assert.match(v[1]!, VALUE, `${where}: a float value`)
      const family = types.has(name)
        ? name
        : [...types].find(([f, t]) => (SUFFIXES[t] ?? []).some((suffix) => name === f + suffix))?.[0]
      assert.ok(family, `${where}: the family of ${name} is declared by # TYPE`)
      enter(family, where)
      const series = `${name}${JSON.stringify(Object.entries(labels).sort())}`
      assert.ok(!seenSeries.has(series), `${where}: series appears once`)
      seenSeries.add(series)
      samples.push({ name, family, labels, value: parseValue(v[1]!) })
    })
  return { types, help, samples }
}

const find = (e: Exposition, name: string, labels: Record<string, string> = {}) =>
  e.samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))

/** The value of the one series with exactly these labels, or 0 when there is none yet (a counter not yet seen). */
function counter(e: Exposition, name: string, labels: Record<string, string>): number {
  const matching = e.samples.filter(
    (s) =>
      s.name === name &&
      JSON.stringify(Object.entries(s.labels).sort()) === JSON.stringify(Object.entries(labels).sort()),
  )
  assert.ok(matching.length <= 1)
  return matching[0]?.value ?? 0
}

function single(e: Exposition, name: string): number {
  const found = find(e, name)
  assert.equal(found.length, 1, `one ${name} sample`)
  return found[0]!.value
}

/** Checks every histogram: per label set, buckets ascending by le and cumulative, +Inf = _count, a _sum. */
function assertHistograms(e: Exposition): number {
  let checked = 0
  for (const [family, type] of e.types) {
    if (type !== 'histogram') continue
    const groups = new Map<string, Sample[]>()
    for (const s of e.samples.filter((x) => x.name === `${family}_bucket`)) {
      assert.ok('le' in s.labels, `${family}_bucket has le`)
      const { le: _le, ...rest } = s.labels
      const key = JSON.stringify(Object.entries(rest).sort())
      groups.set(key, [...(groups.get(key) ?? []), s])
    }
    for (const [key, buckets] of groups) {
      const labels = Object.fromEntries(JSON.parse(key) as Array<[string, string]>)
      const bounds = buckets.map((b) => parseValue(b.labels.le!))
      assert.deepEqual(
        bounds,
        [...bounds].sort((a, b) => a - b),
        `${family}${key}: buckets in ascending le`,
      )
      assert.equal(bounds.at(-1), Infinity, `${family}${key}: a +Inf bucket last`)
      for (let i = 1; i < buckets.length; i++) {
        assert.ok(
          buckets[i]!.value >= buckets[i - 1]!.value,
          `${family}${key}: cumulative at le=${buckets[i]!.labels.le}`,
        )
      }
      assert.equal(
        buckets.at(-1)!.value,
        counter(e, `${family}_count`, labels),
        `${family}${key}: +Inf bucket = _count`,
      )
      const sum = find(e, `${family}_sum`, labels)
      assert.equal(sum.length, 1, `${family}${key}: one _sum`)
      assert.ok(sum[0]!.value >= 0)
      checked++
    }
  }
  return checked
}

async function scrape(): Promise<{ res: TestResponse; e: Exposition }> {
  const res = await api.request('GET', '/metrics')
  assert.equal(res.status, 200, res.text)
  return { res, e: parseExposition(res.text) }
}

// ---------------------------------------------------------------------------
// The parser itself must refuse what it claims to check

describe('the test’s exposition parser', () => {
  const bad: Array<[name: string, text: string]> = [
    ['a sample without TYPE', 'foo 1\n'],
    ['a histogram suffix of an undeclared family', '# TYPE foo counter\nfoo_bucket{le="1"} 1\n'],
    ['TYPE after the samples', '# TYPE foo counter\nfoo 1\n# TYPE foo counter\n'],
    ['an unknown type', '# TYPE foo thing\nfoo 1\n'],
    ['an unquoted label value', '# TYPE foo counter\nfoo{a=b} 1\n'],
    ['a value that is not a number', '# TYPE foo counter\nfoo one\n'],
    ['a series twice', '# TYPE foo counter\nfoo{a="1"} 1\nfoo{a="1"} 2\n'],
    ['a family split in two', '# TYPE foo counter\n# TYPE bar gauge\nfoo 1\nbar 1\nfoo{a="2"} 1\n'],
    ['no final line feed', '# TYPE foo counter\nfoo 1'],
    ['a stray comment', '# TYPE foo counter\n# something\nfoo 1\n'],
    ['a HELP with an unknown escape', '# HELP foo a \\x b\n# TYPE foo counter\nfoo 1\n'],
  ]
  for (const [name, text] of bad) test(`refuses ${name}`, () => assert.throws(() => parseExposition(text)))

  test('accepts escapes and braces inside label values', () => {
    const e = parseExposition(
      '# HELP foo Some \\\\ help.\n# TYPE foo counter\nfoo{route="/users/{id}",q="a\\"b\\\\c\\nd"} 3\n',
    )
    assert.deepEqual(e.samples[0]!.labels, { route: '/users/{id}', q: 'a"b\\c\nd' })
    assert.equal(e.samples[0]!.value, 3)
  })
})

// ---------------------------------------------------------------------------
// Metrics on its own

describe('Metrics.render', () => {
  test('histogram buckets are cumulative, +Inf is the count, the sum adds up; counts by status', () => {
    const m = new Metrics({ max: 7 })
    const observations: Array<[seconds: number, status: number]> = [
      [0.003, 200],
      [0.003, 200],
      [0.3, 404],
      [0.75, 200],
      [20, 500],
    ]
    for (const [seconds, status] of observations) m.observe('GET', '/things/{id}', status, seconds)
    const e = parseExposition(m.render())
    const labels = { method: 'GET', route: '/things/{id}' }
    const bucket = (le: string) => counter(e, 'http_request_duration_seconds_bucket', { ...labels, le })
    assert.deepEqual(['0.005', '0.01', '0.25', '0.5', '1', '10', '+Inf'].map(bucket), [2, 2, 2, 3, 4, 4, 5])
    assert.equal(counter(e, 'http_request_duration_seconds_count', labels), 5)
    assert.ok(Math.abs(counter(e, 'http_request_duration_seconds_sum', labels) - 21.056) < 1e-9)
    assert.equal(counter(e, 'http_requests_total', { ...labels, status: '200' }), 3)
    assert.equal(counter(e, 'http_requests_total', { ...labels, status: '404' }), 1)
    assert.equal(counter(e, 'http_requests_total', { ...labels, status: '500' }), 1)
    assert.equal(single(e, 'db_pool_max_connections'), 7)
    assert.equal(assertHistograms(e), 1)
  })

  test('an unmatched request is one "unmatched" series; label values are escaped', () => {
    const m = new Metrics({ max: 1 })
    m.observe('GET', null, 404, 0.001)
    m.observe('GET', null, 404, 0.001)
    m.observe('POST', 'odd "route" \\ with\nbreak', 200, 0.001)
    const e = parseExposition(m.render())
    assert.equal(counter(e, 'http_requests_total', { method: 'GET', route: 'unmatched', status: '404' }), 2)
    assert.equal(
      counter(e, 'http_requests_total', { method: 'POST', route: 'odd "route" \\ with\nbreak', status: '200' }),
      1,
    )
  })
})

describe('mergeExpositions (WORKERS > 1, src/cluster/metrics.ts)', () => {
  test("two workers' figures are one valid exposition: each series labelled with its worker, each family once", () => {
    const parts = [1, 2].map((worker) => {
      const m = new Metrics({ max: 3 })
      for (let i = 0; i < worker; i++) m.observe('GET', '/things/{id}', 200, 0.003)
      m.observe('POST', 'odd "route" \\ with\nbreak', 201, 0.3)
      return { worker, text: m.render() }
    })
    const e = parseExposition(mergeExpositions(parts))
    for (const worker of ['1', '2']) {
      assert.equal(
        counter(e, 'http_requests_total', { worker, method: 'GET', route: '/things/{id}', status: '200' }),
        Number(worker),
      )
      assert.equal(
        counter(e, 'http_request_duration_seconds_bucket', {
          worker,
          method: 'GET',
          route: '/things/{id}',
          le: '+Inf',
        }),
        Number(worker),
      )
      assert.equal(
        counter(e, 'http_requests_total', {
          worker,
          method: 'POST',
          route: 'odd "route" \\ with\nbreak',
          status: '201',
        }),
        1,
      )
      assert.equal(counter(e, 'db_pool_max_connections', { worker }), 3)
    }
    assert.equal(assertHistograms(e), 4)
  })
})

// ---------------------------------------------------------------------------
// GET /metrics

describe('GET /metrics access', () => {
  test('anonymous: 401 unauthorized', async () => {
    const res = await api.request('GET', '/metrics', { auth: null })
    assert.equal(res.status, 401)
    assert.equal(res.body.code, 'unauthorized')
    assert.doesNotMatch(res.text, /http_requests_total/)
  })

  test("a user: 403 insufficient_scope (metrics:read is an admin's)", async () => {
    const user = await api.createUser()
    const res = await api.request('GET', '/metrics', { auth: user.token })
    assert.equal(res.status, 403)
    assert.equal(res.body.code, 'insufficient_scope')
    assert.doesNotMatch(res.text, /http_requests_total/)
  })

  test('an admin: 200, text/plain; version=0.0.4, not cacheable', async () => {
    const { res } = await scrape()
    assert.match(res.headers.get('content-type') ?? '', /^text\/plain; version=0\.0\.4(; charset=utf-8)?$/)
    assert.equal(res.headers.get('cache-control'), 'no-store')
    assert.equal(Number(res.headers.get('content-length')), Buffer.byteLength(res.text))
  })

  test('HEAD answers the headers without the body', async () => {
    const res = await api.request('HEAD', '/metrics')
    assert.equal(res.status, 200)
    assert.match(res.headers.get('content-type') ?? '', /^text\/plain; version=0\.0\.4/)
    assert.equal(res.text, '')
  })
})

describe('GET /metrics content', () => {
  test('requests are counted by method, route template and status; never by raw path', async () => {
    const user = await api.createUser()
    const before = (await scrape()).e
    const ok = { method: 'GET', route: '/users/{id}', status: '200' }
    const missing = { method: 'GET', route: '/users/{id}', status: '404' }
    const invalid = { method: 'POST', route: '/users', status: '422' }
    const unmatched = { method: 'GET', route: 'unmatched', status: '404' }
    for (let i = 0; i < 3; i++) assert.equal((await api.request('GET', `/users/${user.id}`)).status, 200)
    assert.equal((await api.request('GET', '/users/999999999')).status, 404)
    assert.equal((await api.request('POST', '/users', { body: {} })).status, 422)
    assert.equal((await api.request('GET', `/no/such/${user.id}`)).status, 404)

    const { e } = await scrape()
    assert.equal(counter(e, 'http_requests_total', ok) - counter(before, 'http_requests_total', ok), 3)
    assert.equal(counter(e, 'http_requests_total', missing) - counter(before, 'http_requests_total', missing), 1)
    assert.equal(counter(e, 'http_requests_total', invalid) - counter(before, 'http_requests_total', invalid), 1)
    assert.equal(counter(e, 'http_requests_total', unmatched) - counter(before, 'http_requests_total', unmatched), 1)

    const templates = new Set([
      ...allRoutes(api.deps.registry, api.deps.config.apiPrefix).map((r) => r.path),
      'unmatched',
    ])
    const routeLabels = e.samples
      .filter((s) => s.family.startsWith('http_request'))
      .map((s) => s.labels.route)
      .filter((r) => r !== undefined)
    assert.ok(routeLabels.length > 0)
    for (const route of routeLabels) assert.ok(templates.has(route!), `route label ${route} is a template`)
    assert.ok(
      !e.samples.some((s) => Object.values(s.labels).some((v) => v.includes(String(user.id)) && v.startsWith('/'))),
      'no raw path with an id',
    )
    for (const s of find(e, 'http_requests_total')) {
      assert.deepEqual(Object.keys(s.labels).sort(), ['method', 'route', 'status'])
      assert.match(s.labels.status!, /^[1-5][0-9]{2}$/)
      assert.ok(Number.isInteger(s.value) && s.value > 0)
    }
  })

  test('every family is declared with HELP and TYPE, with the documented types', async () => {
    const { e } = await scrape()
    const expected: Record<string, string> = {
      http_requests_total: 'counter',
      http_request_duration_seconds: 'histogram',
      http_requests_in_flight: 'gauge',
      db_pool_max_connections: 'gauge',
      db_queries_total: 'counter',
      password_hashes_total: 'counter',
      db_admission_refused_total: 'counter',
      db_admission_overdue_total: 'counter',
      mail_sent_total: 'counter',
      webhook_delivered_total: 'counter',
      webhook_retried_total: 'counter',
      webhook_failed_total: 'counter',
      process_resident_memory_bytes: 'gauge',
      process_cpu_seconds_total: 'counter',
      nodejs_eventloop_delay_seconds: 'gauge',
    }
    for (const [family, type] of Object.entries(expected))
      assert.equal(e.types.get(family), type, `# TYPE ${family} ${type}`)
    for (const family of e.types.keys()) assert.ok(e.help.has(family), `# HELP ${family}`)
    for (const [family, type] of e.types)
      if (type === 'counter') assert.match(family, /_total$/, `counter ${family} ends in _total`)
  })

  test(
    'request-duration histograms are cumulative with +Inf equal to _count, and count the requests ' + 'made',
    async () => {
      const path = `/users/${api.admin.id}`
      for (let i = 0; i < 4; i++) await api.request('GET', path)
      const { e } = await scrape()
      assert.ok(assertHistograms(e) >= 2, 'histograms for several routes')
      const labels = { method: 'GET', route: '/users/{id}' }
      assert.ok(counter(e, 'http_request_duration_seconds_count', labels) >= 4)
      const total = find(e, 'http_requests_total', labels).reduce((n, s) => n + s.value, 0)
      assert.equal(
        counter(e, 'http_request_duration_seconds_count', labels),
        total,
        'one observation per counted request',
      )
    },
  )

  test('db_queries_total grows with requests that read the database, and not with those that do not', async () => {
    const first = single((await scrape()).e, 'db_queries_total')
    assert.equal((await api.request('GET', `/users/${api.admin.id}`)).status, 200)
    assert.equal((await api.request('GET', '/products')).status, 200)
    const second = single((await scrape()).e, 'db_queries_total')
    assert.ok(second >= first + 2, `db_queries_total ${first} → ${second}`)
    for (let i = 0; i < 5; i++) await api.request('GET', '/healthz', { auth: null })
    const third = single((await scrape()).e, 'db_queries_total')
    assert.equal(third, second, '/healthz never touches the database')
  })

  test(
    "password_hashes_total counts one hash per login checked, an unknown account's too, and none for a login " +
      'refused before',
    async () => {
      const password = 'a password of the metrics test'
      const user = await api.createUser({ password })
      const hashes = async () => single((await scrape()).e, 'password_hashes_total')
      const before = await hashes()
      const login = (body: unknown) => api.request('POST', '/auth/login', { auth: null, body })
      assert.equal((await login({ email: user.email, password })).status, 200)
      assert.equal((await login({ email: `nobody-${user.email}`, password })).status, 401)
      assert.equal((await login({ email: user.email })).status, 422)
      assert.equal(await hashes(), before + 2)
    },
  )

  test('process and pool figures are present and plausible', async () => {
    const { e } = await scrape()
    assert.ok(single(e, 'process_resident_memory_bytes') > 1_000_000)
    assert.ok(single(e, 'process_cpu_seconds_total') > 0)
    assert.equal(single(e, 'db_pool_max_connections'), api.deps.config.poolMax)
    assert.ok(single(e, 'http_requests_in_flight') >= 1, 'the scrape itself is in flight')
    const delays = find(e, 'nodejs_eventloop_delay_seconds')
    assert.deepEqual(delays.map((s) => s.labels.quantile).sort(), ['0.5', '0.99', '1'])
    for (const s of delays) assert.ok(s.value >= 0 && s.value < 10, `event-loop delay ${s.labels.quantile}: ${s.value}`)
  })

  test('the request counter and in-flight gauge are back to rest after a burst', async () => {
    await Promise.all(Array.from({ length: 10 }, () => api.request('GET', '/products')))
    const { e } = await scrape()
    assert.equal(single(e, 'http_requests_in_flight'), 1, 'only the scrape itself')
  })
})

describe('the figures of database admission and the webhook worker', () => {
  test("db_admission_refused_total and db_admission_overdue_total are database admission's counts", async () => {
    // How admission counts is test/admission.test.ts's (a refusal takes its 2 s target); here, /metrics reads them.
    const admission = api.deps.databaseAdmission
    const before = (await scrape()).e
    admission.refused += 3
    admission.overdue += 1
    const { e } = await scrape()
    assert.equal(single(e, 'db_admission_refused_total') - single(before, 'db_admission_refused_total'), 3)
    assert.equal(single(e, 'db_admission_overdue_total') - single(before, 'db_admission_overdue_total'), 1)
    assert.equal(single(e, 'db_admission_refused_total'), admission.refused)
  })

  test('webhook_delivered_total, webhook_retried_total and webhook_failed_total count the attempts', async () => {
    const fast = { pollMs: 50, retryDelaysMs: [50], retryJitter: 0, timeoutMs: 1000, leaseMs: 3000 }
    const server = await startServer({ WEBHOOK_ALLOW_PRIVATE: 'true' }, {}, { tuning: { webhooks: fast } })
    const receiver = await startReceiver()
    const hook = await server.request('POST', '/webhooks', {
      body: { url: receiver.url, event_types: ['product.created'] },
    })
    assert.equal(hook.status, 201, hook.text)
    const figures = async () => {
      const res = await server.request('GET', '/metrics')
      assert.equal(res.status, 200)
      const e = parseExposition(res.text)
      return ['webhook_delivered_total', 'webhook_retried_total', 'webhook_failed_total'].map((n) => single(e, n))
    }
    assert.deepEqual(await figures(), [0, 0, 0])
    const product = (sku: string) =>
      server.request('POST', '/products', { body: { sku, name: sku, price: 100, currency: 'EUR' } })

    assert.equal((await product('metrics-1')).status, 201)
    await waitUntil('one delivery accepted', async () => (await figures())[0] === 1)
    // Refused twice: the first attempt is retried after 50 ms, the second is the last the schedule allows.
    receiver.answer = answerWith(500)
    assert.equal((await product('metrics-2')).status, 201)
    await waitUntil('a delivery retried, then given up on', async () => (await figures())[2] === 1)
    assert.deepEqual(await figures(), [1, 1, 1])
    assert.equal(receiver.received.length, 3)
  })
})
