// Workers accept their own connections: each listens on a socket of its own
// with SO_REUSEPORT, and the kernel spreads new connections among them by a
// hash of their addresses. node:cluster's alternative, the primary accepting
// every connection and handing it to a worker over IPC, waits for a reply
// from the worker's event loop before it hands that worker the next: under
// a burst of a thousand connections to busy workers the last ones waited
// seconds (docs/scaling.md, "WORKERS", has both measured).
//
// SO_REUSEPORT lets any process of the same user join the port silently, so
// the port is first claimed alone (`claimPort`, src/claim-port.ts): while
// the service's workers hold it, a second copy started on it fails there
// with EADDRINUSE, as it does without WORKERS.

/** Node lines with `reusePort` on `listen`: 22.12 and later, 23.1 and later, every later line. */
const SINCE: Record<number, number> = { 22: 12, 23: 1 }
/** Where libuv spreads connections among SO_REUSEPORT sockets (elsewhere it refuses the option). */
const PLATFORMS: ReadonlySet<string> = new Set(['linux', 'freebsd', 'sunos', 'aix'])

/** Why this Node on this platform cannot run several workers on one port; undefined when it can. */
export function reusePortMissing(
  version = process.versions.node,
  platform: string = process.platform,
): string | undefined {
  if (!PLATFORMS.has(platform))
    return (
      `several processes on one port need SO_REUSEPORT with load balancing (Linux, FreeBSD, Solaris, AIX), ` +
      `which ${platform} does not have`
    )
  const [major = 0, minor = 0] = version.split('.').map(Number)
  if (major < 22 || minor < (SINCE[major] ?? 0))
    return `several processes on one port need Node.js 22.12 or later (listen's reusePort), and this is ${version}`
  return undefined
}
