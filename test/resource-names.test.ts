import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { relative } from 'node:path'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { scopesOfResource } from '../src/auth/scopes.js'
import type { Resource } from '../src/core/resources/resource.js'
import { sourceFiles } from './helpers/source-files.js'
import { applicationRegistry } from './helpers/registry.js'

// A resource's names (its scopes, problem codes, event types, OpenAPI
// component names) are written in its own folder and nowhere else in src/
// but the registry (its folder: src/api-keys/ for /api-keys, and a folder of
// that name inside another, as API keys as credentials are src/auth/api-keys/): everything else derives them from the
// declaration, so adding, renaming or removing a resource touches no other file. The names
// are read from the declarations, never listed here.

const src = fileURLToPath(new URL('../src/', import.meta.url))
const files = sourceFiles(src, /\.(ts|mts|mjs)$/)
const registryFiles = new Set(['modules.ts'])

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')

/** The names of a resource as other code would have to spell them. */
function namesOf(resource: Resource): RegExp[] {
  const { read, write } = scopesOfResource(resource)
  const { created, updated, deleted } = resource.events
  const words = [read, write, ...[...resource.uniqueCodes.values()].map((u) => u.code), created, updated, deleted]
  return [
    ...words.map((w) => new RegExp(`(?<![\\w.:])${escape(w)}(?![\\w:])`)),
    // A component name, as a string or a reference: 'Product', `ProductCreate`, #/components/schemas/ProductPage.
    new RegExp(`(['"\`/])${resource.name}(Page|Create|Replace|Patch|Delete)?(?=['"\`])`),
  ]
}

/**
 * The files of src/ outside the resource's own folders (src/products/ for /products) and the registry that name it,
 * with the line.
 */
function strangersNaming(resource: Resource, patterns: readonly RegExp[]): string[] {
  const home = resource.path.slice(1) + '/'
  const found: string[] = []
  for (const file of files) {
    const rel = relative(src, file)
    if (rel.startsWith(home) || rel.includes(`/${home}`) || registryFiles.has(rel)) continue
    readFileSync(file, 'utf8')
      .split('\n')
      .forEach((line, i) => {
        const hit = patterns.find((p) => p.test(line))
        if (hit) found.push(`src/${rel}:${i + 1}: ${line.trim()}`)
      })
  }
  return found
}

const products = applicationRegistry.resources.find((r) => r.table === 'products')!

test(
  'the product resource is named only in src/products/ and src/modules.ts: scopes, sku_taken, its events, ' + 'Product',
  () => {
    // The bare word too: no comment elsewhere speaks of "a Product".
    const patterns = [...namesOf(products), new RegExp(`\\b${products.name}s?\\b`)]
    assert.ok(patterns[0]!.test(`scope: '${scopesOfResource(products).read}'`), 'the patterns find what they look for')
    assert.deepEqual(strangersNaming(products, patterns), [])
  },
)

for (const resource of applicationRegistry.resources.filter((r) => r !== products)) {
  test(
    `the ${resource.label} resource's scopes, codes, events and component names appear only in its folders ` +
      `(${resource.path.slice(1)}/) and src/modules.ts`,
    () => {
      assert.deepEqual(strangersNaming(resource, namesOf(resource)), [])
    },
  )
}
