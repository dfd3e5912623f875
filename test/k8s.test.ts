import assert from 'node:assert/strict'
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, test } from 'node:test'
import { parseAllDocuments } from 'yaml'
import { KNOWN_VARIABLES, loadConfig, SECRET_VARIABLES } from '../src/config.js'
import { startServer } from './helpers/server.js'
import { validateManifests } from './helpers/k8s-schema.js'

// deploy/k8s/ without a cluster: every document is checked against the
// Kubernetes API's own schema for its kind (test/helpers/k8s-schema.ts), and
// the files against each other, the Dockerfile and the service: the probes
// answer on the service started with the Deployment's settings, every
// variable is one the service reads, the grace period outlasts the delay and
// the drain, the user is the image's, the secrets are read from files.

const root = new URL('../', import.meta.url)
const folder = new URL('deploy/k8s/', root)
/** The example Secrets: outside the folder, so that `kubectl apply -f deploy/k8s/` never applies them. */
const EXAMPLE = 'deploy/k8s-secrets.example.yaml'
type Manifest = Record<string, any> // eslint-disable-line @typescript-eslint/no-explicit-any
/** What `kubectl apply -f deploy/k8s/` reads: every .yaml, .yml and .json file of the folder (-R: and below it). */
const applied = (readdirSync(folder, { recursive: true }) as string[]).filter((f) => /\.(ya?ml|json)$/.test(f)).sort()
const files = applied.map((file) => `deploy/k8s/${file}`).concat(EXAMPLE)
const documents = files.flatMap((file) =>
  parseAllDocuments(readFileSync(new URL(file, root), 'utf8')).map((doc, i) => {
    assert.deepEqual(doc.errors, [], `${file}: ${doc.errors.join('; ')}`)
    return { file, index: i, manifest: doc.toJS() as Manifest }
  }),
)
const one = (kind: string, name?: string): Manifest => {
  const found = documents.filter(
    (d) => d.manifest.kind === kind && (name === undefined || d.manifest.metadata.name === name),
  )
  assert.equal(found.length, 1, `one ${kind}${name ? ` ${name}` : ''}`)
  return found[0]!.manifest
}
const deployment = one('Deployment')
const job = one('Job')
const service = one('Service')
const pdb = one('PodDisruptionBudget')
const runtimeSecret = one('Secret', 'users-products-api')
const migrationSecret = one('Secret', 'users-products-api-migration')
const dockerfile = readFileSync(new URL('Dockerfile', root), 'utf8')

const [api] = deployment.spec.template.spec.containers as Manifest[]
const [migrate] = job.spec.template.spec.containers as Manifest[]
const envOf = (container: Manifest): Record<string, string> =>
  Object.fromEntries((container.env as Manifest[]).map((e) => [e.name, e.value]))
/** The volume of `container`'s pod (the Deployment's or the Job's) that a mount names. */
const volumeOf = (container: Manifest, name: string): Manifest =>
  ((container === api ? deployment : job).spec.template.spec.volumes as Manifest[]).find((v) => v.name === name)!
/** Its settings but the secrets, whose files exist only in the pod. */
const plainEnvOf = (container: Manifest) =>
  Object.fromEntries(Object.entries(envOf(container)).filter(([name]) => !name.endsWith('_FILE')))

/**
 * A container's environment as its process sees it: each `_FILE` path under a mount replaced by a file holding
 * `values[secret key]`.
 */
function materialize(
  pod: Manifest,
  container: Manifest,
  values: Record<string, Record<string, string>>,
): Record<string, string> {
  const dir = mkdtempSync(join(tmpdir(), 'k8s-test-'))
  after(() => rmSync(dir, { recursive: true, force: true }))
  const env: Record<string, string> = { ...envOf(container), NODE_ENV: 'production' }
  for (const [name, path] of Object.entries(env)) {
    if (!name.endsWith('_FILE')) continue
    const mount = (container.volumeMounts as Manifest[]).find((m) => path.startsWith(`${m.mountPath}/`))
    assert.ok(mount, `${name}: ${path} is under no mount of ${container.name}`)
    const volume = (pod.volumes as Manifest[]).find((v) => v.name === mount.name)!
    const item = (volume.secret.items as Manifest[]).find((i) => `${mount.mountPath}/${i.path}` === path)
    assert.ok(item, `${name}: ${path} is no file of secret ${volume.secret.secretName}`)
    const value = values[volume.secret.secretName]?.[item.key]
    assert.ok(value !== undefined, `${name}: secret ${volume.secret.secretName} has no key ${item.key}`)
    const file = join(dir, `${name}.txt`)
    writeFileSync(file, value)
    env[name] = file
  }
  return env
}

test('every document is valid against the Kubernetes schema of its kind, unknown fields refused', async () => {
  assert.deepEqual(applied, ['deployment.yaml', 'migrate-job.yaml', 'pdb.yaml', 'service.yaml'])
  assert.deepEqual(documents.map((d) => d.manifest.kind).sort(), [
    'Deployment',
    'Job',
    'PodDisruptionBudget',
    'Secret',
    'Secret',
    'Service',
  ])
  const where = documents.map((d, i) => `document ${i + 1}: ${d.file} #${d.index + 1}`).join('; ')
  assert.deepEqual(await validateManifests(documents.map((d) => d.manifest)), [], where)
})

test(
  'the schema check refuses what kubectl refuses: a misspelt field, a wrong type, a missing required field, a ' +
    'value outside an enumeration',
  async () => {
    const broken = (change: (d: Manifest) => void) => {
      const copy = structuredClone(deployment)
      change(copy)
      return copy
    }
    const cases = {
      misspelt: broken((d) => void (d.spec.template.spec.containers[0].securityContext.readOnlyRootFileSystem = true)),
      wrongType: broken((d) => void (d.spec.replicas = '2')),
      noSelector: broken((d) => void delete d.spec.selector),
      badEnum: broken((d) => void (d.spec.template.spec.containers[0].securityContext.seccompProfile.type = 'Default')),
    }
    const problems = await validateManifests([deployment, ...Object.values(cases)])
    for (const [i, name] of Object.keys(cases).entries()) {
      assert.ok(
        problems.some((p) => p.startsWith(`document ${i + 2} `) || p.startsWith(`document ${i + 2}:`)),
        `${name}: ${problems.join('; ')}`,
      )
    }
    assert.ok(!problems.some((p) => /^document 1\b/.test(p)), problems.join('; '))
  },
)

test(
  'the Service, the PodDisruptionBudget and the Deployment select the same pods, by the port the container ' + 'names',
  () => {
    const labels = deployment.spec.template.metadata.labels
    for (const selector of [
      deployment.spec.selector.matchLabels,
      pdb.spec.selector.matchLabels,
      service.spec.selector,
    ]) {
      for (const [key, value] of Object.entries(selector)) assert.equal(labels[key], value, key)
    }
    const containerPort = (api.ports as Manifest[]).find((p) => p.name === service.spec.ports[0].targetPort)
    assert.ok(
      containerPort,
      `the Service's targetPort ${service.spec.ports[0].targetPort} is a port the container names`,
    )
    assert.equal(
      String(containerPort.containerPort),
      envOf(api).PORT,
      'the container port is the PORT the service listens on',
    )
    // A PDB that lets every pod go at once would protect nothing; one that lets none go blocks node drains.
    assert.ok(pdb.spec.maxUnavailable >= 1 && pdb.spec.maxUnavailable < deployment.spec.replicas)
  },
)

test(
  'the probes: liveness on /healthz and readiness on /readyz, by the port the service listens on; they answer 200 ' +
    "on the service started with the Deployment's settings",
  async () => {
    const probes = {
      startupProbe: api.startupProbe,
      livenessProbe: api.livenessProbe,
      readinessProbe: api.readinessProbe,
    }
    const config = loadConfig(plainEnvOf(api))
    assert.equal(probes.livenessProbe.httpGet.path, `${config.apiPrefix}/healthz`)
    assert.equal(probes.startupProbe.httpGet.path, `${config.apiPrefix}/healthz`)
    assert.equal(probes.readinessProbe.httpGet.path, `${config.apiPrefix}/readyz`)
    for (const [name, probe] of Object.entries(probes)) {
      const port = (api.ports as Manifest[]).find(
        (p) => p.name === probe.httpGet.port || p.containerPort === probe.httpGet.port,
      )
      assert.equal(port?.containerPort, config.port, `${name} calls the port the service listens on`)
      assert.equal(probe.httpGet.scheme ?? 'HTTP', config.tls ? 'HTTPS' : 'HTTP', `${name}'s scheme`)
    }
    // The service itself, with every plain setting of the Deployment (not its database or secrets: the test's own).
    const plain = Object.fromEntries(
      Object.entries(plainEnvOf(api)).filter(([name]) => name !== 'PORT' && name !== 'HOST'),
    )
    const server = await startServer(plain)
    for (const [name, probe] of Object.entries(probes)) {
      const res = await server.request('GET', probe.httpGet.path, { auth: null })
      assert.equal(res.status, 200, `${name}: GET ${probe.httpGet.path}`)
    }
  },
)

test(
  'every variable the pods are given is one the service reads; secrets only as <NAME>_FILE, from the Secrets, ' +
    'mounted read-only',
  () => {
    const secrets: ReadonlySet<string> = new Set(SECRET_VARIABLES)
    const known = (name: string) => KNOWN_VARIABLES.has(name)
    for (const container of [api, migrate]) {
      for (const e of container.env as Manifest[]) {
        assert.ok(known(e.name), `${container.name}: ${e.name} is not a variable the service reads (src/config.ts)`)
        assert.ok(!secrets.has(e.name), `${container.name}: ${e.name} in the pod's spec; give it as ${e.name}_FILE`)
        assert.equal(
          e.valueFrom,
          undefined,
          `${container.name}: ${e.name} from valueFrom would put the secret in the environment`,
        )
      }
      assert.equal(
        container.envFrom,
        undefined,
        `${container.name}: envFrom would put every key of a Secret in the environment`,
      )
      for (const mount of container.volumeMounts as Manifest[])
        if (volumeOf(container, mount.name).secret)
          assert.equal(mount.readOnly, true, `${container.name}: ${mount.name}`)
    }
    assert.ok('DATABASE_URL_FILE' in envOf(api) && 'JWT_SECRETS_FILE' in envOf(api))
    for (const pod of [deployment.spec.template.spec, job.spec.template.spec]) {
      for (const volume of pod.volumes as Manifest[]) {
        // 0440: the owner and the pod's fsGroup; not every user of the node's containers.
        if (volume.secret) assert.equal(volume.secret.defaultMode, 0o440, `${volume.name}: defaultMode`)
      }
    }
  },
)

test(
  'each pod is given only the secrets it reads: every file mounted from a Secret is named by a _FILE variable; the ' +
    'migration Job gets no JWT secret',
  () => {
    for (const [pod, container] of [
      [deployment.spec.template.spec, api],
      [job.spec.template.spec, migrate],
    ] as const) {
      const read = new Set(Object.entries(envOf(container)).flatMap(([n, v]) => (n.endsWith('_FILE') ? [v] : [])))
      for (const mount of container.volumeMounts as Manifest[]) {
        const volume = (pod.volumes as Manifest[]).find((v) => v.name === mount.name)!
        if (!volume.secret) continue
        assert.ok(
          volume.secret.items?.length,
          `${container.name}: ${mount.name} mounts named keys, not the whole Secret`,
        )
        for (const item of volume.secret.items as Manifest[]) {
          const path = `${mount.mountPath}/${item.path}`
          assert.ok(read.has(path), `${container.name}: ${path} is mounted but no _FILE variable reads it`)
        }
      }
    }
    assert.ok(!Object.keys(envOf(migrate)).some((name) => name.startsWith('JWT_SECRETS')), 'JWT_SECRETS in the Job')
    const keys = (job.spec.template.spec.volumes as Manifest[]).flatMap((v) =>
      (v.secret?.items ?? []).map((i: Manifest) => i.key),
    )
    assert.ok(!keys.includes('jwt-secrets'), `the Job mounts ${keys.join(', ')}`)
  },
)

test('a read-only root file system, and an emptyDir at /tmp for what must still be written', () => {
  for (const [kind, pod] of [
    ['Deployment', deployment.spec.template.spec],
    ['Job', job.spec.template.spec],
  ] as const) {
    for (const container of pod.containers as Manifest[]) {
      assert.equal(container.securityContext.readOnlyRootFilesystem, true, kind)
      const tmp = (container.volumeMounts as Manifest[]).find((m) => m.mountPath === '/tmp')
      assert.ok(tmp, `${kind}: /tmp is mounted`)
      assert.notEqual(tmp.readOnly, true, `${kind}: /tmp is writable`)
      const volume = (pod.volumes as Manifest[]).find((v) => v.name === tmp.name)
      assert.ok(volume?.emptyDir, `${kind}: /tmp is an emptyDir`)
      assert.ok(volume.emptyDir.sizeLimit, `${kind}: /tmp has a size limit`)
    }
  }
})

test(
  '`kubectl apply -f deploy/k8s/` applies no Secret: the example, placeholders only, lives outside the folder and ' +
    'names the role script where it is',
  () => {
    const appliedKinds = documents.filter((d) => d.file.startsWith('deploy/k8s/')).map((d) => d.manifest.kind)
    assert.ok(!appliedKinds.includes('Secret'), `applied with the folder: ${appliedKinds.join(', ')}`)
    assert.ok(!EXAMPLE.startsWith('deploy/k8s/'))
    const text = readFileSync(new URL(EXAMPLE, root), 'utf8')
    assert.match(text, /deploy\/postgres\/runtime-role\.psql/, 'the script that makes the runtime role')
    // Every file or folder of the project its comments name exists.
    for (const [path] of text.matchAll(/\b(?:deploy|docs|sql|src)\/[\w./-]*[\w/]/g))
      assert.ok(existsSync(new URL(path, root)), `${EXAMPLE} names ${path}, which does not exist`)
  },
)

test(
  'the example Secrets hold placeholders only, with every key the pods read; a pod given the example unchanged ' +
    'refuses to start',
  () => {
    for (const secret of [runtimeSecret, migrationSecret]) {
      assert.equal(secret.data, undefined, `${secret.metadata.name}: no base64 data, whose value nobody reads`)
      for (const [key, value] of Object.entries(secret.stringData as Record<string, string>))
        assert.match(value, /CHANGE-ME/, `${secret.metadata.name}: ${key}`)
    }
    const example = {
      [runtimeSecret.metadata.name]: runtimeSecret.stringData,
      [migrationSecret.metadata.name]: migrationSecret.stringData,
    }
    assert.throws(
      () => loadConfig(materialize(deployment.spec.template.spec, api, example)),
      /JWT_SECRETS_FILE \([^)]*\): the secret of kid "k1" must be at least 32 bytes/,
    )
    // With a real-looking secret in its place, the Deployment's and the Job's settings load, the database URL read from
    // its file.
    const jwt = `k1:${'x'.repeat(48)}`
    const real = { ...example, 'users-products-api': { ...runtimeSecret.stringData, 'jwt-secrets': jwt } }
    const served = loadConfig(materialize(deployment.spec.template.spec, api, real))
    assert.equal(served.databaseUrl, runtimeSecret.stringData['database-url'])
    assert.equal(served.jwtSecrets[0]?.kid, 'k1')
    assert.equal(served.production, true)
    // The Job signs nothing: it needs no JWT secret, and starts with the example's placeholders as they are.
    const migrating = loadConfig(materialize(job.spec.template.spec, migrate, example), 'migrate')
    assert.equal(migrating.databaseUrl, runtimeSecret.stringData['database-url'])
    assert.equal(migrating.databaseMigrationUrl, migrationSecret.stringData['database-migration-url'])
  },
)

test(
  "the migration Job runs `migrate` of the image's own command as the owner; only it is given the owner's URL, " +
    'and it never restarts in place',
  () => {
    const cmd = /^CMD (\[.*\])$/m.exec(dockerfile)
    assert.ok(cmd, 'the Dockerfile has an exec-form CMD')
    assert.deepEqual(migrate.command, [...JSON.parse(cmd[1]!), 'migrate'])
    assert.equal(
      migrate.image,
      api.image,
      'the same image as the Deployment (the migrations are the sql/ files it ships)',
    )
    assert.ok('DATABASE_MIGRATION_URL_FILE' in envOf(migrate))
    assert.equal(job.spec.template.spec.restartPolicy, 'Never')
    // The Service and the PodDisruptionBudget must not count the Job's pod as one of the service's.
    const jobLabels = job.spec.template.metadata?.labels ?? {}
    assert.ok(
      !Object.entries(service.spec.selector).every(([key, value]) => jobLabels[key] === value),
      'the Service would route requests to the migration pod',
    )
    const mounted = (pod: Manifest) => (pod.volumes as Manifest[]).map((v) => v.secret?.secretName)
    assert.ok(mounted(job.spec.template.spec).includes(migrationSecret.metadata.name))
    assert.ok(
      !mounted(deployment.spec.template.spec).includes(migrationSecret.metadata.name),
      "the serving pods never see the owner's URL",
    )
    assert.ok(!Object.keys(envOf(api)).some((name) => name.startsWith('DATABASE_MIGRATION_URL')))
  },
)

test(
  "terminationGracePeriodSeconds outlasts SHUTDOWN_DELAY + SHUTDOWN_TIMEOUT and the pool's close; the stop is " +
    'left to SHUTDOWN_DELAY, not a preStop hook',
  () => {
    const config = loadConfig(plainEnvOf(api))
    assert.ok(
      config.shutdownDelayMs > 0,
      'SHUTDOWN_DELAY is set: kube-proxy and ingress controllers learn of a terminating pod after the signal',
    )
    // The drain's end, then the pool's close (its own 5 s at most) and the exit.
    const needs = config.shutdownDelayMs / 1000 + config.shutdownTimeoutMs / 1000 + 5
    assert.ok(
      deployment.spec.template.spec.terminationGracePeriodSeconds >= needs,
      `terminationGracePeriodSeconds ${deployment.spec.template.spec.terminationGracePeriodSeconds} < ${needs}`,
    )
    assert.equal(api.lifecycle?.preStop, undefined, 'a preStop sleep would add to SHUTDOWN_DELAY, not replace it')
  },
)

test(
  "pods run as the image's numeric user, non-root, read-only, without privileges, capabilities or a " +
    'service-account token',
  () => {
    // The pods' settings are checked as production's (a numeric user, secrets required): the image must say so.
    assert.match(dockerfile, /^ENV NODE_ENV=production$/m)
    const user = /^USER ([0-9]+)(?::([0-9]+))?$/m.exec(dockerfile)
    assert.ok(user, 'the Dockerfile names its USER by number (runAsNonRoot cannot check a name)')
    for (const [kind, pod] of [
      ['Deployment', deployment.spec.template.spec],
      ['Job', job.spec.template.spec],
    ] as const) {
      assert.equal(pod.automountServiceAccountToken, false, kind)
      assert.equal(pod.securityContext.runAsNonRoot, true, kind)
      assert.equal(pod.securityContext.seccompProfile.type, 'RuntimeDefault', kind)
      for (const container of pod.containers as Manifest[]) {
        const sc = container.securityContext
        assert.equal(sc.runAsUser, Number(user[1]), `${kind}: the image's user`)
        if (user[2] !== undefined) assert.equal(sc.runAsGroup, Number(user[2]), `${kind}: the image's group`)
        assert.equal(sc.runAsNonRoot, true, kind)
        assert.equal(sc.readOnlyRootFilesystem, true, kind)
        assert.equal(sc.allowPrivilegeEscalation, false, kind)
        assert.deepEqual(sc.capabilities, { drop: ['ALL'] }, kind)
        assert.equal(sc.seccompProfile.type, 'RuntimeDefault', kind)
        assert.ok(
          container.resources.requests.memory && container.resources.limits.memory,
          `${kind}: memory request and limit`,
        )
      }
    }
  },
)
