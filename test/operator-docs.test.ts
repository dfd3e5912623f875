import assert from 'node:assert/strict'
import { existsSync, readFileSync } from 'node:fs'
import { dirname, join, normalize } from 'node:path'
import { test } from 'node:test'
import { allRoutes } from '../src/app.js'
import { buildOpenApiDocument } from '../src/openapi/document.js'
import { projectRoot } from './fault-kit.js'
import { applicationRegistry } from './helpers/registry.js'

// What an operator reads first: docs/deployment.md's production checklist, each line linking to where it is
// explained (every link of the file is held to a file and a heading that exist), and the README's examples and
// first steps, held against the service they describe.

const read = (path: string) => readFileSync(join(projectRoot, path), 'utf8')
/** The text outside fenced code blocks, where a `#` starts a comment, not a heading. */
const prose = (markdown: string) => markdown.replace(/^```[^\n]*\n[\s\S]*?^```$/gm, '')

/** GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens, -1 for twins. */
function anchorsOf(markdown: string): Set<string> {
  const anchors = new Set<string>()
  for (const [, heading] of prose(markdown).matchAll(/^#{1,6} (.+)$/gm)) {
    const slug = heading!
      .trim()
      .toLowerCase()
      .replace(/[^\p{L}\p{N} _-]/gu, '')
      .replace(/ /g, '-')
    let anchor = slug
    for (let n = 1; anchors.has(anchor); n++) anchor = `${slug}-${n}`
    anchors.add(anchor)
  }
  return anchors
}

test("GitHub's anchors, as the docs link them", () => {
  assert.deepEqual(
    [
      ...anchorsOf(
        '# Deployment\n## nginx in front: `deploy/nginx.conf`\n### Rotating `JWT_SECRETS`\n' +
          '### Liveness, readiness and the `healthcheck` command\n## Notes\n## Notes\n```sh\n# not a heading\n```\n',
      ),
    ],
    [
      'deployment',
      'nginx-in-front-deploynginxconf',
      'rotating-jwt_secrets',
      'liveness-readiness-and-the-healthcheck-command',
      'notes',
      'notes-1',
    ],
  )
})

/** Every relative link of a Markdown file (web links aside): its text and target, as written. */
const linksOf = (markdown: string) =>
  [...prose(markdown).matchAll(/\[([^\]]*)\]\(([^)\s]+)\)/g)]
    .map((m) => ({ text: m[1]!, target: m[2]! }))
    .filter((l) => !/^[a-z]+:/.test(l.target))

/**
 * Links to what another change brings (the Prometheus rules and their section of docs/operations.md): allowed to be
 * missing until they exist, and checked like every other link once they do.
 */

/** What is wrong with a link of `file` (a path from the project's root), or undefined. */
function brokenLink(file: string, target: string): string | undefined {
  const [path = '', anchor] = target.split('#')
  const resolved = path ? normalize(join(dirname(file), path)) : file
  if (!existsSync(join(projectRoot, resolved))) return `${target}: ${resolved} does not exist`
  if (anchor === undefined) return undefined
  if (!resolved.endsWith('.md')) return `${target}: an anchor into a file that is not Markdown`
  return anchorsOf(read(resolved)).has(anchor) ? undefined : `${target}: ${resolved} has no heading #${anchor}`
}

const deployment = read('docs/deployment.md')

test(
  'docs/deployment.md opens with a production checklist: secrets, roles, TLS to the database, migrations, health ' +
    'checks, backups, alerts, WORKERS, the proxy; each line links to where it is explained',
  () => {
    const sections = prose(deployment).split(/^## /m)
    assert.match(sections[1]!, /^Production checklist\n/, 'the first section')
    const items = sections[1]!.split(/^- \[ \] /m).slice(1)
    const topics = [
      /secret/i,
      /role/i,
      /TLS to the database/,
      /migration/i,
      /health check/i,
      /backup/i,
      /alert/i,
      /WORKERS/,
      /proxy/i,
    ]
    assert.equal(items.length, topics.length, items.map((i) => i.split('\n')[0]).join(' | '))
    for (const [i, topic] of topics.entries()) {
      assert.match(items[i]!, topic, `item ${i + 1}`)
      assert.ok(linksOf(items[i]!).length > 0, `item ${i + 1} links to its section: ${items[i]}`)
    }
    // One page: a screen or two, not a chapter.
    assert.ok(sections[1]!.split('\n').length <= 70, `${sections[1]!.split('\n').length} lines`)
    assert.ok(linksOf(sections[1]!).some((l) => l.target === '../deploy/prometheus/'))
    assert.ok(linksOf(sections[1]!).some((l) => l.target === 'operations.md#alerts-and-dashboard'))
  },
)

test('every link of docs/deployment.md names a file, and a heading, that exist', () => {
  const links = linksOf(deployment)
  assert.ok(links.length > 20, `${links.length} links`)
  assert.deepEqual(
    links.flatMap((l) => brokenLink('docs/deployment.md', l.target) ?? []),
    [],
  )
  // The check itself: a heading that is not there, and a file that is not there, are found.
  assert.match(brokenLink('docs/deployment.md', '#no-such-heading') ?? '', /has no heading #no-such-heading/)
  assert.match(brokenLink('docs/deployment.md', 'no-such-file.md') ?? '', /does not exist/)
  assert.equal(brokenLink('docs/deployment.md', 'operations.md#least-privilege-the-runtime-role'), undefined)
})

test('the README: its user bodies written out whole have every member the API answers, in its order', () => {
  const routes = allRoutes(applicationRegistry, '')
  const document = buildOpenApiDocument(routes, { version: '0', apiPrefix: '', problems: applicationRegistry.problems })
  const members = (name: string) =>
    Object.keys(
      (document as { components: { schemas: Record<string, { properties: object }> } }).components.schemas[name]!
        .properties,
    )
  const bodies = read('README.md')
    .split('\n')
    .filter((line) => line.startsWith('{"id":'))
    .flatMap((line) => {
      try {
        return [JSON.parse(line) as Record<string, unknown>]
      } catch {
        return [] // abbreviated with `...`
      }
    })
  const users = bodies.filter((b) => 'email' in b && 'role' in b)
  assert.ok(users.length >= 1, 'a user written out whole')
  for (const user of users) assert.deepEqual(Object.keys(user), members('User'))
  for (const product of bodies.filter((b) => 'sku' in b)) assert.deepEqual(Object.keys(product), members('Product'))
})

test('the README says how to pick the port and how to see the commands, from the sources and after a build', () => {
  const readme = read('README.md')
  assert.match(readme, /`PORT=\d+ make run`/)
  assert.match(readme, /`node --import tsx src\/main\.ts --help`/)
  assert.match(readme, /`node dist\/main\.js --help` after `make\s+build`/)
  assert.match(readme, /make help/)
})
