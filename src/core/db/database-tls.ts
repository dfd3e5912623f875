import { X509Certificate } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { checkServerIdentity, createSecureContext, type ConnectionOptions } from 'node:tls'
import { ConnectionStringError, isAddress, parseConnectionString, type ConnectionString } from './connection-string.js'

// TLS to PostgreSQL with libpq's meanings of sslmode (PostgreSQL's
// documentation, "SSL Support", table "SSL Mode Descriptions"), as
// postgres.js's `ssl` option:
// - disable: no TLS;
// - allow, prefer: TLS when the server offers it, nothing checked (postgres.js's
//   'prefer' asks first and goes on in plain text when the server says no;
//   libpq's allow would try plain text first, which ends the same way but where
//   the server takes both);
// - require: TLS, no certificate check; but with sslrootcert the chain is
//   checked, as libpq does for a root file it finds (verify-ca);
// - verify-ca: the chain must lead to sslrootcert (or, without it, to a CA
//   this process trusts: Node's bundled list plus NODE_EXTRA_CA_CERTS), any
//   host name;
// - verify-full: that, and the certificate must name the host connected to.
// Where libpq reads ~/.postgresql/root.crt, postgresql.crt and .key when
// nothing is given, the service reads nothing it was not given: without
// sslrootcert it trusts what Node trusts. allow and prefer with a certificate
// file given require TLS (libpq would fall back to plain text when the check
// fails, which would make the check pointless).

/** postgres.js's `ssl` option for `settings`; reads and checks the files it names (ConnectionStringError). */
export function tlsOptions(settings: ConnectionString): false | 'prefer' | ConnectionOptions {
  const { sslmode, sslrootcert, sslcert, socket } = settings
  if (socket || sslmode === 'disable') return false
  if ((sslmode === 'allow' || sslmode === 'prefer') && !sslrootcert && !sslcert) return 'prefer'
  const checked = sslmode === 'verify-ca' || sslmode === 'verify-full' || sslrootcert !== undefined
  const options: ConnectionOptions = {
    rejectUnauthorized: checked,
    ...(sslrootcert && sslrootcert !== 'system' ? { ca: authorities(sslrootcert) } : {}),
    ...clientCertificate(settings),
    ...(settings.sslMinProtocolVersion ? { minVersion: settings.sslMinProtocolVersion } : {}),
    ...(settings.sslMaxProtocolVersion ? { maxVersion: settings.sslMaxProtocolVersion } : {}),
  }
  if (checked && sslmode !== 'verify-full') options.checkServerIdentity = () => undefined
  else if (sslmode === 'verify-full') options.checkServerIdentity = hostCheck(settings.hosts)
  try {
    createSecureContext(options)
  } catch (err) {
    throw new ConnectionStringError(keyProblem(settings, err))
  }
  return options
}

/**
 * The host name check. Node checks the name postgres.js sends as SNI, which it
 * sends for host names only: for an address it would check "localhost", and
 * a certificate for localhost would pass for any address. One host is checked
 * by name; several must all be names (each is then its own SNI).
 */
function hostCheck(hosts: readonly string[]): ConnectionOptions['checkServerIdentity'] {
  if (hosts.length === 1) return (_sni, cert) => checkServerIdentity(hosts[0]!, cert)
  const address = hosts.find(isAddress)
  if (address)
    throw new ConnectionStringError(
      `sslmode=verify-full with several hosts needs host names, not addresses (${address}): the name checked is ` +
        'the one sent as SNI, which an address never is',
    )
  return checkServerIdentity
}

function readPem(parameter: string, path: string): string {
  try {
    return readFileSync(path, 'utf8')
  } catch (err) {
    const { code } = err as NodeJS.ErrnoException
    const why =
      code === 'ENOENT'
        ? 'no such file'
        : code === 'EACCES'
          ? 'permission denied'
          : code === 'EISDIR'
            ? 'a directory, not a file'
            : (code ?? String(err))
    throw new ConnectionStringError(`${parameter}: cannot read ${path} (${why})`)
  }
}

/** The certificates of a PEM bundle (a provider's CA bundle holds several); Node would ignore anything else. */
function authorities(path: string): string[] {
  const text = readPem('sslrootcert', path)
  const pems = text.match(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g) ?? []
  if (!pems.length) throw new ConnectionStringError(`sslrootcert: ${path} holds no PEM certificate`)
  for (const pem of pems) {
    try {
      new X509Certificate(pem)
    } catch {
      throw new ConnectionStringError(`sslrootcert: ${path} holds a certificate that does not parse`)
    }
  }
  return pems
}

function clientCertificate({ sslcert, sslkey, sslpassword }: ConnectionString): ConnectionOptions {
  if (!sslcert || !sslkey) return {}
  return {
    cert: readPem('sslcert', sslcert),
    key: readPem('sslkey', sslkey),
    ...(sslpassword !== undefined ? { passphrase: sslpassword } : {}),
  }
}

/** Why OpenSSL refused the client certificate and key (createSecureContext's error), naming the files. */
function keyProblem({ sslcert, sslkey, sslpassword }: ConnectionString, err: unknown): string {
  const code = (err as { code?: string }).code ?? ''
  if (code === 'ERR_OSSL_X509_KEY_VALUES_MISMATCH') return `sslkey: ${sslkey} is not the key of sslcert ${sslcert}`
  if (code === 'ERR_OSSL_BAD_DECRYPT')
    return (
      `sslkey: ${sslkey} is encrypted, and ` +
      (sslpassword === undefined ? 'no sslpassword is given' : 'sslpassword does not open it')
    )
  if (code === 'ERR_OSSL_PEM_NO_START_LINE') return `sslcert: ${sslcert} is not a PEM certificate`
  if (code === 'ERR_OSSL_UNSUPPORTED') return `sslkey: ${sslkey} is not a PEM private key`
  return `sslcert ${sslcert} and sslkey ${sslkey}: OpenSSL refuses them (${code || String(err)})`
}

/** OpenSSL's verdicts on a chain that leads to no trusted CA. */
const UNTRUSTED: ReadonlySet<string> = new Set([
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'CERT_UNTRUSTED',
  'CERT_SIGNATURE_FAILURE',
  'INVALID_CA',
  'CERT_REJECTED',
])

/** OpenSSL's other verdicts on a certificate (Node's `err.code`, from X509_verify_cert_error_string). */
const REFUSED: ReadonlySet<string> = new Set([
  'CERT_HAS_EXPIRED',
  'CERT_NOT_YET_VALID',
  'CERT_REVOKED',
  'CERT_CHAIN_TOO_LONG',
  'PATH_LENGTH_EXCEEDED',
  'INVALID_PURPOSE',
  'HOSTNAME_MISMATCH',
  'ERROR_IN_CERT_NOT_BEFORE_FIELD',
  'ERROR_IN_CERT_NOT_AFTER_FIELD',
  'UNABLE_TO_DECRYPT_CERT_SIGNATURE',
  'UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY',
])

/** Node's message when the server closes the connection in the middle of the handshake. */
const CLOSED_IN_HANDSHAKE = 'before secure TLS connection was established'

/** Whether `code` (an error's) is a TLS failure: a certificate refused, a handshake that failed. */
export const isTlsFailure = (code: string): boolean =>
  UNTRUSTED.has(code) || REFUSED.has(code) || code.startsWith('ERR_SSL_') || code.startsWith('ERR_TLS_')

/**
 * Why TLS to the server failed, in words naming what to change (sslrootcert
 * and its path, the host name the certificate does not hold), or undefined
 * when `err` is no TLS failure. `settings` are those of the URL connected with.
 */
export function tlsFailure(err: Error, settings: ConnectionString | undefined): string | undefined {
  const {
    code = '',
    reason,
    host,
    cert,
  } = err as Error & {
    code?: string
    reason?: string
    host?: string
    cert?: { subjectaltname?: string; subject?: { CN?: string } }
  }
  const rootcert = settings?.sslrootcert
  if (UNTRUSTED.has(code)) {
    return rootcert && rootcert !== 'system'
      ? `the server's certificate is not signed by sslrootcert (${rootcert}): give the CA bundle of the server's ` +
          `provider there (${code})`
      : "the server's certificate is not signed by a CA this process trusts (Node's bundled list and " +
          `NODE_EXTRA_CA_CERTS): give the CA bundle of the server's provider as sslrootcert (${code})`
  }
  if (code === 'CERT_HAS_EXPIRED')
    return `the server's certificate, or a CA certificate above it, has expired (${code})`
  if (code === 'CERT_NOT_YET_VALID')
    return `the server's certificate is not valid yet: is this machine's clock right? (${code})`
  if (code === 'ERR_TLS_CERT_ALTNAME_INVALID') {
    const names = cert?.subjectaltname ?? (cert?.subject?.CN ? `CN=${cert.subject.CN}` : 'no name')
    return (
      `the server's certificate does not match host "${host}" (it names ${names}): connect by a name it holds ` +
      `(sslmode=verify-full checks it) (${code})`
    )
  }
  if (REFUSED.has(code)) return `the server's certificate is refused: ${err.message} (${code})`
  if (code.startsWith('ERR_SSL_') && /alert/.test(reason ?? '')) {
    return settings?.sslcert
      ? `the server refused the client certificate (sslcert ${settings.sslcert}): ${reason} (${code})`
      : `the server ended the TLS handshake: ${reason} (${code})`
  }
  if (code.startsWith('ERR_SSL_') || code.startsWith('ERR_TLS_'))
    return `TLS failed: ${reason ?? err.message} (${code})`
  if (code === 'ECONNRESET' && err.message.includes(CLOSED_IN_HANDSHAKE) && settings) {
    return (
      `the server closed the connection before TLS was set up: does it accept TLS (ssl = on)? ` +
      `sslmode=${settings.sslmode} needs it (${code})`
    )
  }
  return undefined
}

/** What makes `url` unusable (it does not parse, a file it names cannot be read or used), or undefined. */
export function connectionStringProblem(url: string): string | undefined {
  try {
    tlsOptions(parseConnectionString(url))
    return undefined
  } catch (err) {
    if (err instanceof ConnectionStringError) return err.message
    throw err
  }
}
