import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { parse, stringify } from 'yaml'
import { freePort } from './helpers/ports.js'
import { installedProgram } from './helpers/programs.js'
import { startPrometheus } from './helpers/prometheus.js'
import { startServer } from './helpers/server.js'

// The alert rules (deploy/prometheus/alerts.yml) and the Grafana dashboard
// (deploy/grafana/dashboard.json) against the real tools and the real figures:
// Debian's promtool checks the rules and runs their unit tests
// (alerts.test.yml); Debian's Prometheus, run with the shipped scrape
// configuration, scrapes a running service with a metrics:read key and
// evaluates the rules, and every metric name a rule or a panel reads must be
// one it scraped, every panel's query one it answers.

const root = fileURLToPath(new URL('..', import.meta.url))
const file = (path: string) => readFileSync(join(root, path), 'utf8')
const JOB = 'users-products-api'

interface Rule {
  alert: string
  expr: string
  for?: string
  labels?: Record<string, string>
  annotations?: Record<string, string>
}
const rules = (
  parse(file('deploy/prometheus/alerts.yml')) as { groups: Array<{ name: string; rules: Rule[] }> }
).groups.flatMap((g) => g.rules)

interface Target {
  expr: string
  refId: string
  datasource?: { type?: string; uid?: string }
}
interface Panel {
  id: number
  type: string
  title: string
  datasource?: { type?: string; uid?: string }
  gridPos: { x: number; y: number; w: number; h: number }
  targets?: Target[]
}
interface Variable {
  name: string
  type: string
  query: string | { query: string }
  datasource?: { type?: string; uid?: string }
}
const dashboard = JSON.parse(file('deploy/grafana/dashboard.json')) as {
  uid: string
  title: string
  schemaVersion: number
  panels: Panel[]
  templating: { list: Variable[] }
}
const queryPanels = dashboard.panels.filter((p) => p.type !== 'row')
/** Each variable's query of the data source, its `label_values(selector, label)` as the selector alone. */
const variableQueries = dashboard.templating.list.flatMap((v) =>
  v.type === 'query'
    ? [(typeof v.query === 'string' ? v.query : v.query.query).replace(/^label_values\((.*),\s*\w+\)$/, '$1')]
    : [],
)

// ---------------------------------------------------------------------------
// The metric names of a PromQL expression

const KEYWORDS = new Set(['and', 'or', 'unless', 'bool', 'offset', 'by', 'without', 'on', 'ignoring', 'inf', 'nan'])

/**
 * The metric names an expression reads, conservatively: what is left of it once strings, label matchers `{…}`, ranges
 * `[…]` and the label lists of `by`, `without`, `on`, `ignoring`, `group_left` and `group_right` are taken out, and
 * neither a function (a name before `(`), a keyword, a number's part (`1e3`, `5m`) nor a Grafana variable (`$job`).
 */
function metricNames(expr: string): string[] {
  const bare = expr
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`/g, '""')
    .replace(/\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ')
    .replace(/\{[^}]*\}/g, '{}')
    .replace(/\[[^\]]*\]/g, '[]')
  const names = [...bare.matchAll(/(?<![\w$.:])[a-zA-Z_:][\w:]*(?![\w:])(?!\s*\()/g)].map((m) => m[0])
  return [...new Set(names.filter((n) => !KEYWORDS.has(n.toLowerCase())))]
}

test('metricNames finds the metric names of an expression and nothing else', () => {
  const cases: Array<[string, string[]]> = [
    ['up{job="users-products-api"} == 0 or absent(up{job="x"})', ['up']],
    [
      'histogram_quantile(0.99, sum by (job, le) (rate(http_request_duration_seconds_bucket{route!~".*/a{b}"}[5m])))',
      ['http_request_duration_seconds_bucket'],
    ],
    ['sum(rate(a_total[5m])) by (job) / on (job) group_left (instance) b offset 5m > bool 1e3', ['a_total', 'b']],
    ['increase(x_total[$__rate_interval]) unless increase(y_total{job="$job"}[10m]) > 0', ['x_total', 'y_total']],
    ['process_uptime_seconds', ['process_uptime_seconds']],
    ['sum without (worker) (rate(c_total{status=~"5.."}[1m])) * 60', ['c_total']],
    ['label_replace(d, "to", "$1", "from", "(.*)")', ['d']],
  ]
  for (const [expr, names] of cases) assert.deepEqual(metricNames(expr), names, expr)
})

// ---------------------------------------------------------------------------
// The files on their own

/** GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens. */
const anchorOf = (heading: string) =>
  heading
    .toLowerCase()
    .replace(/[^\p{L}\p{N} _-]/gu, '')
    .replace(/ /g, '-')

describe('the alert rules and the dashboard', () => {
  test('every alert waits its for:, has a severity, says what to do, and points to its heading in the docs', () => {
    const anchors = new Set(
      [...file('docs/operations.md').matchAll(/^#+ (.*)$/gm)].map((m) => `docs/operations.md#${anchorOf(m[1]!)}`),
    )
    assert.ok(rules.length >= 10, `${rules.length} rules`)
    assert.equal(new Set(rules.map((r) => r.alert)).size, rules.length, 'one rule per alert name')
    for (const rule of rules) {
      assert.match(rule.for ?? '', /^[1-9][0-9]*[mh]$/, `${rule.alert}: for`)
      assert.match(rule.labels?.severity ?? '', /^(critical|warning|info)$/, `${rule.alert}: severity`)
      assert.ok(rule.annotations?.summary && rule.annotations.description, `${rule.alert}: summary and description`)
      assert.ok(anchors.has(rule.annotations.runbook_url ?? ''), `${rule.alert}: ${rule.annotations.runbook_url}`)
      assert.ok(
        metricNames(rule.expr).every((name) => rule.expr.includes(`${name}{job="${JOB}"`)),
        `${rule.alert}: every selector names job="${JOB}"`,
      )
    }
  })

  test('the dashboard is a Grafana dashboard whose every panel queries the data source its variable names', () => {
    assert.equal(dashboard.uid, JOB)
    assert.ok(dashboard.title && dashboard.schemaVersion >= 36)
    const source = dashboard.templating.list.find((v) => v.type === 'datasource')
    assert.deepEqual([source?.name, source?.query], ['datasource', 'prometheus'])
    const uses = { type: 'prometheus', uid: '${datasource}' }
    for (const v of dashboard.templating.list.filter((v) => v.type === 'query')) assert.deepEqual(v.datasource, uses)
    assert.equal(new Set(dashboard.panels.map((p) => p.id)).size, dashboard.panels.length, 'panel ids are unique')
    assert.ok(queryPanels.length >= 12, `${queryPanels.length} panels`)
    for (const panel of queryPanels) {
      assert.deepEqual(panel.datasource, uses, `${panel.title}: datasource`)
      assert.ok(panel.targets?.length, `${panel.title}: targets`)
      for (const target of panel.targets!) {
        assert.deepEqual(target.datasource, uses, `${panel.title} ${target.refId}: datasource`)
        assert.ok(metricNames(target.expr).length > 0, `${panel.title} ${target.refId}: reads a metric`)
      }
      const { x, w, h } = panel.gridPos
      assert.ok(x >= 0 && w > 0 && h > 0 && x + w <= 24, `${panel.title}: within the 24 columns`)
    }
  })
})

// ---------------------------------------------------------------------------
// promtool

describe('promtool (Debian package prometheus)', () => {
  const promtool = installedProgram('promtool', 'prometheus')
  const run = (...args: string[]) => {
    const result = spawnSync(promtool, args, { cwd: root, encoding: 'utf8', timeout: 30_000 })
    assert.equal(result.status, 0, `promtool ${args.join(' ')}:\n${result.stdout}${result.stderr}`)
    return result.stdout
  }

  test('check rules: the rules are valid', () => {
    assert.match(run('check', 'rules', 'deploy/prometheus/alerts.yml'), new RegExp(`SUCCESS: ${rules.length} rules`))
  })

  test('test rules: every alert fires when its condition has lasted, and not otherwise', () => {
    const { tests } = parse(file('deploy/prometheus/alerts.test.yml')) as {
      tests: Array<{ alert_rule_test: Array<{ alertname: string; exp_alerts?: unknown[] }> }>
    }
    const cases = tests.flatMap((t) => t.alert_rule_test)
    for (const rule of rules) {
      const of = cases.filter((c) => c.alertname === rule.alert)
      assert.ok(
        of.some((c) => c.exp_alerts?.length),
        `a test where ${rule.alert} fires`,
      )
      assert.ok(
        of.some((c) => !c.exp_alerts?.length),
        `a test where ${rule.alert} does not`,
      )
    }
    assert.match(run('test', 'rules', 'deploy/prometheus/alerts.test.yml'), /SUCCESS/)
  })

  test('check config: the example scrape configuration is valid', () => {
    run('check', 'config', '--syntax-only', 'deploy/prometheus/prometheus.yml')
  })
})

// ---------------------------------------------------------------------------
// Prometheus against a running service

interface ScrapeConfig {
  job_name: string
  metrics_path: string
  authorization: { type: string; credentials_file: string }
  static_configs: Array<{ targets: string[] }>
}

/** The shipped prometheus.yml with the test's target, key file and rules, and intervals of a second. */
function testConfig(dir: string, target: string): string {
  const shipped = parse(file('deploy/prometheus/prometheus.yml')) as {
    global: Record<string, string>
    rule_files: string[]
    scrape_configs: ScrapeConfig[]
  }
  assert.deepEqual(shipped.rule_files, ['alerts.yml'])
  assert.equal(shipped.scrape_configs.length, 1)
  const scrape = shipped.scrape_configs[0]!
  assert.equal(scrape.job_name, JOB)
  assert.equal(scrape.metrics_path, '/metrics')
  assert.equal(scrape.authorization.type, 'Bearer')
  scrape.authorization.credentials_file = join(dir, 'metrics.key')
  scrape.static_configs = [{ targets: [target] }]
  shipped.global = { scrape_interval: '1s', evaluation_interval: '1s' }
  shipped.rule_files = [join(root, 'deploy/prometheus/alerts.yml')]
  return stringify(shipped)
}

interface Sample {
  metric: Record<string, string>
  value: [number, string]
}

describe('Prometheus (Debian package prometheus) scraping a running service', () => {
  test(
    'scrapes /metrics with a metrics:read key, evaluates every rule, and holds every metric that the rules and the ' +
      'panels read',
    async () => {
      // With OIDC_ISSUER, the identity provider's figures exist (its keys' first fetch fails: nothing listens there).
      const issuer = `https://127.0.0.1:${await freePort()}`
      const api = await startServer({ OIDC_ISSUER: issuer, OIDC_AUDIENCE: 'https://api.example.test' })
      const login = await api.loginJwtFor(api.admin.id, 'admin')
      const created = await api.request('POST', '/api-keys', {
        auth: login,
        body: { name: 'prometheus', scopes: ['metrics:read'] },
      })
      assert.equal(created.status, 201, created.text)
      const body = { sku: 'alerts-1', name: 'A product', price: 100, currency: 'EUR' }
      assert.equal((await api.request('POST', '/products', { body })).status, 201)
      assert.equal((await api.request('GET', '/products')).status, 200)
      assert.equal((await api.request('GET', '/no/such/thing')).status, 404)

      const prometheus = await startPrometheus({
        files: { 'metrics.key': `${created.body.key}\n` },
        config: (dir) => testConfig(dir, new URL(api.url).host),
      })
      const query = (expr: string) => prometheus.api<{ result: Sample[] }>('/api/v1/query', { query: expr })

      // A scrape has worked: up is 1 (else the target's error says why).
      for (const deadline = Date.now() + 15_000; ; await sleep(100)) {
        const [up] = (await query(`up{job="${JOB}"}`)).result
        if (up?.value[1] === '1') break
        if (Date.now() > deadline) {
          const targets = await prometheus.api<{ activeTargets: Array<{ lastError: string }> }>('/api/v1/targets')
          assert.fail(`no successful scrape: ${JSON.stringify(targets.activeTargets)}\n${prometheus.log()}`)
        }
      }
      // Every rule evaluated (with what was scraped) without an error.
      type Rules = { groups: Array<{ rules: Array<{ name: string; health: string; lastError?: string }> }> }
      for (const deadline = Date.now() + 10_000; ; await sleep(100)) {
        const loaded = (await prometheus.api<Rules>('/api/v1/rules')).groups.flatMap((g) => g.rules)
        assert.deepEqual(loaded.map((r) => r.name).sort(), rules.map((r) => r.alert).sort())
        assert.deepEqual(
          loaded.filter((r) => r.health === 'err'),
          [],
          'rules evaluated without an error',
        )
        if (loaded.every((r) => r.health === 'ok')) break
        assert.ok(Date.now() < deadline, `rules not all evaluated: ${JSON.stringify(loaded)}`)
      }

      const scraped = new Set(await prometheus.api<string[]>('/api/v1/label/__name__/values'))
      const missing = (exprs: string[]) => exprs.flatMap((e) => metricNames(e).filter((name) => !scraped.has(name)))
      const panelExprs = queryPanels.flatMap((p) => p.targets!.map((t) => t.expr))
      assert.deepEqual(
        { alerts: missing(rules.map((r) => r.expr)), dashboard: missing([...panelExprs, ...variableQueries]) },
        { alerts: [], dashboard: [] },
        'metric names that alerts.yml and dashboard.json read, and Prometheus did not scrape',
      )

      // Each panel's query, its variables given values as Grafana would, is one Prometheus answers.
      const asGrafana = (expr: string) =>
        expr
          .replaceAll('$__rate_interval', '1m')
          .replaceAll('$__range', '1h')
          .replaceAll('$job', JOB)
          .replaceAll('$instance', '.*')
      for (const expr of [...panelExprs, ...variableQueries]) await query(asGrafana(expr))
      // And it saw the requests made above, by route template.
      const routes = (await query(`sum by (route) (http_requests_total{job="${JOB}"})`)).result
      for (const route of ['/products', '/api-keys', 'unmatched'])
        assert.ok(
          routes.some((s) => s.metric.route === route),
          `${route} in ${JSON.stringify(routes.map((s) => s.metric))}`,
        )

      await prometheus.stop()
      assert.ok(!existsSync(prometheus.dir), 'its folder is gone')
    },
  )
})
