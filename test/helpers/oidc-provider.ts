import {
  createHash,
  createHmac,
  createPublicKey,
  generateKeyPair,
  randomBytes,
  sign as signData,
  constants,
  type JsonWebKey,
  type KeyObject,
} from 'node:crypto'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { createServer, type Server } from 'node:https'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { promisify } from 'node:util'
import type ProviderClass from 'oidc-provider'
import type { ProviderContext } from 'oidc-provider'
import { certificateFromAuthority, runCertificateAuthority } from './certificates.js'
import { applicationRegistry } from './registry.js'

// A real OpenID provider for the tests: panva's oidc-provider, run inside the
// test process over HTTPS with a certificate from the run's authority (which
// every test process, and so the service, trusts through NODE_EXTRA_CA_CERTS
// set by test/run.ts), on 127.0.0.1 and a random port. Tokens come from its
// real endpoints: client_credentials, and authorization code with PKCE whose
// login and consent this module drives over HTTP with cookies. Its access
// tokens are JWTs for one resource server, `audience`, signed with keys made
// here, so that `sign` can forge tokens with
// the very keys the provider publishes.
//
// The login and consent pages are this module's own minimal ones (a JSON
// answer naming the prompt, a form POST to finish it) rather than
// oidc-provider's devInteractions, which print warnings when enabled. For the
// same reason every hook oidc-provider warns about when left at its default is
// configured here.

export type SigningAlg = 'RS256' | 'PS256' | 'ES256' | 'EdDSA'

export const SIGNING_ALGS: readonly SigningAlg[] = ['RS256', 'PS256', 'ES256', 'EdDSA']

/** The scopes the resource server allows: the service's own, so that its tokens can carry any of them. */
export const API_SCOPES = applicationRegistry.scopes.all.join(' ')

export interface TestProviderOptions {
  /** The API's resource indicator; default 'https://api.example.test'. */
  audience?: string
  /** The alg the provider signs access tokens with unless a token asks for another; default RS256. */
  alg?: SigningAlg
  /** Lifetime of the access tokens, seconds; default 300. */
  accessTokenTtl?: number
}

export interface TokenOptions {
  /** Scopes to ask for (space-separated); the resource server allows API_SCOPES, others are dropped by the provider. */
  scope?: string
  /**
   * Claims added to the token (the provider's extraTokenClaims hook), e.g.
   * { email, email_verified, name, roles: [...] }. The claims the provider
   * sets itself (iss, aud, exp, iat, jti, client_id, scope) win over them,
   * except `sub`, which is taken when given (a client_credentials token's sub
   * is otherwise the client id).
   */
  claims?: Record<string, unknown>
  /** The alg to sign this token with; default the provider's. */
  alg?: SigningAlg
}

export interface SignOptions {
  /**
   * RS256, PS256, ES256, EdDSA: signed with the provider's current key of that
   * alg. Also for rule tests: 'HS256' keyed with the PEM (SPKI) of the
   * current RS256 public key (or that of `kid`), the alg-confusion attack;
   * 'none' with an empty signature. Default RS256.
   */
  alg?: SigningAlg | 'HS256' | 'none'
  /**
   * A string: signs with the published key of that kid when it is one for
   * `alg` (for HS256 any key), else with the alg's current key, naming this
   * kid all the same (an unknown kid, or another alg's). null: no kid in the
   * header. Default: the kid of the key that signs.
   */
  kid?: string | null
  /** Header members laid over { alg, typ: 'at+jwt', kid }. */
  header?: Record<string, unknown>
}

export interface TestProvider {
  /** https://127.0.0.1:<port> */
  issuer: string
  /** The API's identifier: the resource indicator the JWT access tokens are issued for (their `aud`). */
  audience: string
  /**
   * Real flow: client_credentials at the token endpoint with resource=audience
   * (client `test-service`); the JWT access token.
   */
  clientCredentialsToken(options?: TokenOptions): Promise<string>
  /** Sets the claims of an account (findAccount); sub = id. An id never set is an account with no claims but sub. */
  setAccount(id: string, claims: Record<string, unknown>): void
  /**
   * Real flow: authorization code with PKCE (S256) for the public client
   * `test-app`, driven over HTTP: /auth → login as `accountId` → consent →
   * code → token with resource=audience. The JWT access token, carrying the
   * account's claims (and `options.claims` over them); scope asked for is
   * 'openid' plus `options.scope`.
   */
  authorizationCodeToken(accountId: string, options?: TokenOptions): Promise<string>
  /** A compact JWS of `payload` as given (nothing added), for rule tests. */
  sign(payload: Record<string, unknown>, options?: SignOptions): string
  /** The JWKS the provider serves now (jwks_uri), newest keys first. */
  publicJwks(): { keys: Array<Record<string, unknown>> }
  /** The same keys with their private parts. */
  privateJwks(): { keys: Array<Record<string, unknown>> }
  /**
   * Puts a new key first for each alg of `algs` (default all four): it signs from now on; the old ones of those algs
   * stay published unless `dropOld`.
   */
  rotateKeys(options?: { algs?: SigningAlg[]; dropOld?: boolean }): Promise<void>
  /** How many GETs the JWKS URI and the discovery document have received. */
  readonly jwksFetches: number
  readonly discoveryFetches: number
  /** Outage: closes the listening socket and every connection; `start` listens again on the same port. */
  stop(): Promise<void>
  start(): Promise<void>
  close(): Promise<void>
}

const SERVICE_CLIENT = 'test-service'
const APP_CLIENT = 'test-app'
const REDIRECT_URI = 'https://app.example.test/callback'
// How a test's wishes for one token reach the provider's hooks: headers on the token request
// (the claims as base64url JSON, since a header carries no text beyond Latin-1).
const CLAIMS_HEADER = 'x-test-claims'
const ALG_HEADER = 'x-test-alg'

interface SigningKey {
  alg: SigningAlg
  kid: string
  privateKey: KeyObject
  privateJwk: JsonWebKey
  publicJwk: JsonWebKey
}

const makeKeyPair = promisify(generateKeyPair) as (
  type: string,
  options: object,
) => Promise<{ privateKey: KeyObject; publicKey: KeyObject }>

async function makeSigningKey(alg: SigningAlg): Promise<SigningKey> {
  const { privateKey, publicKey } =
    alg === 'ES256'
      ? await makeKeyPair('ec', { namedCurve: 'P-256' })
      : alg === 'EdDSA'
        ? await makeKeyPair('ed25519', {})
        : await makeKeyPair('rsa', { modulusLength: 2048 })
  const kid = `${alg.toLowerCase()}-${randomBytes(6).toString('hex')}`
  const members = { kid, alg, use: 'sig' }
  return {
    alg,
    kid,
    privateKey,
    privateJwk: { ...privateKey.export({ format: 'jwk' }), ...members },
    publicJwk: { ...publicKey.export({ format: 'jwk' }), ...members },
  }
}

const base64url = (value: string | Buffer) => Buffer.from(value).toString('base64url')

function signature(alg: SigningAlg, key: KeyObject, data: Buffer): Buffer {
  switch (alg) {
    case 'RS256':
      return signData('sha256', data, key)
    case 'PS256':
      return signData('sha256', data, { key, padding: constants.RSA_PKCS1_PSS_PADDING, saltLength: 32 })
    case 'ES256':
      return signData('sha256', data, { key, dsaEncoding: 'ieee-p1363' })
    case 'EdDSA':
      return signData(null, data, key)
  }
}

/**
 * oidc-provider's storage (sessions, interactions, grants, codes, tokens) in
 * a Map the TestProvider owns, so that it outlives a rebuilt Provider (key
 * rotation) and no two TestProviders share it. Its own memory adapter would
 * warn on every start.
 */
function memoryAdapter(store: Map<string, { payload: Record<string, unknown>; expiresAt: number }>) {
  return (model: string) => {
    const key = (id: string) => `${model}:${id}`
    const live = (id: string) => {
      const entry = store.get(key(id))
      return entry && entry.expiresAt > Date.now() ? entry.payload : undefined
    }
    const findBy = (member: string, value: string) => {
      for (const [k, { payload }] of store)
        if (k.startsWith(`${model}:`) && payload[member] === value) return live(k.slice(model.length + 1))
      return undefined
    }
    return {
      async upsert(id: string, payload: Record<string, unknown>, expiresIn?: number) {
        store.set(key(id), { payload, expiresAt: expiresIn ? Date.now() + expiresIn * 1000 : Infinity })
      },
      async find(id: string) {
        return live(id)
      },
      async findByUid(uid: string) {
        return findBy('uid', uid)
      },
      async findByUserCode(userCode: string) {
        return findBy('userCode', userCode)
      },
      async consume(id: string) {
        const payload = live(id)
        if (payload) payload.consumed = Math.floor(Date.now() / 1000)
      },
      async destroy(id: string) {
        store.delete(key(id))
      },
      async revokeByGrantId(grantId: string) {
        for (const [k, { payload }] of store) if (payload.grantId === grantId) store.delete(k)
      },
    }
  }
}

/** Cookies by name and path, for one user agent talking to the provider. */
class CookieJar {
  private readonly cookies = new Map<string, { name: string; value: string; path: string }>()

  async fetch(url: URL, init: RequestInit = {}): Promise<Response> {
    const cookie = [...this.cookies.values()]
      .filter((c) => url.pathname.startsWith(c.path))
      .map((c) => `${c.name}=${c.value}`)
      .join('; ')
    const headers = new Headers(init.headers)
    if (cookie) headers.set('cookie', cookie)
    const response = await fetch(url, { ...init, headers, redirect: 'manual' })
    for (const line of response.headers.getSetCookie()) {
      const [pair = '', ...attributes] = line.split(';').map((part) => part.trim())
      const name = pair.slice(0, pair.indexOf('='))
      const value = pair.slice(pair.indexOf('=') + 1)
      const path = attributes.find((a) => a.toLowerCase().startsWith('path='))?.slice(5) || '/'
      const expired =
        attributes.some((a) => a.toLowerCase().startsWith('expires=') && Date.parse(a.slice(8)) <= Date.now()) ||
        attributes.some((a) => a.toLowerCase() === 'max-age=0')
      if (expired || !value) this.cookies.delete(`${name} ${path}`)
      else this.cookies.set(`${name} ${path}`, { name, value, path })
    }
    return response
  }
}

async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = []
  for await (const chunk of req) chunks.push(chunk as Buffer)
  return Buffer.concat(chunks).toString('utf8')
}

function answerJson(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store' })
  res.end(JSON.stringify(body))
}

function listenOn(server: Server, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject).listen(port, '127.0.0.1', () => (server.off('error', reject), resolve()))
  })
}

/**
 * Imports oidc-provider without its one warning at import: it calls any Node
 * release without an LTS codename unsupported, Node 26 included until it
 * becomes LTS.
 */
async function importProvider(): Promise<typeof import('oidc-provider')> {
  const warn = console.warn
  console.warn = (...args: unknown[]) => {
    if (!String(args[0]).includes('oidc-provider WARNING: Unsupported runtime')) warn(...args)
  }
  try {
    return await import('oidc-provider')
  } finally {
    console.warn = warn
  }
}

export async function startTestProvider(options: TestProviderOptions = {}): Promise<TestProvider> {
  const ca = runCertificateAuthority()
  const audience = options.audience ?? 'https://api.example.test'
  const defaultAlg = options.alg ?? 'RS256'
  const accessTokenTtl = options.accessTokenTtl ?? 300
  const { default: Provider, errors } = await importProvider()

  const certificateDir = mkdtempSync(join(tmpdir(), 'upa-oidc-'))
  const certificate = certificateFromAuthority(certificateDir, 'oidc-provider', ca)
  const server: Server = createServer({ cert: readFileSync(certificate.cert), key: readFileSync(certificate.key) })
  rmSync(certificateDir, { recursive: true, force: true })
  await listenOn(server, 0)
  const { port } = server.address() as AddressInfo
  const issuer = `https://127.0.0.1:${port}`

  let keys: SigningKey[] = await Promise.all(SIGNING_ALGS.map(makeSigningKey))
  const accounts = new Map<string, Record<string, unknown>>()
  const store = new Map<string, { payload: Record<string, unknown>; expiresAt: number }>()
  const serviceSecret = randomBytes(24).toString('base64url')
  const cookieKeys = [randomBytes(32).toString('base64url')]
  let listening = true
  let jwksFetches = 0
  let discoveryFetches = 0

  const testClaims = (ctx: ProviderContext): Record<string, unknown> => {
    const header = ctx.get(CLAIMS_HEADER)
    return header ? (JSON.parse(Buffer.from(header, 'base64url').toString('utf8')) as Record<string, unknown>) : {}
  }

  const configuration = () => ({
    adapter: memoryAdapter(store),
    jwks: { keys: keys.map((k) => k.privateJwk) },
    clients: [
      {
        client_id: SERVICE_CLIENT,
        client_secret: serviceSecret,
        grant_types: ['client_credentials'],
        response_types: [],
        redirect_uris: [],
      },
      {
        client_id: APP_CLIENT,
        token_endpoint_auth_method: 'none',
        grant_types: ['authorization_code'],
        response_types: ['code'],
        redirect_uris: [REDIRECT_URI],
      },
    ],
    cookies: { keys: cookieKeys },
    async findAccount(_ctx: unknown, sub: string) {
      return { accountId: sub, claims: async () => ({ ...accounts.get(sub), sub }) }
    },
    // Carried into the access token itself, which is what the service reads.
    async extraTokenClaims(ctx: ProviderContext, token: { accountId?: string }) {
      const { sub: _sub, ...account } = token.accountId ? (accounts.get(token.accountId) ?? {}) : {}
      return { ...account, ...testClaims(ctx) }
    },
    formats: {
      customizers: {
        // extraTokenClaims cannot set sub; a test that links users by (iss, sub) needs to.
        async jwt(ctx: ProviderContext, _token: unknown, jwt: { payload: Record<string, unknown> }) {
          const { sub } = testClaims(ctx)
          if (sub !== undefined) jwt.payload.sub = sub
        },
      },
    },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: async () => audience,
        useGrantedResource: async () => true,
        async getResourceServerInfo(ctx: ProviderContext, indicator: string) {
          if (indicator !== audience) throw new errors.InvalidTarget(`the only resource here is ${audience}`)
          const alg = (ctx.get(ALG_HEADER) || defaultAlg) as SigningAlg
          return {
            scope: API_SCOPES,
            audience,
            accessTokenTTL: accessTokenTtl,
            accessTokenFormat: 'jwt',
            jwt: { sign: { alg } },
          }
        },
      },
    },
    interactions: { url: (_ctx: unknown, interaction: { uid: string }) => `/interaction/${interaction.uid}` },
    clientBasedCORS: () => false,
    async renderError(ctx: { type: string; body: unknown }, out: Record<string, unknown>) {
      ctx.type = 'json'
      ctx.body = out
    },
    ttl: {
      AccessToken: accessTokenTtl,
      AuthorizationCode: 60,
      ClientCredentials: accessTokenTtl,
      IdToken: 300,
      Interaction: 300,
      Session: 600,
      Grant: 600,
      RefreshToken: 600,
    },
  })

  // oidc-provider reads its keys once, at construction: a rotation builds a new
  // one behind the same server, with the same storage, clients and accounts.
  let provider: ProviderClass = new Provider(issuer, configuration())
  let callback = provider.callback()

  async function interact(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const details = await provider.interactionDetails(req, res)
    if (req.method === 'GET') return answerJson(res, 200, { uid: details.uid, prompt: details.prompt.name })
    const form = new URLSearchParams(await readBody(req))
    if (form.get('prompt') === 'login' && details.prompt.name === 'login') {
      return provider.interactionFinished(
        req,
        res,
        { login: { accountId: form.get('login') } },
        { mergeWithLastSubmission: false },
      )
    }
    if (form.get('prompt') === 'consent' && details.prompt.name === 'consent' && details.session) {
      const grant = details.grantId
        ? await provider.Grant.find(details.grantId)
        : new provider.Grant({ accountId: details.session.accountId, clientId: String(details.params.client_id) })
      if (!grant) throw new Error('grant of the interaction not found')
      const missing = details.prompt.details as {
        missingOIDCScope?: string[]
        missingOIDCClaims?: string[]
        missingResourceScopes?: Record<string, string[]>
      }
      if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '))
      if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims)
      for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes ?? {}))
        grant.addResourceScope(indicator, scopes.join(' '))
      return provider.interactionFinished(
        req,
        res,
        { consent: { grantId: await grant.save() } },
        { mergeWithLastSubmission: true },
      )
    }
    answerJson(res, 400, { error: `cannot answer prompt ${details.prompt.name} with ${form.get('prompt')}` })
  }

  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    const path = (req.url ?? '/').split('?')[0]
    if (req.method === 'GET' && path === '/jwks') jwksFetches++
    if (req.method === 'GET' && path === '/.well-known/openid-configuration') discoveryFetches++
    if (path.startsWith('/interaction/')) {
      interact(req, res).catch((error: Error) => answerJson(res, 400, { error: error.message }))
      return
    }
    callback(req, res)
  })

  async function token(body: URLSearchParams, options: TokenOptions, authorization?: string): Promise<string> {
    const headers: Record<string, string> = { 'content-type': 'application/x-www-form-urlencoded' }
    if (authorization) headers.authorization = authorization
    if (options.claims) headers[CLAIMS_HEADER] = base64url(JSON.stringify(options.claims))
    if (options.alg) headers[ALG_HEADER] = options.alg
    body.set('resource', audience)
    const response = await fetch(`${issuer}/token`, { method: 'POST', headers, body })
    const answer = (await response.json()) as { access_token?: string; error?: string; error_description?: string }
    if (!response.ok || !answer.access_token)
      throw new Error(`token endpoint: ${response.status} ${answer.error}: ${answer.error_description}`)
    return answer.access_token
  }

  function keyFor(alg: SignOptions['alg'] & string, kid: string | null | undefined): SigningKey {
    const keyAlg = alg === 'HS256' || alg === 'none' ? undefined : alg
    const key =
      keys.find((k) => k.kid === kid && (!keyAlg || k.alg === keyAlg)) ??
      keys.find((k) => k.alg === (keyAlg ?? 'RS256'))
    if (!key) throw new Error(`no ${alg} key`)
    return key
  }

  async function listen(): Promise<void> {
    if (listening) return
    await listenOn(server, port)
    listening = true
  }

  async function stop(): Promise<void> {
    if (!listening) return
    listening = false
    const closed = new Promise<void>((resolve) => server.close(() => resolve()))
    server.closeAllConnections()
    await closed
  }

  return {
    issuer,
    audience,
    get jwksFetches() {
      return jwksFetches
    },
    get discoveryFetches() {
      return discoveryFetches
    },

    clientCredentialsToken(options = {}) {
      const body = new URLSearchParams({ grant_type: 'client_credentials' })
      if (options.scope) body.set('scope', options.scope)
      return token(body, options, `Basic ${Buffer.from(`${SERVICE_CLIENT}:${serviceSecret}`).toString('base64')}`)
    },

    setAccount(id, claims) {
      accounts.set(id, claims)
    },

    async authorizationCodeToken(accountId, options = {}) {
      const verifier = randomBytes(32).toString('base64url')
      const state = randomBytes(8).toString('base64url')
      const jar = new CookieJar()
      let url = new URL('/auth', issuer)
      url.search = new URLSearchParams({
        client_id: APP_CLIENT,
        response_type: 'code',
        redirect_uri: REDIRECT_URI,
        state,
        resource: audience,
        scope: ['openid', options.scope].filter(Boolean).join(' '),
        code_challenge: createHash('sha256').update(verifier).digest('base64url'),
        code_challenge_method: 'S256',
      }).toString()
      let response = await jar.fetch(url)
      for (let step = 0; step < 10; step++) {
        const location = response.headers.get('location')
        if (!location)
          throw new Error(`authorization stopped at ${url.pathname}: ${response.status} ${await response.text()}`)
        url = new URL(location, url)
        if (url.href.startsWith(REDIRECT_URI)) {
          const code = url.searchParams.get('code')
          if (!code || url.searchParams.get('state') !== state) throw new Error(`authorization failed: ${url.search}`)
          return token(
            new URLSearchParams({
              grant_type: 'authorization_code',
              code,
              redirect_uri: REDIRECT_URI,
              code_verifier: verifier,
              client_id: APP_CLIENT,
            }),
            options,
          )
        }
        if (url.pathname.startsWith('/interaction/')) {
          const { prompt } = (await (await jar.fetch(url)).json()) as { prompt: string }
          const form: Record<string, string> = prompt === 'login' ? { prompt, login: accountId } : { prompt }
          response = await jar.fetch(url, { method: 'POST', body: new URLSearchParams(form) })
        } else {
          response = await jar.fetch(url)
        }
      }
      throw new Error('authorization did not reach the redirect URI in 10 steps')
    },

    sign(payload, options = {}) {
      const alg = options.alg ?? 'RS256'
      const key = keyFor(alg, options.kid)
      const kid = options.kid === null ? undefined : (options.kid ?? key.kid)
      const header = { alg, typ: 'at+jwt', kid, ...options.header }
      const input = `${base64url(JSON.stringify(header))}.${base64url(JSON.stringify(payload))}`
      const data = Buffer.from(input)
      const mac =
        alg === 'none'
          ? Buffer.alloc(0)
          : alg === 'HS256'
            ? createHmac('sha256', createPublicKey(key.privateKey).export({ format: 'pem', type: 'spki' }))
                .update(data)
                .digest()
            : signature(alg, key.privateKey, data)
      return `${input}.${base64url(mac)}`
    },

    publicJwks() {
      return { keys: keys.map((k) => ({ ...k.publicJwk })) }
    },

    privateJwks() {
      return { keys: keys.map((k) => ({ ...k.privateJwk })) }
    },

    async rotateKeys(options = {}) {
      const fresh = await Promise.all((options.algs ?? SIGNING_ALGS).map(makeSigningKey))
      const rotated = new Set(fresh.map((k) => k.alg))
      keys = [...fresh, ...(options.dropOld ? keys.filter((k) => !rotated.has(k.alg)) : keys)]
      provider = new Provider(issuer, configuration())
      callback = provider.callback()
    },

    start: listen,
    stop,
    close: stop,
  }
}
