import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { parse } from 'yaml'
import { loadConfig } from '../src/config.js'

// No container engine runs here (docs/deployment.md), so compose.yaml is
// checked for what can go wrong without one: that its parts agree with each
// other, with deploy/nginx.conf, with the image and with the service's own
// configuration check, that every container is hardened, and that no secret
// is in it; and deploy/secrets.sh, which writes the secrets it reads, is run.

const root = new URL('../', import.meta.url)
// YAML merge keys (`<<: *hardening`), as compose reads them.
const compose = parse(readFileSync(new URL('compose.yaml', root), 'utf8'), { merge: true })
const nginxConf = readFileSync(new URL('deploy/nginx.conf', root), 'utf8')
const dockerfile = readFileSync(new URL('Dockerfile', root), 'utf8')
const { db, migrate, api, proxy } = compose.services

/** Compose's `${NAME}`, `${NAME:-default}` and `${NAME:?message}`, with `values` as the environment. */
function interpolate(text: string, values: Record<string, string>): string {
  return text.replace(/\$\{([A-Z_]+)(?::([-?])([^}]*))?\}/g, (_, name: string, kind?: string, rest = '') => {
    const value = values[name]
    if (value) return value
    if (kind === '?') throw new Error(`${name}: ${rest}`)
    return kind === '-' ? rest : ''
  })
}

/** Where compose mounts a service's secrets (long syntax `target` aside, which this file does not use). */
const secretPath = (name: string) => `/run/secrets/${name}`

test(
  'four services: PostgreSQL with a volume and a health check, the migrations once, two instances of the image ' +
    'built here once they are done, nginx',
  () => {
    assert.deepEqual(Object.keys(compose.services).sort(), ['api', 'db', 'migrate', 'proxy'])
    assert.ok(db.healthcheck?.test, 'db has a health check')
    const [volume] = db.volumes[0].split(':')
    assert.ok(volume in compose.volumes, 'PostgreSQL data lives in a named volume')
    assert.equal(api.build, '.')
    assert.equal(api.deploy.replicas, 2)
    assert.deepEqual(api.depends_on, {
      db: { condition: 'service_healthy' },
      migrate: { condition: 'service_completed_successfully' },
    })
    assert.deepEqual(proxy.depends_on, { api: { condition: 'service_healthy' } })
  },
)

test(
  "the migrations run in a one-shot service, the image's own command with `migrate`, as the schema's owner; " +
    "no other container is given the owner's URL, and the migrations no signing secret",
  () => {
    const cmd = /^CMD (\[.*\])$/m.exec(dockerfile)
    assert.ok(cmd, 'the Dockerfile has an exec-form CMD')
    assert.deepEqual(migrate.command, [...JSON.parse(cmd[1]!), 'migrate'])
    assert.equal(migrate.build, api.build, 'the image the instances run (its sql/ holds the migrations)')
    assert.equal(migrate.restart, 'no', 'exits once done; the hardening default would start it again and again')
    assert.deepEqual(migrate.healthcheck, { disable: true }, 'no server runs there for the image check to ask')
    assert.deepEqual(migrate.depends_on, { db: { condition: 'service_healthy' } })
    assert.equal(migrate.environment.NODE_ENV, 'production')
    assert.equal(migrate.environment.DATABASE_MIGRATION_URL_FILE, secretPath('database_migration_url'))
    assert.deepEqual([...migrate.secrets].sort(), ['database_migration_url', 'database_url'])
    for (const [name, service] of Object.entries(compose.services as Record<string, Record<string, any>>)) {
      // eslint-disable-line @typescript-eslint/no-explicit-any
      if (name === 'migrate') continue
      assert.ok(!(service.secrets ?? []).includes('database_migration_url'), `${name}: given the owner's URL`)
      assert.ok(
        !Object.keys(service.environment ?? {}).some((v) => v.startsWith('DATABASE_MIGRATION_URL')),
        `${name}: DATABASE_MIGRATION_URL`,
      )
    }
    assert.ok(!Object.keys(migrate.environment).some((v) => v.startsWith('JWT_SECRETS')), 'migrate: JWT_SECRETS')
    assert.ok(!migrate.secrets.includes('jwt_secrets'), 'migrate: the jwt_secrets secret')
  },
)

test(
  'every container is hardened: init, read-only, no capability it is not given back, no new privileges, logs ' +
    'rotated',
  () => {
    for (const [name, service] of Object.entries(compose.services as Record<string, Record<string, any>>)) {
      // eslint-disable-line @typescript-eslint/no-explicit-any
      assert.equal(service.init, true, `${name}: init`)
      assert.equal(service.read_only, true, `${name}: read_only`)
      assert.deepEqual(service.cap_drop, ['ALL'], `${name}: cap_drop`)
      assert.deepEqual(service.security_opt, ['no-new-privileges:true'], `${name}: security_opt`)
      assert.equal(service.logging?.driver, 'json-file', `${name}: logging`)
      assert.match(service.logging.options['max-size'], /^[0-9]+[kmg]$/, `${name}: log max-size`)
      assert.ok(Number(service.logging.options['max-file']) >= 1, `${name}: log max-file`)
      // What a read-only container still writes goes to memory.
      assert.ok(Array.isArray(service.tmpfs) && service.tmpfs.includes('/tmp'), `${name}: tmpfs /tmp`)
    }
    assert.equal(api.cap_add, undefined, 'the service needs no capability at all')
  },
)

test("the api's health check is the image's own, which follows its configuration; the proxy has one of its own", () => {
  assert.equal(api.healthcheck, undefined, 'not replaced here')
  assert.match(dockerfile, /^HEALTHCHECK .*\\\n\s+CMD \["node", "dist\/main.js", "healthcheck"\]$/m)
  assert.ok(proxy.healthcheck?.test?.length, 'proxy has a health check')
  assert.doesNotMatch(
    proxy.healthcheck.test.join(' '),
    /api|healthz/,
    "the proxy's check does not depend on the instances",
  )
})

test(
  'nginx ≥ 1.28 gets deploy/nginx.conf and the TLS folder, reaches the instances by service name and port, and is ' +
    'published on the ports it listens on',
  () => {
    const [, version] = /^nginx:([0-9]+\.[0-9]+)-/.exec(proxy.image) ?? []
    assert.ok(
      version && Number(version.split('.')[1]) >= 28 && Number(version.split('.')[1]) % 2 === 0,
      `a stable nginx of 1.28 or later: ${proxy.image}`,
    )
    assert.ok(proxy.volumes.includes('./deploy/nginx.conf:/etc/nginx/nginx.conf:ro'))
    const tlsFolder = proxy.volumes.find((v: string) => v.startsWith('./secrets/tls:'))?.split(':')[1]
    for (const directive of ['ssl_certificate', 'ssl_certificate_key']) {
      const path = new RegExp(`^\\s*${directive} (\\S+);`, 'm').exec(nginxConf)?.[1]
      assert.ok(tlsFolder && path?.startsWith(`${tlsFolder}/`), `${directive} ${path} is in the mounted ${tlsFolder}`)
    }
    // By name, as shipped; and in the commented alternative for nginx 1.27.3 or later, which the image is.
    const upstream = /^\s*server ([a-z0-9-]+):([0-9]+)[ ;]/m.exec(nginxConf)
    assert.deepEqual([upstream?.[1], upstream?.[2]], ['api', api.environment.PORT])
    const resolving = /^\s*# server ([a-z0-9-]+):([0-9]+) [^;]*\bresolve;/m.exec(nginxConf)
    assert.deepEqual([resolving?.[1], resolving?.[2]], ['api', api.environment.PORT])
    const listens = [...nginxConf.matchAll(/^\s*listen ([0-9]+)( ssl)?;/gm)].map((m) => m[1])
    assert.deepEqual(listens.sort(), ['443', '80'])
    for (const listen of listens)
      assert.ok(
        proxy.ports.some((p: string) => p.endsWith(`:${listen}`)),
        `a published port maps to nginx's ${listen}`,
      )
  },
)

test(
  'no secret is written in it: each is a compose secret from ./secrets/, read through a _FILE variable, and none ' +
    'of it is in the image or in git',
  () => {
    const text = readFileSync(new URL('compose.yaml', root), 'utf8')
    assert.doesNotMatch(
      text,
      /POSTGRES_PASSWORD:|RUNTIME_DB_PASSWORD:|DATABASE_URL:|DATABASE_MIGRATION_URL:|JWT_SECRETS:|ADMIN_PASSWORD:/,
      'no secret as a plain variable',
    )
    for (const [name, secret] of Object.entries(compose.secrets as Record<string, { file: string }>)) {
      assert.ok(secret.file.startsWith('./secrets/'), `${name} from ./secrets/`)
    }
    assert.equal(db.environment.POSTGRES_PASSWORD_FILE, secretPath('postgres_password'))
    assert.deepEqual(db.secrets, ['postgres_password', 'runtime_db_password'])
    assert.equal(api.environment.DATABASE_URL_FILE, secretPath('database_url'))
    assert.equal(api.environment.JWT_SECRETS_FILE, secretPath('jwt_secrets'))
    assert.deepEqual([...api.secrets].sort(), ['database_url', 'jwt_secrets'])
    assert.equal(migrate.environment.DATABASE_URL_FILE, secretPath('database_url'))
    assert.match(readFileSync(new URL('.gitignore', root), 'utf8'), /^secrets\/$/m)
    const ignored = readFileSync(new URL('.dockerignore', root), 'utf8').split('\n')
    assert.ok(
      ignored.includes('secrets') && ignored.includes('**/.env*'),
      'secrets and .env files stay out of the image',
    )
    // What .env may still set is not secret, and the file says so.
    const example = readFileSync(new URL('deploy/env.example', root), 'utf8')
    const settings = [...example.matchAll(/^([A-Z_]+)=/gm)].map((m) => m[1])
    assert.deepEqual(settings, ['HTTPS_PORT', 'HTTP_PORT'])
    assert.deepEqual(
      proxy.ports.map((p: string) => interpolate(p, {})),
      ['8443:443', '8080:80'],
    )
  },
)

test(
  'deploy/secrets.sh writes every secret compose reads, in forms the service and PostgreSQL accept, readable by the ' +
    "containers' accounts; run again, it keeps them",
  { skip: !spawnSync('openssl', ['version']).stdout?.length && 'needs openssl' },
  () => {
    const dir = mkdtempSync(join(tmpdir(), 'upa-secrets-'))
    after(() => rmSync(dir, { recursive: true, force: true }))
    mkdirSync(join(dir, 'deploy'))
    cpSync(fileURLToPath(new URL('deploy/secrets.sh', root)), join(dir, 'deploy/secrets.sh'))
    const run = () => spawnSync(join(dir, 'deploy/secrets.sh'), { cwd: tmpdir(), encoding: 'utf8' })
    const first = run()
    assert.equal(first.status, 0, first.stderr)
    const read = (name: string) => readFileSync(join(dir, compose.secrets[name].file), 'utf8')
    for (const name of Object.keys(compose.secrets)) {
      const mode = statSync(join(dir, compose.secrets[name].file)).mode & 0o777
      assert.equal(mode & 0o444, 0o444, `${name} readable by the container's account (mode ${mode.toString(8)})`)
      assert.equal(mode & 0o222, 0, `${name} written by nobody`)
    }
    assert.equal(statSync(join(dir, 'secrets')).mode & 0o777, 0o700, "the folder is its owner's alone")
    for (const file of ['fullchain.pem', 'privkey.pem'])
      assert.ok(statSync(join(dir, 'secrets/tls', file)).isFile(), `secrets/tls/${file}`)
    const password = read('postgres_password')
    assert.match(password, /^[0-9a-f]{48}$/)
    assert.equal(read('database_migration_url'), `postgres://api:${password}@db:5432/api`)
    // The service serves as the runtime role the database's init script creates with that password (deploy/postgres/).
    const runtimePassword = read('runtime_db_password')
    assert.match(runtimePassword, /^[0-9a-f]{48}$/)
    assert.notEqual(runtimePassword, password)
    assert.equal(read('database_url'), `postgres://${db.environment.RUNTIME_DB_USER}:${runtimePassword}@db:5432/api`)
    assert.ok(
      db.volumes.includes('./deploy/postgres:/docker-entrypoint-initdb.d:ro'),
      'the runtime role is made when the database is initialized',
    )
    assert.equal(db.environment.RUNTIME_DB_PASSWORD_FILE, secretPath('runtime_db_password'))

    // The instances' and the migrations' environments pass the service's own configuration check, the secrets read
    // from the files written.
    const files = Object.fromEntries(
      Object.keys(compose.secrets).map((name) => [secretPath(name), join(dir, compose.secrets[name].file)]),
    )
    const envOf = (service: { environment: Record<string, string> }) =>
      Object.fromEntries(Object.entries(service.environment).map(([k, v]) => [k, files[v] ?? v]))
    const config = loadConfig(envOf(api))
    assert.equal(config.production, true)
    assert.equal(config.trustProxy, 1)
    assert.equal(config.databaseUrl, read('database_url'))
    assert.equal(config.databaseMigrationUrl, undefined)
    assert.equal(config.jwtSecrets.length, 1)
    const migrating = loadConfig(envOf(migrate), 'migrate')
    assert.equal(migrating.production, true)
    assert.equal(migrating.databaseUrl, read('database_url'))
    assert.equal(migrating.databaseMigrationUrl, read('database_migration_url'))
    assert.deepEqual(migrating.jwtSecrets, [])
    // compose gives the stopping container this long before SIGKILL: longer than the service's drain.
    assert.ok(Number.parseInt(api.stop_grace_period) * 1000 > config.shutdownTimeoutMs)

    const second = run()
    assert.equal(second.status, 0, second.stderr)
    assert.equal(read('postgres_password'), password, 'kept')
    assert.match(second.stdout, /postgres_password: exists, kept/)
  },
)
