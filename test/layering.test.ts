import assert from 'node:assert/strict'
import { readdirSync, readFileSync } from 'node:fs'
import { dirname, join, relative, resolve, sep } from 'node:path'
import { test } from 'node:test'
import ts from 'typescript'

// src/core is a library the application uses: it imports nothing of the
// application (docs/architecture.md). Read from the sources, not from a
// build: type-only imports count too, since a type from the application
// would tie core to it as surely as a value.

const root = resolve(import.meta.dirname, '..')
const core = join(root, 'src', 'core')
const allowedPackages = /^(node:.+|typebox|typebox\/.+|postgres)$/

const sources = (dir: string): string[] =>
  readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sources(join(dir, e.name)) : /\.(m?ts|m?js)$/.test(e.name) ? [join(dir, e.name)] : [])

/** Every specifier of a file's imports and export-froms, static and dynamic (`import()`), type-only ones included. */
const specifiers = (file: string): string[] => ts.preProcessFile(readFileSync(file, 'utf8'), true, true).importedFiles.map((f) => f.fileName)

const inCore = (path: string) => path === core || path.startsWith(core + sep)
/** The folder of src/core a file belongs to ('.' for core's own files: log.ts, metrics.ts). */
const folderOf = (path: string) => relative(core, path).split(sep).slice(0, -1)[0] ?? '.'

const files = sources(core)
const edges = files.flatMap((file) => specifiers(file).map((specifier) => ({
  file: relative(root, file),
  specifier,
  target: specifier.startsWith('.') ? resolve(dirname(file), specifier) : undefined,
  from: folderOf(file),
})))

test('the scan finds src/core and its imports', () => {
  assert.ok(files.length > 30, `only ${files.length} files under src/core`)
  assert.ok(edges.some((e) => e.specifier === 'typebox'), 'no import of typebox found: the scan reads nothing')
  assert.ok(edges.some((e) => e.specifier === 'node:crypto'), 'no import of node:crypto found')
})

test('src/core imports nothing outside src/core but node:*, typebox and postgres', () => {
  const outside = edges.filter((e) => (e.target === undefined ? !allowedPackages.test(e.specifier) : !inCore(e.target)))
  assert.deepEqual(outside.map((e) => `${e.file} imports '${e.specifier}'`), [])
})

test('no two folders of src/core import each other, directly or around a cycle', () => {
  const graph = new Map<string, Set<string>>()
  for (const e of edges) {
    if (e.target === undefined || !inCore(e.target)) continue
    const to = folderOf(e.target)
    if (to !== e.from) graph.set(e.from, (graph.get(e.from) ?? new Set()).add(to))
  }
  const cycles: string[] = []
  // Depth-first from each folder: a path that comes back to a folder on it is a cycle.
  const visit = (folder: string, path: string[]) => {
    for (const next of graph.get(folder) ?? []) {
      if (path.includes(next)) cycles.push([...path.slice(path.indexOf(next)), next].join(' -> '))
      else visit(next, [...path, next])
    }
  }
  for (const folder of graph.keys()) visit(folder, [folder])
  assert.deepEqual([...new Set(cycles)], [])
})
