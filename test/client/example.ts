// A small program that uses the API through types generated from its live
// /openapi.json (openapi-typescript) and openapi-fetch, without edits:
// test/generated-client.test.ts generates `api-types.ts` next to a copy of
// this file, type-checks both and runs it. It logs in, creates a user,
// handles a problem answer and pages through the products.
import createClient from 'openapi-fetch'
import type { paths } from './api-types.js'

const client = createClient<paths>({ baseUrl: process.env.API_URL })

const login = await client.POST('/auth/login', {
  body: { email: process.env.API_EMAIL!, password: process.env.API_PASSWORD! },
})
if (!login.data) throw new Error(`login failed with ${login.response.status}`)
const headers = { authorization: `Bearer ${login.data.access_token}` }

const email = `generated-${Date.now()}@example.com`
const created = await client.POST('/users', {
  headers,
  body: { name: 'Generated Client', email, password: 'a long enough password' },
})
if (!created.data) throw new Error(`creating a user failed with ${created.response.status}`)

// The same e-mail again: a problem answer, typed by the document.
const again = await client.POST('/users', {
  headers,
  body: { name: 'Generated Client', email, password: 'a long enough password' },
})
if (again.data || !again.error) throw new Error('a duplicate e-mail was accepted')
const problem: { code: string; status: number } = again.error

// Every product, two per page, following the cursor of each Link header.
const skus: string[] = []
let cursor: string | undefined
do {
  const page = await client.GET('/products', {
    headers,
    params: { query: { limit: 2, sort: 'sku', ...(cursor ? { cursor } : {}) } },
  })
  if (!page.data) throw new Error(`listing products failed with ${page.response.status}`)
  for (const product of page.data) skus.push(product.sku!)
  const next = /<([^>]+)>; rel="next"/.exec(page.response.headers.get('link') ?? '')?.[1]
  cursor = next ? new URL(next, 'http://x').searchParams.get('cursor')! : undefined
} while (cursor)

console.log(
  JSON.stringify({
    user: { id: created.data.id, email: created.data.email, role: created.data.role },
    problem: { status: problem.status, code: problem.code },
    skus,
  }),
)
