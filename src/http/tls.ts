import { readFileSync, unwatchFile, watchFile } from 'node:fs'
import type { Server as HttpsServer } from 'node:https'
import type { SecureContextOptions } from 'node:tls'
import { ConfigError } from '../config.js'
import { describeError, type Logger } from '../log.js'

// HTTPS without a proxy (TLS_CERT_FILE, TLS_KEY_FILE): TLS 1.2 at least,
// and the certificate read again when its files change (a renewal by
// certbot or a mounted secret), without a restart: connections open keep
// the certificate they started with, new ones get the new one.

export interface TlsFiles {
  certFile: string
  keyFile: string
}

const MIN_VERSION = 'TLSv1.2'
/** How often the files' modification times are looked at; watchFile polls, which also sees a file replaced by a rename. */
const WATCH_INTERVAL_MS = 1000

export type TlsOptions = SecureContextOptions & { minVersion: typeof MIN_VERSION }

/** The server's TLS options from the files; a file that cannot be read stops start-up naming its variable. */
export function tlsOptions(files: TlsFiles): TlsOptions {
  const read = (path: string, variable: string) => {
    try {
      return readFileSync(path)
    } catch (err) {
      throw new ConfigError(`${variable}: cannot read ${path} (${(err as NodeJS.ErrnoException).code ?? 'error'})`)
    }
  }
  return { cert: read(files.certFile, 'TLS_CERT_FILE'), key: read(files.keyFile, 'TLS_KEY_FILE'), minVersion: MIN_VERSION }
}

/**
 * Reloads the certificate whenever either file changes; returns the
 * function that stops watching. A pair that does not load (a key and a
 * certificate that do not match while a renewal writes them one after the
 * other) leaves the current certificate in place until the next change.
 */
export function watchCertificate(server: HttpsServer, files: TlsFiles, log: Logger): () => void {
  const reload = () => {
    try {
      server.setSecureContext(tlsOptions(files))
      log.info('TLS certificate reloaded', { cert_file: files.certFile })
    } catch (err) {
      log.warn('TLS certificate not reloaded; the current one stays', { cert_file: files.certFile, ...describeError(err) })
    }
  }
  const options = { interval: WATCH_INTERVAL_MS, persistent: false }
  watchFile(files.certFile, options, reload)
  watchFile(files.keyFile, options, reload)
  return () => {
    unwatchFile(files.certFile, reload)
    unwatchFile(files.keyFile, reload)
  }
}
