import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { dirname, join, relative, resolve, sep } from 'node:path'
import { test } from 'node:test'
import { sourceFiles } from './helpers/source-files.js'
import ts from 'typescript'

// src/core is a library the application uses: it imports nothing of the
// application; and the whole of src/ imports in one direction: no cycle of
// files, none between its top-level folders and files (docs/architecture.md,
// "Two layers"). Read from the sources, not from a build: type-only imports
// count too, since a type ties two files as surely as a value.

const root = resolve(import.meta.dirname, '..')
const core = join(root, 'src', 'core')
const allowedPackages = /^(node:.+|typebox|typebox\/.+|postgres)$/

const sources = (dir: string): string[] => sourceFiles(dir, /\.m?[tj]s$/)

/** Every specifier of a source's imports and export-froms, static and dynamic (`import()`), type-only ones included. */
const specifiersIn = (text: string): string[] =>
  ts.preProcessFile(text, true, true).importedFiles.map((f) => f.fileName)
const specifiers = (file: string): string[] => specifiersIn(readFileSync(file, 'utf8'))

const inCore = (path: string) => path === core || path.startsWith(core + sep)
/** The folder of src/core a file belongs to ('.' for core's own files: log.ts, metrics.ts). */
const folderOf = (path: string) => relative(core, path).split(sep).slice(0, -1)[0] ?? '.'

const files = sources(core)
const edges = files.flatMap((file) =>
  specifiers(file).map((specifier) => ({
    file: relative(root, file),
    specifier,
    target: specifier.startsWith('.') ? resolve(dirname(file), specifier) : undefined,
    from: folderOf(file),
  })),
)

test('the scan finds src/core and its imports', () => {
  assert.ok(files.length > 30, `only ${files.length} files under src/core`)
  assert.ok(
    edges.some((e) => e.specifier === 'typebox'),
    'no import of typebox found: the scan reads nothing',
  )
  assert.ok(
    edges.some((e) => e.specifier === 'node:crypto'),
    'no import of node:crypto found',
  )
})

test('the scan sees every form of import', () => {
  const text =
    `import type { A } from './a.js'\nexport { b } from '../b.js'\nexport * from 'c'\nimport 'd'\nconst e ` +
    `= await import('../../e.js')\n`
  assert.deepEqual(specifiersIn(text), ['./a.js', '../b.js', 'c', 'd', '../../e.js'])
})

test('src/core imports nothing outside src/core but node:*, typebox and postgres', () => {
  const outside = edges.filter((e) => (e.target === undefined ? !allowedPackages.test(e.specifier) : !inCore(e.target)))
  assert.deepEqual(
    outside.map((e) => `${e.file} imports '${e.specifier}'`),
    [],
  )
})

/**
 * The circles of a graph: each set of two or more nodes that reach one another
 * through its edges (the strongly connected components, Tarjan's algorithm),
 * sorted, so an assertion names every file of a cycle.
 */
function circles(graph: ReadonlyMap<string, ReadonlySet<string>>): string[][] {
  const index = new Map<string, number>()
  const low = new Map<string, number>()
  const stack: string[] = []
  const found: string[][] = []
  const visit = (node: string) => {
    index.set(node, index.size)
    low.set(node, index.get(node)!)
    stack.push(node)
    for (const next of graph.get(node) ?? []) {
      if (!index.has(next)) {
        visit(next)
        low.set(node, Math.min(low.get(node)!, low.get(next)!))
      } else if (stack.includes(next)) low.set(node, Math.min(low.get(node)!, index.get(next)!))
    }
    if (low.get(node) !== index.get(node)) return
    const circle: string[] = []
    let member: string
    do {
      member = stack.pop()!
      circle.push(member)
    } while (member !== node)
    if (circle.length > 1) found.push(circle.sort())
  }
  for (const node of graph.keys()) if (!index.has(node)) visit(node)
  return found
}

/** Edges as a graph between what `group` maps each end to, an edge inside one group left out. */
function graphOf(
  pairs: ReadonlyArray<readonly [string, string]>,
  group: (path: string) => string,
): Map<string, Set<string>> {
  const graph = new Map<string, Set<string>>()
  for (const [from, to] of pairs) {
    const [a, b] = [group(from), group(to)]
    if (a !== b) graph.set(a, (graph.get(a) ?? new Set()).add(b))
  }
  return graph
}

test('circles finds a cycle of three and one of two, and none in a chain', () => {
  const graph = (pairs: string[]) =>
    graphOf(
      pairs.map((p) => p.split('>') as [string, string]),
      (x) => x,
    )
  assert.deepEqual(circles(graph(['a>b', 'b>c', 'c>a', 'c>d', 'd>e', 'e>d'])), [
    ['d', 'e'],
    ['a', 'b', 'c'],
  ])
  assert.deepEqual(circles(graph(['a>b', 'b>c', 'a>c'])), [])
})

test('no two folders of src/core import each other, directly or around a cycle', () => {
  const inside = edges
    .filter((e) => e.target !== undefined && inCore(e.target))
    .map((e) => [join(root, e.file), e.target!] as const)
  assert.deepEqual(circles(graphOf(inside, folderOf)), [])
})

const src = join(root, 'src')
/** The file a relative specifier names: `x.js` written for `x.ts`, `x.mjs` for `x.mjs` or its `x.d.mts`. */
const srcFiles = sources(src)
const resolveSource = (from: string, specifier: string): string | undefined => {
  const path = resolve(dirname(from), specifier)
  return [path, path.replace(/\.js$/, '.ts'), path.replace(/\.mjs$/, '.d.mts')].find((candidate) =>
    srcFiles.includes(candidate),
  )
}
const srcEdges = srcFiles.flatMap((file) =>
  specifiers(file)
    .filter((s) => s.startsWith('.'))
    .map((s) => [file, resolveSource(file, s)] as const),
)
/** What a file of src/ belongs to at the top: its folder (`src/auth`), or itself (`src/service.ts`). */
const topOf = (path: string) => relative(src, path).split(sep)[0]!

test('the scan of src/ resolves every relative import to a file', () => {
  assert.ok(srcEdges.length > 500, `only ${srcEdges.length} imports found under src/`)
  assert.deepEqual(
    srcEdges.filter(([, to]) => to === undefined).map(([from]) => relative(root, from)),
    [],
  )
})

test('no file of src/ imports itself around a cycle', () => {
  const pairs = srcEdges.map(([from, to]) => [relative(root, from), relative(root, to!)] as const)
  assert.deepEqual(circles(graphOf(pairs, (x) => x)), [])
})

test('no two top-level folders or files of src/ import each other, directly or around a cycle', () => {
  const pairs = srcEdges.map(([from, to]) => [from, to!] as const)
  assert.deepEqual(circles(graphOf(pairs, topOf)), [])
})
