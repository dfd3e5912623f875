import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { join, relative, resolve } from 'node:path'
import { test } from 'node:test'
import ts from 'typescript'
import { sourceFiles } from './helpers/source-files.js'

// Prettier (`make fmt`) lays code out at 120 columns but never breaks a comment
// or a literal; this holds the rest of the rule (docs/architecture.md, "Code style").
// A line may run longer only for what cannot be broken without changing it: a
// regular expression, a pattern string with no space to break at (ESLint's
// max-len draws the same line with ignoreRegExpLiterals), or the text of a
// template literal written over several lines, whose line breaks are its value
// (the code the driver patch inserts). SQL's tagged templates are not exempt.

const WIDTH = 120
const root = resolve(import.meta.dirname, '..')
const files = ['src', 'test', 'bench'].flatMap((dir) =>
  sourceFiles(join(root, dir), /\.(ts|mts|mjs|js)$/).filter((f) => !f.includes('node_modules')),
)

/** The lines of `text` over WIDTH characters that hold nothing unbreakable, as "path:line: length". */
function overWidth(path: string, text: string): string[] {
  const lines = text.split('\n')
  const long = lines.flatMap((line, i) => ([...line].length > WIDTH ? [i] : []))
  if (long.length === 0) return []
  const unbreakable = new Set<number>()
  const source = ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true)
  const visit = (node: ts.Node): void => {
    const pattern =
      ts.isRegularExpressionLiteral(node) ||
      (ts.isStringLiteral(node) && node.text.length > 60 && !/\s/.test(node.text))
    const start = source.getLineAndCharacterOfPosition(node.getStart(source)).line
    if (pattern) unbreakable.add(start)
    if (ts.isTemplateLiteral(node) && !ts.isTaggedTemplateExpression(node.parent)) {
      const end = source.getLineAndCharacterOfPosition(node.getEnd()).line
      for (let line = start; line <= end && end > start; line++) unbreakable.add(line)
    }
    ts.forEachChild(node, visit)
  }
  visit(source)
  return long.filter((i) => !unbreakable.has(i)).map((i) => `${path}:${i + 1}: ${[...lines[i]!].length}`)
}

test(`no line of src/, test/ or bench/ is over ${WIDTH} characters but an unbreakable literal`, () => {
  assert.ok(files.length > 250, `only ${files.length} files`)
  assert.deepEqual(
    files.flatMap((file) => overWidth(relative(root, file), readFileSync(file, 'utf8'))),
    [],
  )
})

test('the width check finds what it looks for', () => {
  const long = 'x'.repeat(WIDTH + 1)
  const text = [
    `const a = '${'words '.repeat(20)}'`,
    `// ${long}`,
    `const b = /${long}/`,
    `const c = '${'[a-z]'.repeat(30)}'`,
    'const e = `',
    long,
    '`',
    'const f = sql`',
    long,
    '`',
  ].join('\n')
  assert.deepEqual(overWidth('x.ts', text), [`x.ts:1: ${WIDTH + 12}`, `x.ts:2: ${WIDTH + 4}`, `x.ts:9: ${WIDTH + 1}`])
})
