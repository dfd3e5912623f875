import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { X509Certificate } from 'node:crypto'
import { mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import { Agent, request } from 'node:https'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { TLSSocket } from 'node:tls'
import { after, test } from 'node:test'
import { setTimeout as sleep } from 'node:timers/promises'
import { loadConfig, ConfigError } from '../src/config.js'
import { startServer } from './helpers/server.js'

// HTTPS without a proxy: TLS_CERT_FILE and TLS_KEY_FILE serve TLS 1.2 or
// later with HSTS, and a certificate renewed on disk is served to new
// connections within seconds, while a connection already open keeps going.
// Certificates are made at test time with openssl.

const dir = mkdtempSync(join(tmpdir(), 'upa-tls-'))
after(() => rmSync(dir, { recursive: true, force: true }))

/** A self-signed certificate for 127.0.0.1 and its key, as PEM files under `name`; the certificate's PEM. */
function makeCertificate(name: string, cn: string): { cert: string; key: string; pem: string } {
  const cert = join(dir, `${name}.cert.pem`)
  const key = join(dir, `${name}.key.pem`)
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', key, '-out', cert,
    '-days', '2', '-subj', `/CN=${cn}`, '-addext', 'subjectAltName=IP:127.0.0.1'], { stdio: 'pipe' })
  return { cert, key, pem: readFileSync(cert, 'utf8') }
}

const first = makeCertificate('first', 'first')
const second = makeCertificate('second', 'second')
// The files the service reads; a renewal replaces them.
const certFile = join(dir, 'cert.pem')
const keyFile = join(dir, 'key.pem')
writeFileSync(certFile, first.pem)
writeFileSync(keyFile, readFileSync(first.key))

const api = await startServer({ TLS_CERT_FILE: certFile, TLS_KEY_FILE: keyFile })
const port = new URL(api.url).port
const ca = [first.pem, second.pem]

/** The subject CN of the certificate each connection was given, recorded when it was set up (a reused connection has no handshake). */
const certificateOf = new WeakMap<object, string>()

/** GET /healthz over HTTPS; the answer and the certificate the server presented on its connection. */
function get(options: { agent?: Agent; maxVersion?: 'TLSv1.1' | 'TLSv1.2' | 'TLSv1.3' } = {}): Promise<{ status: number; headers: Record<string, unknown>; certificateCn: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path: '/healthz', ca, agent: options.agent ?? false, ...(options.maxVersion ? { maxVersion: options.maxVersion } : {}) }, (res) => {
      const socket = res.socket as TLSSocket
      if (!certificateOf.has(socket)) certificateOf.set(socket, new X509Certificate(socket.getPeerCertificate().raw).subject.replace(/^CN=/, ''))
      res.resume()
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, certificateCn: certificateOf.get(socket)! }))
    })
    req.on('error', reject)
    req.end()
  })
}

test('serves HTTPS with the configured certificate and sends HSTS', async () => {
  const res = await get()
  assert.equal(res.status, 200)
  assert.equal(res.certificateCn, 'first')
  assert.equal(res.headers['strict-transport-security'], 'max-age=31536000')
})

test('refuses a client that offers no more than TLS 1.1', async () => {
  await assert.rejects(get({ maxVersion: 'TLSv1.1' }))
})

test('a renewed certificate reaches new connections without a restart; an open connection keeps going', async () => {
  const agent = new Agent({ keepAlive: true, maxSockets: 1, ca })
  after(() => agent.destroy())
  assert.equal((await get({ agent })).certificateCn, 'first')

  // A renewal as certbot does it: new files renamed over the old ones.
  writeFileSync(`${keyFile}.new`, readFileSync(second.key))
  writeFileSync(`${certFile}.new`, second.pem)
  renameSync(`${keyFile}.new`, keyFile)
  renameSync(`${certFile}.new`, certFile)

  let renewed = ''
  for (const deadline = Date.now() + 10_000; renewed !== 'second' && Date.now() < deadline;) {
    renewed = (await get()).certificateCn
    if (renewed !== 'second') await sleep(200)
  }
  assert.equal(renewed, 'second', 'new connections get the new certificate')
  const kept = await get({ agent })
  assert.equal(kept.status, 200, 'the connection opened before the renewal still answers')
  assert.equal(kept.certificateCn, 'first')
  assert.ok(api.logs.some((l) => l.msg === 'TLS certificate reloaded'))
})

test('a key that does not match the certificate (half a renewal) leaves the current certificate in place', async () => {
  writeFileSync(keyFile, readFileSync(first.key))
  await sleep(2500)
  const res = await get()
  assert.equal(res.status, 200)
  assert.equal(res.certificateCn, 'second')
  assert.ok(api.logs.some((l) => l.msg === 'TLS certificate not reloaded; the current one stays'))
  writeFileSync(keyFile, readFileSync(second.key))
})

test('TLS_CERT_FILE and TLS_KEY_FILE go together, and files that cannot be read stop start-up naming the variable', async () => {
  assert.throws(() => loadConfig({ TLS_CERT_FILE: certFile }), (err: unknown) => err instanceof ConfigError && /TLS_CERT_FILE and TLS_KEY_FILE/.test(err.message))
  await assert.rejects(startServer({ TLS_CERT_FILE: join(dir, 'missing.pem'), TLS_KEY_FILE: keyFile }), (err: unknown) => err instanceof ConfigError && /^TLS_CERT_FILE: cannot read/.test(err.message))
})
