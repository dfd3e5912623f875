import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { join, relative, resolve } from 'node:path'
import { test } from 'node:test'
import ts from 'typescript'
import { categoriesMigration, categoriesRegistry } from './helpers/categories.js'
import { sourceFiles } from './helpers/source-files.js'
import { startServer } from './helpers/server.js'

// A service owns all of its state (docs/architecture.md, "One service"): no
// module of src/ holds any, so two services in one process, each with its own
// resources, share nothing; and every timer is a component's, the
// scheduler's, or one that docs/architecture.md names with its reason.

const root = resolve(import.meta.dirname, '..')
const files = sourceFiles(join(root, 'src'), /(?<!\.d)\.m?ts$/).map((file) => ({
  path: relative(root, file),
  text: readFileSync(file, 'utf8'),
}))
/** Scripts whose work is to run when loaded. */
const entryPoints = new Set(['src/main.ts'])
/** Classes whose instances never change after construction. */
const immutableClasses = new Set(['URL', 'TextDecoder'])

/**
 * What a module's top level does beyond declaring: variables that can change, collections that can grow, statements
 * that run.
 */
function moduleState(path: string, text: string): string[] {
  const source = ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true)
  const found: string[] = []
  for (const statement of source.statements) {
    if (ts.isVariableStatement(statement)) {
      const { declarationList } = statement
      if (!(declarationList.flags & ts.NodeFlags.Const)) found.push(`${path}: ${statement.getText().split('\n')[0]}`)
      for (const declaration of declarationList.declarations) {
        const init = declaration.initializer
        if (!init || !ts.isNewExpression(init) || immutableClasses.has(init.expression.getText())) continue
        // A collection made at load is a constant when its type says it cannot be changed.
        if (!/^Readonly(Set|Map)</.test(declaration.type?.getText() ?? ''))
          found.push(`${path}: ${declaration.getText().split('\n')[0]}`)
      }
    } else if (ts.isExpressionStatement(statement) && !entryPoints.has(path)) {
      found.push(`${path}: ${statement.getText().split('\n')[0]}`)
    }
  }
  return found
}

test('no module of src/ holds state: no variable, growable collection or statement at its top level', () => {
  assert.ok(files.length > 150, `only ${files.length} files under src/`)
  assert.deepEqual(
    files.flatMap((f) => moduleState(f.path, f.text)),
    [],
  )
})

test('the scan finds what it looks for', () => {
  const found = moduleState(
    'x.ts',
    [
      'let a = 1',
      'const b = new Map<string, number>()',
      'const c: ReadonlySet<string> = new Set()',
      'const d = new URL("http://x")',
      'b.set("x", 1)',
      'export const e = () => new Map()',
    ].join('\n'),
  )
  assert.deepEqual(found, ['x.ts: let a = 1', 'x.ts: b = new Map<string, number>()', 'x.ts: b.set("x", 1)'])
})

/** The files of src/ that start a timer of their own (setTimeout, setInterval, node:timers/promises). */
const timerFiles = files
  .filter((f) => /\bset(Timeout|Interval)\b/.test(f.text.replace(/^\s*(\/\/|\*).*$/gm, '')))
  .map((f) => f.path)
  .sort()

test(
  "every timer of src/ is one docs/architecture.md names: a component's, the scheduler's, or an exception with " +
    'its reason',
  () => {
    const doc = readFileSync(join(root, 'docs', 'architecture.md'), 'utf8')
    const start = doc.indexOf('Every timer of the service')
    const end = doc.indexOf('\nEvery repeating job', start)
    assert.ok(start > 0 && end > start, 'docs/architecture.md has no section on timers')
    const named = [...new Set([...doc.slice(start, end).matchAll(/`(src\/[^`]+\.m?ts)`/g)].map((m) => m[1]!))].sort()
    assert.ok(timerFiles.includes('src/core/scheduler.ts'), 'the scan finds no timer at all')
    assert.deepEqual(timerFiles, named)
  },
)

test('two services in one process, each with its own resources, share nothing of them', async () => {
  const plain = await startServer()
  const withCategories = await startServer({}, {}, { registry: categoriesRegistry })
  await withCategories.sql.unsafe(categoriesMigration)

  const created = await withCategories.request('POST', '/categories', { body: { name: 'Tools' } })
  assert.equal(created.status, 201)
  const taken = await withCategories.request('POST', '/categories', { body: { name: 'Tools' } })
  assert.equal(taken.status, 409)
  assert.equal(taken.body.code, 'category_name_taken')

  assert.equal((await plain.request('GET', '/categories')).status, 404)
  assert.equal(plain.deps.registry.problems.category_name_taken, undefined)
  assert.ok(!plain.deps.registry.eventTypes.includes('category.created'))
  assert.ok(!plain.deps.registry.scopes.byRole.admin.includes('categories:write'))
  const plainDoc = (await plain.request('GET', '/openapi.json', { auth: null })).body
  assert.equal(plainDoc.paths['/categories'], undefined)
  assert.ok(!plainDoc.components.schemas.WebhookCreate.properties.event_types.items.enum.includes('category.created'))

  // What both have, both still answer the same way: a product's currency is checked by its own declaration's format.
  for (const api of [plain, withCategories]) {
    const refused = await api.request('POST', '/products', {
      body: { sku: 'S-1', name: 'P', price: 1, currency: 'XXQ' },
    })
    assert.equal(refused.status, 422)
    assert.deepEqual(
      refused.body.errors.map((e: { path: string }) => e.path),
      ['/currency'],
    )
  }
})
