import type { ApiKeyCache } from '../api-keys/key-cache.js'
import type { Logger } from '../../core/log.js'

// Whether what an instance remembers about credentials (its API key cache,
// its list of revocations) may be used: only while it can prove that it
// hears every change. Trust needs all of:
// - the listening connection is up: postgres.js keeps one and opens it again
//   after it drops; notifications sent while it was away are lost, so
// - the revocations were loaded from the table after that connection started
//   listening (whatever was missed is in the table), and the API key cache
//   started empty (it is emptied whenever trust comes back);
// - the last marker of this instance came back in time
//   (src/auth/revocation/change-markers.ts), and postgres.js can tell us when the
//   connection drops (src/core/db/listen-close.ts; `blind` otherwise).
// Work started under one connection must not grant trust under another:
// `connection` counts connections and losses, and each step says which one
// it was done for.

const NOT_YET = 'not listening yet'

export class CredentialTrust {
  /** Why nothing remembered may be used; undefined while trusted. */
  private distrust: string | undefined = NOT_YET
  private listening = false
  private blind = false
  private stalled = false
  private connection = 0
  private loadedFor = -1

  constructor(
    private readonly keys: ApiKeyCache,
    private readonly log: Logger,
    /** True while the service stops: the connection closing then is expected, not worth a warning. */
    private readonly quiet: () => boolean,
  ) {}

  get trusted(): boolean {
    return this.distrust === undefined
  }

  get reason(): string | undefined {
    return this.distrust
  }

  /** The connection current now: pass it to `loaded` and `delivered` for work that started now. */
  get current(): number {
    return this.connection
  }

  /** Whether the revocations must be loaded (again) for the current connection. */
  get needsLoad(): boolean {
    return this.loadedFor !== this.connection
  }

  /** Whether markers may be sent: listening, and able to tell a drop. */
  get hearing(): boolean {
    return this.listening && !this.blind
  }

  /** The listening connection is up (again). */
  listened(): void {
    if (this.blind) return
    this.connection++
    this.listening = true
  }

  /** The listening connection is down, or could not be opened. */
  away(fields?: Record<string, unknown>): void {
    this.connection++
    const was = this.listening
    this.listening = false
    if (was && !this.quiet()) this.log.warn('not listening for credential changes; the connection dropped', fields)
    this.set('not listening for credential changes')
  }

  /** postgres.js cannot tell us when the listening connection drops: never trusted. */
  cannotWatch(): void {
    this.blind = true
    this.set('cannot tell when the listening connection drops (postgres.js changed?)')
  }

  /** The revocations were loaded for `connection`. */
  loaded(connection: number): void {
    if (connection === this.connection) this.loadedFor = connection
  }

  /** A change too large to name, or one that could not be applied: the revocations are loaded again. */
  reload(reason: string): void {
    this.loadedFor = -1
    this.set(reason)
  }

  /** A marker sent under `connection` came back: everything before it was applied. */
  delivered(connection: number): void {
    if (connection === this.connection) this.stalled = false
    this.trustIfAllowed()
  }

  /** A marker of ours came back, late maybe: the connection delivers, in order. */
  markerHeard(): void {
    if (!this.stalled) return
    this.stalled = false
    this.trustIfAllowed()
  }

  /** A marker did not come back in time (`timeoutMs`), or could not be sent. */
  stall(timeoutMs: number): void {
    if (this.stalled || !this.listening) return
    this.stalled = true
    this.set(`a marker of this instance did not come back within ${timeoutMs} ms`)
    this.log.warn('the listener for credential changes did not hear this instance within the time-out', {
      timeout_ms: timeoutMs,
    })
  }

  private trustIfAllowed(): void {
    if (this.listening && !this.blind && this.loadedFor === this.connection && !this.stalled) this.set(undefined)
  }

  private set(reason: string | undefined): void {
    if (reason === this.distrust) return
    const was = this.distrust
    this.distrust = reason
    if (reason === undefined) {
      // Whatever was cached while distrusted may predate a change we missed.
      this.keys.resume()
      this.log[was === NOT_YET ? 'debug' : 'info'](
        'credential changes heard again; remembered credentials trusted (API key cache emptied and on)',
      )
    } else {
      this.keys.suspend()
      if (was === undefined && !this.quiet())
        this.log.warn(
          `not trusting remembered credentials: ${reason}; they are read from the database until this is resolved`,
        )
    }
  }
}
