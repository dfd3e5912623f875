import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'

// Certificates for the tests that serve HTTPS (the service's own, nginx's 443
// server, the health check, the OpenID provider), made at test time with
// openssl: nothing secret is kept in the repository.

export interface TestCertificate {
  /** The PEM files. */
  cert: string
  key: string
  /** The PEM a client puts in its `ca` to trust this certificate. */
  pem: string
}

/** A certificate authority's PEM files. */
export interface CertificateAuthority {
  cert: string
  key: string
}

/**
 * A self-signed certificate for 127.0.0.1 with subject CN `cn` (ECDSA P-256 unless `rsa`), written into `dir` as
 * `name`.cert.pem and `name`.key.pem.
 */
export function selfSignedCertificate(dir: string, name: string, cn = name, rsa = false): TestCertificate {
  const cert = join(dir, `${name}.cert.pem`)
  const key = join(dir, `${name}.key.pem`)
  const keyArgs = rsa ? ['-newkey', 'rsa:2048'] : ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256']
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      ...keyArgs,
      '-nodes',
      '-keyout',
      key,
      '-out',
      cert,
      '-days',
      '2',
      '-subj',
      `/CN=${cn}`,
      '-addext',
      'subjectAltName=IP:127.0.0.1',
    ],
    { stdio: 'pipe' },
  )
  return { cert, key, pem: readFileSync(cert, 'utf8') }
}

/**
 * A certificate authority (ECDSA P-256), written into `dir` as
 * ca.cert.pem and ca.key.pem. test/run.ts makes one per run.
 */
export function createCertificateAuthority(dir: string): CertificateAuthority {
  const cert = join(dir, 'ca.cert.pem')
  const key = join(dir, 'ca.key.pem')
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-keyout',
      key,
      '-out',
      cert,
      '-days',
      '2',
      '-subj',
      '/CN=users-products-api test CA',
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign',
    ],
    { stdio: 'pipe' },
  )
  return { cert, key }
}

/**
 * The run's certificate authority, which test/run.ts creates and every test
 * process trusts through NODE_EXTRA_CA_CERTS. Node reads that variable only
 * when it starts, so a test file cannot set it up for itself.
 */
export function runCertificateAuthority(): CertificateAuthority {
  const { TEST_CA_CERT: cert, TEST_CA_KEY: key, NODE_EXTRA_CA_CERTS: trusted } = process.env
  if (!cert || !key || !trusted) {
    throw new Error(
      'no test certificate authority (TEST_CA_CERT, TEST_CA_KEY, NODE_EXTRA_CA_CERTS): run the tests through ' +
        'test/run.ts (`make test`, or `node --import tsx test/run.ts test/<file>.test.ts`), which creates it ' +
        'before Node starts',
    )
  }
  return { cert, key }
}

/** What a certificate from an authority is for, besides the defaults. */
export interface IssueOptions {
  /** Its subjectAltName entries; the default `IP:127.0.0.1, DNS:localhost`; empty: none. */
  names?: string[]
  /** A client's (clientAuth, CN `name`: PostgreSQL's `cert` method reads the role there), not a server's. */
  client?: boolean
}

/**
 * A certificate for 127.0.0.1 and localhost (ECDSA P-256) issued by `ca`
 * (by default the run's, which test processes trust without any `ca`
 * option), written into `dir` as `name`.cert.pem and `name`.key.pem; its
 * `pem` is the authority's.
 */
export function certificateFromAuthority(
  dir: string,
  name: string,
  ca: CertificateAuthority = runCertificateAuthority(),
  { names = ['IP:127.0.0.1', 'DNS:localhost'], client = false }: IssueOptions = {},
): TestCertificate {
  const cert = join(dir, `${name}.cert.pem`)
  const key = join(dir, `${name}.key.pem`)
  const request = join(dir, `${name}.csr.pem`)
  const extensions = join(dir, `${name}.ext.cnf`)
  writeFileSync(
    extensions,
    [
      'basicConstraints = critical, CA:FALSE',
      'keyUsage = critical, digitalSignature',
      `extendedKeyUsage = ${client ? 'clientAuth' : 'serverAuth'}`,
      ...(names.length ? [`subjectAltName = ${names.join(', ')}`] : []),
      'subjectKeyIdentifier = hash',
      'authorityKeyIdentifier = keyid',
    ].join('\n') + '\n',
  )
  execFileSync(
    'openssl',
    [
      'req',
      '-new',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-keyout',
      key,
      '-out',
      request,
      '-subj',
      `/CN=${name}`,
    ],
    { stdio: 'pipe' },
  )
  // A random serial: concurrent test files issue from the same authority, and a serial file beside it would race.
  execFileSync(
    'openssl',
    [
      'x509',
      '-req',
      '-in',
      request,
      '-CA',
      ca.cert,
      '-CAkey',
      ca.key,
      '-set_serial',
      `0x${randomBytes(16).toString('hex')}`,
      '-days',
      '2',
      '-extfile',
      extensions,
      '-out',
      cert,
    ],
    { stdio: 'pipe' },
  )
  return { cert, key, pem: readFileSync(ca.cert, 'utf8') }
}
