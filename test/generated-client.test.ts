import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { cpSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, test } from 'node:test'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { startServer } from './helpers/server.js'

// A client generated from the live /openapi.json, used without edits: the
// same three steps the README shows (generate the types, type-check the
// program, run it), against the running service.

const root = fileURLToPath(new URL('../', import.meta.url))
const bin = (name: string) => join(root, 'node_modules', '.bin', name)

test(
  'types generated from /openapi.json type-check and drive the API with openapi-fetch: log in, create a user, a ' +
    'problem answer, pages of products',
  { timeout: 120_000 },
  async () => {
    const password = 'the admin password of the client test'
    const api = await startServer()
    const admin = await api.createUser({ role: 'admin', password })
    const skus = ['CLI-A', 'CLI-B', 'CLI-C', 'CLI-D', 'CLI-E']
    for (const sku of skus.toReversed()) {
      assert.equal(
        (await api.request('POST', '/products', { body: { sku, name: sku, price: 100, currency: 'EUR' } })).status,
        201,
      )
    }

    const dir = mkdtempSync(join(tmpdir(), 'upa-client-'))
    after(() => rmSync(dir, { recursive: true, force: true }))
    symlinkSync(join(root, 'node_modules'), join(dir, 'node_modules'))
    cpSync(join(root, 'test', 'client', 'example.ts'), join(dir, 'example.ts'))
    writeFileSync(join(dir, 'package.json'), JSON.stringify({ private: true, type: 'module' }))
    writeFileSync(
      join(dir, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          target: 'ES2022',
          module: 'NodeNext',
          moduleResolution: 'NodeNext',
          strict: true,
          noEmit: true,
          skipLibCheck: true,
          types: ['node'],
          lib: ['ES2023', 'DOM'],
        },
        files: ['example.ts'],
      }),
    )

    // Asynchronously: the service answers from this process.
    const step = async (cmd: string, args: string[], env: Record<string, string> = {}) => {
      try {
        return (
          await promisify(execFile)(cmd, args, {
            cwd: dir,
            encoding: 'utf8',
            env: { ...process.env, ...env },
            timeout: 60_000,
          })
        ).stdout
      } catch (err) {
        const { stdout, stderr } = err as { stdout?: string; stderr?: string }
        assert.fail(`${cmd} ${args.join(' ')}\n${stdout ?? ''}${stderr ?? ''}`)
      }
    }
    await step(bin('openapi-typescript'), [`${api.url}/openapi.json`, '-o', 'api-types.ts'])
    // The check and the run need only the generated types, not each other (tsx does not type-check): both at once.
    const [, out] = await Promise.all([
      step(bin('tsc'), ['-p', 'tsconfig.json']),
      step(process.execPath, ['--import', 'tsx', 'example.ts'], {
        API_URL: api.url,
        API_EMAIL: admin.email,
        API_PASSWORD: password,
      }),
    ])

    const result = JSON.parse(out.trim().split('\n').at(-1)!)
    assert.deepEqual(result.problem, { status: 409, code: 'email_taken' })
    assert.equal(result.user.role, 'user')
    assert.deepEqual(result.skus, skus)
    const [row] = await api.sql<[{ email: string }]>`SELECT email FROM users WHERE id = ${result.user.id}`
    assert.equal(row.email, result.user.email)
  },
)
