import assert from 'node:assert/strict'
import { existsSync, readFileSync } from 'node:fs'
import { test } from 'node:test'
import { parse } from 'yaml'
import { loadConfig } from '../src/config.js'

// No container engine runs here (docs/deployment.md), so compose.yaml is
// checked for what can go wrong without one: that its parts agree with each
// other, with deploy/nginx.conf and with the service's own configuration
// check, and that it holds no secret.

const root = new URL('../', import.meta.url)
const compose = parse(readFileSync(new URL('compose.yaml', root), 'utf8'))
const nginxConf = readFileSync(new URL('deploy/nginx.conf', root), 'utf8')
const envExample = readFileSync(new URL('deploy/env.example', root), 'utf8')
const { db, api, proxy } = compose.services
const SECRETS = ['POSTGRES_PASSWORD', 'JWT_SECRETS', 'ADMIN_PASSWORD']

/** Compose's `${NAME}`, `${NAME:-default}` and `${NAME:?message}`, with `values` as the environment. */
function interpolate(text: string, values: Record<string, string>): string {
  return text.replace(/\$\{([A-Z_]+)(?::([-?])([^}]*))?\}/g, (_, name: string, kind?: string, rest = '') => {
    const value = values[name]
    if (value) return value
    if (kind === '?') throw new Error(`${name}: ${rest}`)
    return kind === '-' ? rest : ''
  })
}

test('three services: PostgreSQL with a volume and a health check, two instances of the image built here, nginx', () => {
  assert.deepEqual(Object.keys(compose.services).sort(), ['api', 'db', 'proxy'])
  assert.ok(db.healthcheck?.test, 'db has a health check')
  const [volume] = db.volumes[0].split(':')
  assert.ok(volume in compose.volumes, 'PostgreSQL data lives in a named volume')
  assert.equal(api.build, '.')
  assert.equal(api.deploy.replicas, 2)
  assert.deepEqual(api.depends_on, { db: { condition: 'service_healthy' } })
  assert.deepEqual(proxy.depends_on, { api: { condition: 'service_healthy' } })
})

test('nginx gets deploy/nginx.conf, reaches the instances by service name and port, and is published on the port it listens on', () => {
  assert.ok(proxy.volumes.includes('./deploy/nginx.conf:/etc/nginx/nginx.conf:ro'))
  const upstream = /^\s*server ([a-z0-9-]+):([0-9]+)/m.exec(nginxConf)
  assert.deepEqual([upstream?.[1], upstream?.[2]], ['api', api.environment.PORT])
  const listen = /^\s*listen ([0-9]+);/m.exec(nginxConf)?.[1]
  assert.ok(proxy.ports.some((p: string) => p.endsWith(`:${listen}`)), `a published port maps to nginx's ${listen}`)
})

test('the instances\' environment passes the service\'s configuration check, behind one trusted proxy', () => {
  const sample = { POSTGRES_PASSWORD: 'pw', JWT_SECRETS: `k1:${'s'.repeat(32)}` }
  const env = Object.fromEntries(Object.entries(api.environment as Record<string, string>).map(([k, v]) => [k, interpolate(v, sample)]))
  const config = loadConfig(env)
  assert.equal(config.production, true)
  assert.equal(config.trustProxy, 1)
  assert.equal(config.databaseUrl, 'postgres://api:pw@db:5432/api')
  // compose gives the stopping container this long before SIGKILL: longer than the service's drain.
  assert.ok(Number.parseInt(api.stop_grace_period) * 1000 > config.shutdownTimeoutMs)
})

test('no secret is written in it: each comes from the environment, the required ones stop compose when missing, all are in deploy/env.example', () => {
  const values = [db.environment.POSTGRES_PASSWORD, api.environment.JWT_SECRETS, api.environment.ADMIN_PASSWORD, api.environment.DATABASE_URL]
  for (const value of values) assert.match(value, /\$\{[A-Z_]+(:[-?][^}]*)?\}/)
  assert.throws(() => interpolate(api.environment.JWT_SECRETS, {}), /JWT_SECRETS: set JWT_SECRETS/)
  assert.throws(() => interpolate(db.environment.POSTGRES_PASSWORD, {}), /POSTGRES_PASSWORD/)
  for (const name of SECRETS) assert.match(envExample, new RegExp(`^${name}=$`, 'm'), `${name} in deploy/env.example, empty`)
  assert.ok(existsSync(new URL('.dockerignore', root)))
  assert.match(readFileSync(new URL('.dockerignore', root), 'utf8'), /^\.env$/m, '.env stays out of the image')
})
