import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'

// Certificates for the tests that serve HTTPS (the service's own, nginx's 443
// server, the health check), made at test time with openssl: nothing secret
// is kept in the repository.

export interface TestCertificate {
  /** The PEM files. */
  cert: string
  key: string
  /** The certificate's PEM, for a client's `ca`. */
  pem: string
}

/** A self-signed certificate for 127.0.0.1 with subject CN `cn` (ECDSA P-256 unless `rsa`), written into `dir` as `name`.cert.pem and `name`.key.pem. */
export function selfSignedCertificate(dir: string, name: string, cn = name, rsa = false): TestCertificate {
  const cert = join(dir, `${name}.cert.pem`)
  const key = join(dir, `${name}.key.pem`)
  const keyArgs = rsa ? ['-newkey', 'rsa:2048'] : ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256']
  execFileSync('openssl', ['req', '-x509', ...keyArgs, '-nodes', '-keyout', key, '-out', cert,
    '-days', '2', '-subj', `/CN=${cn}`, '-addext', 'subjectAltName=IP:127.0.0.1'], { stdio: 'pipe' })
  return { cert, key, pem: readFileSync(cert, 'utf8') }
}
