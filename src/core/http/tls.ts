import { readFileSync, statSync } from 'node:fs'
import type { Server as HttpsServer } from 'node:https'
import type { SecureContextOptions } from 'node:tls'
import { ConfigError } from '../config-error.js'
import { describeError, type Logger } from '../log.js'
import type { JobSpec } from '../scheduler.js'

// HTTPS without a proxy (TLS_CERT_FILE, TLS_KEY_FILE): Mozilla's
// "intermediate" configuration (TLS 1.2 with forward secrecy and AEAD
// ciphers only, and TLS 1.3), and the certificate read again when its files
// change (a renewal by certbot or a mounted secret), without a restart:
// connections open keep the certificate they started with, new ones get the
// new one.

export interface TlsFiles {
  certFile: string
  keyFile: string
}

const MIN_VERSION = 'TLSv1.2'
/**
 * Mozilla's intermediate list (v5.7) without its DHE suites, which would
 * need Diffie-Hellman parameters of our own: for TLS 1.2, ECDHE key exchange
 * (forward secrecy) with AES-GCM or ChaCha20-Poly1305 (no CBC, no static RSA
 * key exchange). The TLS 1.3 suites are named too: Node turns TLS 1.3 off
 * when the list has none.
 */
const CIPHERS = [
  'TLS_AES_128_GCM_SHA256',
  'TLS_AES_256_GCM_SHA384',
  'TLS_CHACHA20_POLY1305_SHA256',
  'ECDHE-ECDSA-AES128-GCM-SHA256',
  'ECDHE-RSA-AES128-GCM-SHA256',
  'ECDHE-ECDSA-AES256-GCM-SHA384',
  'ECDHE-RSA-AES256-GCM-SHA384',
  'ECDHE-ECDSA-CHACHA20-POLY1305',
  'ECDHE-RSA-CHACHA20-POLY1305',
].join(':')
/** How often the files' modification times are looked at. */
const WATCH_INTERVAL_MS = 1000

export type TlsOptions = SecureContextOptions & {
  minVersion: typeof MIN_VERSION
  ciphers: string
  honorCipherOrder: boolean
}

/** The server's TLS options from the files; a file that cannot be read stops start-up naming its variable. */
export function tlsOptions(files: TlsFiles): TlsOptions {
  const read = (path: string, variable: string) => {
    try {
      return readFileSync(path)
    } catch (err) {
      throw new ConfigError(`${variable}: cannot read ${path} (${(err as NodeJS.ErrnoException).code ?? 'error'})`)
    }
  }
  return {
    cert: read(files.certFile, 'TLS_CERT_FILE'),
    key: read(files.keyFile, 'TLS_KEY_FILE'),
    minVersion: MIN_VERSION,
    ciphers: CIPHERS,
    // Every suite listed is strong, so the client picks (Mozilla's advice): one without AES hardware prefers ChaCha20.
    honorCipherOrder: false,
  }
}

/** What tells that a file changed: a renewal writes it, or renames another over it. */
const signature = (path: string): string => {
  try {
    const { mtimeMs, size, ino } = statSync(path)
    return `${mtimeMs} ${size} ${ino}`
  } catch {
    return 'unreadable'
  }
}

/**
 * The job that reloads the certificate whenever either file changes, looked
 * at every WATCH_INTERVAL_MS (a rename over the file is seen too). A pair
 * that does not load (a key and a certificate that do not match while a
 * renewal writes them one after the other) leaves the current certificate
 * in place until the next change.
 */
export function certificateReloadJob(server: HttpsServer, files: TlsFiles, log: Logger): JobSpec<void> {
  const seen = () => `${signature(files.certFile)}|${signature(files.keyFile)}`
  let last = seen()
  return {
    name: 'tls.certificate-reload',
    periodMs: WATCH_INTERVAL_MS,
    async run() {
      const now = seen()
      if (now === last) return
      last = now
      try {
        server.setSecureContext(tlsOptions(files))
        log.info('TLS certificate reloaded', { cert_file: files.certFile })
      } catch (err) {
        log.warn('TLS certificate not reloaded; the current one stays', {
          cert_file: files.certFile,
          ...describeError(err),
        })
      }
    },
  }
}
