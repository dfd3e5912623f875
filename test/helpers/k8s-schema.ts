import { fileURLToPath } from 'node:url'
import ts from 'typescript'

// A Kubernetes object checked as the API server and kubectl check it, without
// a cluster, by kubernetes-models (a pinned development dependency): its
// models are generated from the Kubernetes API's own OpenAPI document, each
// with a JSON Schema validator (types, required fields, enumerations,
// formats) and a TypeScript interface. The validators let unknown fields
// pass, which kubectl refuses (field validation is Strict by default since
// Kubernetes 1.27); so the object is also type-checked, as an object literal
// of its kind's interface, whose excess-property check refuses a misspelt
// field at any depth.

type Manifest = Record<string, unknown>

/** The module of a kind's model: `kubernetes-models/<apiVersion>/<kind>` (the core group's apiVersion is `v1`). */
const modelOf = (m: Manifest) => `kubernetes-models/${String(m.apiVersion)}/${String(m.kind)}`

/** Every problem found in `manifests` (empty when all are valid), each naming its document by index. */
export async function validateManifests(manifests: readonly Manifest[]): Promise<string[]> {
  const problems: string[] = []
  for (const [i, m] of manifests.entries()) {
    const model = (await import(modelOf(m)).catch(() => undefined)) as
      Record<string, new (data: Manifest) => { validate(): void }> | undefined
    const Model = model?.[String(m.kind)]
    if (!Model) {
      problems.push(`document ${i + 1}: no model for apiVersion ${String(m.apiVersion)}, kind ${String(m.kind)}`)
      continue
    }
    try {
      new Model(m).validate()
    } catch (err) {
      problems.push(`document ${i + 1} (${String(m.kind)}): ${(err as Error).message}`)
    }
  }
  return problems.concat(typeCheck(manifests))
}

/**
 * The manifests as typed object literals in a file of their own, compiled (not emitted) with the project's compiler.
 */
function typeCheck(manifests: readonly Manifest[]): string[] {
  const file = fileURLToPath(new URL('./k8s-manifests.generated.ts', import.meta.url))
  const lines = manifests.flatMap((m, i) => [
    `import type { I${String(m.kind)} as Kind${i} } from '${modelOf(m)}'`,
    `export const document${i + 1}: Kind${i} = ${JSON.stringify(m, null, 1)}`,
  ])
  const source = lines.join('\n')
  const host = ts.createCompilerHost({})
  const { readFile, fileExists } = host
  host.readFile = (f) => (f === file ? source : readFile(f))
  host.fileExists = (f) => f === file || fileExists(f)
  const program = ts.createProgram(
    [file],
    {
      strict: true,
      noEmit: true,
      skipLibCheck: true,
      types: [],
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      target: ts.ScriptTarget.ES2022,
    },
    host,
  )
  return ts.getPreEmitDiagnostics(program).map((d) => {
    const at = d.file && d.start !== undefined ? d.file.getLineAndCharacterOfPosition(d.start) : undefined
    const line = at ? source.split('\n')[at.line]!.trim() : ''
    // The document a line belongs to: the last `export const documentN` above it.
    const doc = at
      ? /document(\d+)/.exec(
          source
            .split('\n')
            .slice(0, at.line + 1)
            .reverse()
            .find((l) => l.startsWith('export const document')) ?? '',
        )?.[1]
      : undefined
    const message = ts.flattenDiagnosticMessageText(d.messageText, ' ')
    return `document ${doc ?? '?'}: ${message}${line ? ` (at ${line})` : ''}`
  })
}
