import assert from 'node:assert/strict'
import { execFile, spawn, spawnSync } from 'node:child_process'
import {
  chmodSync,
  copyFileSync,
  cpSync,
  existsSync,
  linkSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
} from 'node:fs'
import { createServer, type AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { DockerfileParser } from 'dockerfile-ast'
import { BUILDS } from '../src/dev/node-line.mjs'
import { healthUrl } from '../src/healthcheck.js'
import { launchService } from './fault-kit.js'
import { selfSignedCertificate } from './helpers/certificates.js'
import { freePort, portBelowEphemeral } from './helpers/ports.js'
import { createTestDatabase, TEST_JWT_SECRET } from './helpers/server.js'

// No container engine runs where the tests run, and base images cannot be
// pulled. So the Dockerfile is parsed, its rules checked, and its runtime
// stage's steps run as they would run in the image: the files it copies, in a
// scratch folder, installed with its own RUN command, then made read-only
// and started with its CMD as an unprivileged account, probed with its
// HEALTHCHECK command, and stopped with its STOPSIGNAL. A broken step fails
// `make test`, on the Node that runs the suite (a supported line; the image's
// is the active LTS). What this cannot show (the base image, the `node` user,
// the image's own build of Node) is listed in docs/deployment.md.

const root = fileURLToPath(new URL('../', import.meta.url))
const asRoot = process.getuid?.() === 0
const dockerfile = DockerfileParser.parse(readFileSync(join(root, 'Dockerfile'), 'utf8'))
// Flags (`--from=build`, `--interval=…`) are not part of an instruction's arguments for the parser; they are put back
// in front.
const instructions = dockerfile.getInstructions().map((i) => {
  const flags =
    'getFlags' in i
      ? (i.getFlags as () => Array<{ getName(): string; getValue(): string | null }>)()
          .map((f) => `--${f.getName()}=${f.getValue()} `)
          .join('')
      : ''
  return { keyword: i.getKeyword(), args: flags + (i.getArgumentsContent() ?? '') }
})

/** The instructions of the last stage (from its FROM on). */
function runtimeStage() {
  const from = instructions.map((i) => i.keyword).lastIndexOf('FROM')
  return instructions.slice(from)
}

/** The command of an exec-form (JSON array) CMD, or of a HEALTHCHECK's CMD. */
const execForm = (args: string): string[] => JSON.parse(args.slice(args.indexOf('[')))

interface Ran {
  status: number | null
  stdout: string
  stderr: string
}

/** A program run to its end without holding up this process (the service a test started answers from another). */
function run(program: string, args: string[], options: { cwd: string; env?: NodeJS.ProcessEnv; timeout?: number }) {
  return new Promise<Ran>((resolve) => {
    const child = execFile(program, args, { ...options, encoding: 'utf8' }, (_, stdout, stderr) =>
      resolve({ status: child.exitCode, stdout, stderr }),
    )
  })
}

// dist/ as the build stage makes it: tsc with the project's tsconfig. test/run.ts has built the checkout's
// dist/ that way before any file runs (without tsc's type check, which `make test` has just done), so the
// health checks run it where it was made, beside the project's package.json and node_modules.
const build = root

test(
  'the Dockerfile is multi-stage, runs as a non-root user on the active Node LTS, stops on SIGTERM, checks its ' +
    'health with Node, and bakes in no secret',
  () => {
    const froms = instructions.filter((i) => i.keyword === 'FROM')
    assert.ok(froms.length >= 2, 'a build stage and a runtime stage')
    // Every stage on the active LTS, the newest supported line (the last pinned build of src/dev/node-line.mjs).
    const activeLts = BUILDS[BUILDS.length - 1]!.line
    for (const from of froms)
      assert.match(from.args, new RegExp(`^node:${activeLts}[.-][\\w.-]*\\s+AS\\s+\\w+$`, 'i'), `FROM ${from.args}`)
    const stage = runtimeStage()
    assert.match(stage[0]!.args, /\s+AS\s+runtime$/i)
    // By number, so that Kubernetes' runAsNonRoot can check it (a name it cannot), and not root's.
    const user = stage.find((i) => i.keyword === 'USER')
    assert.match(user?.args ?? '', /^[0-9]+:[0-9]+$/, 'USER uid:gid, numeric')
    assert.ok(!/^0:|:0$/.test(user!.args), 'USER is not root, nor in its group')
    assert.equal(stage.find((i) => i.keyword === 'STOPSIGNAL')?.args, 'SIGTERM')
    const health = stage.find((i) => i.keyword === 'HEALTHCHECK')
    assert.ok(health, 'a HEALTHCHECK')
    assert.deepEqual(
      execForm(health.args),
      ['node', 'dist/main.js', 'healthcheck'],
      "the health check needs no tool but node, and reads the service's configuration",
    )
    // Docker's own time-out is the last resort: the command gives up first, and says why.
    assert.match(health.args, /--timeout=3s /)
    assert.deepEqual(execForm(stage.find((i) => i.keyword === 'CMD')!.args), ['node', 'dist/main.js'])
    // What the runtime stage holds: the compiled service, its SQL, the package files and the driver patch; no source,
    // no tests.
    const copies = stage.filter((i) => i.keyword === 'COPY').map((i) => i.args)
    assert.deepEqual(copies, [
      'package.json package-lock.json ./',
      'src/driver-patch/postgres.mjs src/driver-patch/postgres.mjs',
      '--from=build /app/dist dist',
      'sql sql',
    ])
    for (const i of instructions.filter((x) => x.keyword === 'ENV' || x.keyword === 'ARG')) {
      assert.doesNotMatch(i.args, /JWT_SECRETS|DATABASE_URL|ADMIN_PASSWORD|PASSWORD|SECRET/i, `${i.keyword} ${i.args}`)
    }
    const ignored = readFileSync(join(root, '.dockerignore'), 'utf8').split('\n')
    for (const path of ['node_modules', '.data', 'dist', '.git', '**/.env*', 'secrets'])
      assert.ok(ignored.includes(path), `.dockerignore keeps ${path} out`)
  },
)

test("the build stage compiles with the project's tsconfig, and that emits dist/main.js", () => {
  const buildStage = instructions.slice(
    0,
    instructions.findIndex((i, n) => n > 0 && i.keyword === 'FROM'),
  )
  assert.deepEqual(
    buildStage
      .filter((i) => i.keyword === 'RUN')
      .map((i) => i.args)
      .at(-1),
    'npx tsc -p tsconfig.json',
  )
  assert.ok(existsSync(join(build, 'dist', 'main.js')), 'test/run.ts builds dist/ as the build stage does')
})

describe("the image's HEALTHCHECK command follows the configuration the service runs with", async () => {
  // The command as the Dockerfile gives it, on the build (the Node that runs the suite stands for the image's).
  const command = execForm(runtimeStage().find((i) => i.keyword === 'HEALTHCHECK')!.args)
  assert.deepEqual(command.slice(0, 2), ['node', 'dist/main.js'])
  const healthcheck = (env: Record<string, string>, ...extra: string[]) =>
    run(process.execPath, [...command.slice(1), ...extra], {
      cwd: build,
      env: { PATH: process.env.PATH!, ...env },
      timeout: 10e3,
    })
  const dir = mkdtempSync(join(tmpdir(), 'upa-healthcheck-'))
  after(() => rmSync(dir, { recursive: true, force: true }))
  const certificate = selfSignedCertificate(dir, 'service')
  // As in a container: production, a prefix, HTTPS, on every address.
  const env = {
    NODE_ENV: 'production',
    HOST: '0.0.0.0',
    API_PREFIX: '/v1',
    TLS_CERT_FILE: certificate.cert,
    TLS_KEY_FILE: certificate.key,
    DATABASE_URL: await createTestDatabase(),
    JWT_SECRETS: `k1:${TEST_JWT_SECRET}`,
  }
  const service = await launchService({ ...env, PORT: '0' }).listening
  after(() => service.alive() && service.kill('SIGKILL'))
  const running = { ...env, PORT: String(service.port) }
  /** One line on stderr, the reason, and exit 1: what Docker shows in `docker inspect`. */
  const assertUnhealthy = (r: Ran, reason: RegExp) => {
    assert.equal(r.status, 1, r.stdout + r.stderr)
    assert.match(r.stderr, /^healthcheck: [^\n]+\n$/)
    assert.match(r.stderr, reason)
  }

  // Commands that do not depend on each other run at once: each is a process of its own to start.
  test(
    'healthy: liveness at https://127.0.0.1:PORT/v1/healthz, and readiness with --ready, as the service is ' +
      'configured',
    async () => {
      const [live, ready] = await Promise.all([healthcheck(running), healthcheck(running, '--ready')])
      assert.equal(live.status, 0, live.stderr)
      assert.match(
        live.stdout,
        new RegExp(
          `^healthcheck: healthy, liveness: GET https://127\\.0\\.0\\.1:${service.port}/v1/healthz answered 200`,
        ),
      )
      assert.equal(live.stderr, '')
      assert.equal(ready.status, 0, ready.stderr)
      assert.match(ready.stdout, /readiness: GET https:\/\/127\.0\.0\.1:[0-9]+\/v1\/readyz answered 200/)
    },
  )

  test('liveness never touches the database: healthy with a DATABASE_URL nothing answers at', async () => {
    const r = await healthcheck({ ...running, DATABASE_URL: 'postgres://nobody:pw@127.0.0.1:1/none' })
    assert.equal(r.status, 0, r.stderr)
  })

  test(
    "unhealthy, saying why, when its configuration differs from the service's: another prefix, no prefix, plain " +
      'HTTP, another port',
    async () => {
      const { TLS_CERT_FILE: _c, TLS_KEY_FILE: _k, ...plain } = running
      const [otherPrefix, noPrefix, plainHttp, otherPort] = await Promise.all([
        healthcheck({ ...running, API_PREFIX: '/v2' }),
        healthcheck({ ...running, API_PREFIX: '' }),
        healthcheck(plain),
        freePort().then((port) => healthcheck({ ...running, PORT: String(port) })),
      ])
      assertUnhealthy(otherPrefix, /\/v2\/healthz answered 404: does the service run with API_PREFIX="\/v2"\?/)
      assertUnhealthy(noPrefix, /:[0-9]+\/healthz answered 404/)
      assertUnhealthy(
        plainHttp,
        /GET http:\/\/127\.0\.0\.1:[0-9]+\/v1\/healthz answered 400 invalid_request, as an HTTPS port does to plain HTTP: does the service serve HTTPS here/,
      )
      assertUnhealthy(otherPort, /connection refused: is the service running, on PORT=[0-9]+\?/)
    },
  )

  test(
    "unhealthy when something on the port accepts and never answers: it gives up within the image's time-out, " +
      'saying so',
    async () => {
      const silent = createServer(() => {})
      await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve))
      after(() => silent.close())
      const { TLS_CERT_FILE: _c, TLS_KEY_FILE: _k, ...plain } = running
      const answer = await healthcheck({ ...plain, PORT: String((silent.address() as AddressInfo).port) })
      assertUnhealthy(answer, /no answer within 2 s$/m)
    },
  )

  test('an unspecified listen address is asked on loopback, of its family; any other on itself', () => {
    const at = (host: string) =>
      healthUrl({ host, port: 3000, apiPrefix: '/v1', tls: { certFile: 'c', keyFile: 'k' } }, 'liveness').href
    assert.equal(at('0.0.0.0'), 'https://127.0.0.1:3000/v1/healthz')
    assert.equal(at('::'), 'https://[::1]:3000/v1/healthz')
    assert.equal(at('10.0.0.5'), 'https://10.0.0.5:3000/v1/healthz')
  })

  test('refuses what it cannot check: a configuration that does not load, PORT=0, an unknown argument', async () => {
    const [badPrefix, portZero, unknown] = await Promise.all([
      healthcheck({ ...running, API_PREFIX: 'v1' }),
      healthcheck({ ...running, PORT: '0' }),
      healthcheck(running, '--live'),
    ])
    assertUnhealthy(badPrefix, /^healthcheck: the configuration does not load: API_PREFIX: /)
    assertUnhealthy(portZero, /PORT=0/)
    assertUnhealthy(unknown, /unknown argument "--live"; usage: healthcheck \[--ready\]/)
  })

  test('unhealthy once the service has stopped', async () => {
    service.kill('SIGTERM')
    assert.equal((await service.exited).code, 0)
    assertUnhealthy(await healthcheck(running), /connection refused/)
  })
})

test(
  "the runtime stage's steps work: install with its RUN, start read-only as an unprivileged account (under /v1, over " +
    'HTTPS), healthy by its HEALTHCHECK, exit 0 on SIGTERM',
  { skip: !asRoot && 'runs as root only (it starts the service as another account)', timeout: 180_000 },
  async () => {
    const stage = runtimeStage()
    const app = mkdtempSync(join(tmpdir(), 'upa-image-'))
    after(() => rmSync(app, { recursive: true, force: true }))
    // COPY, as the stage does; dist/ is what its build stage makes.
    cpSync(join(root, 'package.json'), join(app, 'package.json'))
    cpSync(join(root, 'package-lock.json'), join(app, 'package-lock.json'))
    cpSync(join(root, 'src/driver-patch/postgres.mjs'), join(app, 'src/driver-patch/postgres.mjs'))
    cpSync(join(build, 'dist'), join(app, 'dist'), { recursive: true })
    cpSync(join(root, 'sql'), join(app, 'sql'), { recursive: true })

    // RUN, as the stage does (as root, before USER), with the stage's ENV. The machine's npm settings
    // (its registry, its CA) come along: npm run by a Node other than the machine's looks for its global
    // configuration beside that Node, and NPM_CONFIG_GLOBALCONFIG is how the caller points it back.
    const npmSettings = Object.fromEntries(
      Object.entries(process.env).filter(([k]) => /^npm_config_/i.test(k) && !/cache/i.test(k)),
    )
    const env = {
      ...npmSettings,
      PATH: process.env.PATH!,
      HOME: app,
      NODE_ENV: 'production',
      npm_config_cache: join(app, '.npm'),
    }
    for (const step of stage.filter((i) => i.keyword === 'RUN')) {
      const r = spawnSync('sh', ['-c', step.args], { cwd: app, env, encoding: 'utf8', timeout: 120_000 })
      assert.equal(r.status, 0, `RUN ${step.args}\n${r.stdout}${r.stderr}`)
    }
    assert.deepEqual(
      spawnSync('ls', [join(app, 'node_modules')], { encoding: 'utf8' })
        .stdout.split('\n')
        .filter((n) => n && !n.startsWith('.'))
        .sort(),
      ['postgres', 'typebox'],
    )

    // Served as the case the health check must follow: a path prefix,
    // and HTTPS (its files where the account can read them).
    mkdirSync(join(app, 'tls'))
    const certificate = selfSignedCertificate(join(app, 'tls'), 'service')

    // The application folder read-only, for an account that owns none of it: the one that runs PostgreSQL here can
    // reach its socket.
    rmSync(join(app, '.npm'), { recursive: true, force: true })
    spawnSync('chmod', ['-R', 'a-w,a+rX', app])
    chmodSync(app, 0o555)
    const account = spawnSync('id', ['-u', 'postgres']).status === 0 ? 'postgres' : 'nobody'
    // Node switches to the account itself, so that the stop signal reaches the service and nothing in between.
    const [uid, gid] = ['-u', '-g'].map((flag) =>
      Number(spawnSync('id', [flag, account], { encoding: 'utf8' }).stdout.trim()),
    )
    // The account runs the Node that runs this suite, as the image runs its own: that Node may live where the account
    // cannot reach (root's ~/.cache, src/dev/node-line.mjs), and PATH would then give it the machine's node instead.
    const nodeDir = mkdtempSync(join(tmpdir(), 'upa-image-node-'))
    after(() => rmSync(nodeDir, { recursive: true, force: true }))
    chmodSync(nodeDir, 0o755)
    try {
      linkSync(process.execPath, join(nodeDir, 'node'))
    } catch {
      copyFileSync(process.execPath, join(nodeDir, 'node'))
      chmodSync(join(nodeDir, 'node'), 0o755)
    }
    const port = portBelowEphemeral()
    const serviceEnv = {
      ...env,
      PATH: `${nodeDir}:${env.PATH}`,
      PORT: String(port),
      HOST: '127.0.0.1',
      DATABASE_URL: await createTestDatabase(),
      JWT_SECRETS: `k1:${TEST_JWT_SECRET}`,
      LOG_LEVEL: 'warn',
      API_PREFIX: '/v1',
      TLS_CERT_FILE: certificate.cert,
      TLS_KEY_FILE: certificate.key,
    }
    assert.equal(
      spawnSync('node', ['--version'], { env: serviceEnv, uid, gid, encoding: 'utf8' }).stdout.trim(),
      process.version,
      'the account runs this Node',
    )
    const [cmd, ...args] = execForm(stage.find((i) => i.keyword === 'CMD')!.args)
    const child = spawn(cmd!, args, { cwd: app, env: serviceEnv, uid, gid, stdio: ['ignore', 'pipe', 'pipe'] })
    let output = ''
    child.stdout.on('data', (d) => (output += d))
    child.stderr.on('data', (d) => (output += d))
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)))
    after(() => child.kill('SIGKILL'))

    const [hcCmd, ...hcArgs] = execForm(stage.find((i) => i.keyword === 'HEALTHCHECK')!.args)
    const healthCheck = () => spawnSync(hcCmd!, hcArgs, { cwd: app, env: serviceEnv, uid, gid, timeout: 5000 }).status
    let healthy = false
    for (const deadline = Date.now() + 30_000; !healthy && Date.now() < deadline && child.exitCode === null;) {
      healthy = healthCheck() === 0
      if (!healthy) await sleep(200)
    }
    assert.ok(healthy, `the health check never passed:\n${output}`)

    const stopSignal = stage.find((i) => i.keyword === 'STOPSIGNAL')!.args as NodeJS.Signals
    child.kill(stopSignal)
    const code = await Promise.race([exited, sleep(15_000, 'timeout' as const, { ref: false })])
    assert.equal(code, 0, `exit after ${stopSignal}: ${code}\n${output}`)
    assert.notEqual(healthCheck(), 0, 'the health check fails once the service is gone')
  },
)
