import type { ServerResponse } from 'node:http'
import type { Grant, GrantEnd } from '../auth/grants.js'
import { SSE_KEEP_ALIVE } from './sse.js'

// One client of GET /events/stream: its response, the types it wants, and
// how far it has got. Writes never queue without bound: live events are
// written as they come, and a client that lets more than `bufferLimitBytes`
// wait in Node is disconnected (it resumes from its last id); catch-up
// events are written at the client's pace, waiting for 'drain'.

/** How long a stream ended cleanly may take to flush its last chunk before its connection is cut. */
const END_GRACE_MS = 500
/** Bytes waiting in Node past which a stream is cut rather than ended: four times Node's default high-water mark. */
const LINGER_BYTES = 64 * 1024

/** Why a stream ended; a GrantEnd when its authority ended (src/events/stream-authority.ts). */
export type StreamEnd = 'client_closed' | 'too_slow' | 'shutdown' | 'database_error' | GrantEnd

export class EventStream {
  /** Every event up to this id has been sent or passed over (another type). */
  position = 0
  /** Something was written since the last heartbeat tick. */
  wrote = false
  /** Events written, for the line logged at the end. */
  sent = 0
  /** Why the server ended it; undefined while open, or when the client left. */
  ended: StreamEnd | undefined
  readonly opened = performance.now()
  /**
   * When the last check of its authority that it passed started
   * (performance.now()); events read before then may be sent.
   */
  checkedAt = -Infinity

  constructor(
    readonly res: ServerResponse,
    readonly requestId: string,
    /** The event types wanted; every type when undefined. */
    readonly types: ReadonlySet<string> | undefined,
    /** The authority it was opened with, checked again while it is open. */
    readonly grant: Grant,
    private readonly bufferLimitBytes: number,
  ) {}

  get closed(): boolean {
    return this.ended !== undefined || this.res.destroyed
  }

  private wants(type: string): boolean {
    return this.types === undefined || this.types.has(type)
  }

  /** The stream's first line. */
  start(line: string): void {
    if (this.closed) return
    this.res.write(line)
    this.wrote = true
  }

  /**
   * A live event from the hub, which fans out in commit order: one at or
   * below the position was sent by the catch-up already, or passed over.
   */
  deliver(id: number, type: string, frame: string): void {
    if (id <= this.position) return
    this.position = id
    if (this.wants(type)) this.push(frame)
  }

  /** A client that has too much waiting is cut. */
  private push(frame: string): void {
    if (this.closed) return
    this.res.write(frame)
    this.wrote = true
    this.sent++
    this.cutIfTooSlow()
  }

  /** A catch-up event, at the client's pace: resolves once Node can take more (or the stream closed). */
  pace(frame: string): Promise<void> | undefined {
    if (this.closed) return undefined
    this.wrote = true
    this.sent++
    if (this.res.write(frame)) return undefined
    return new Promise((resolve) => {
      const done = () => {
        this.res.off('drain', done).off('close', done)
        resolve()
      }
      this.res.on('drain', done).on('close', done)
    })
  }

  /** The heartbeat tick: a comment when nothing else was written since the last tick. */
  beat(): void {
    if (!this.wrote && !this.closed) {
      this.res.write(SSE_KEEP_ALIVE)
      this.cutIfTooSlow()
    }
    this.wrote = false
  }

  /**
   * Ends the stream: cleanly (the chunked body's last chunk, then FIN), so
   * the client sees a complete answer and reconnects, when it is keeping up;
   * at once when more is waiting than a client that keeps up ever has
   * (catch-up waits for 'drain' past Node's high-water mark), since a client
   * that does not read would hold the connection, and a server's drain, for
   * as long as it likes.
   */
  end(why: StreamEnd): void {
    if (this.closed) return
    this.ended = why
    const { res } = this
    if (why === 'too_slow' || res.writableLength > LINGER_BYTES) return void res.destroy()
    // Taken now: the response lets go of its socket when it finishes.
    const socket = res.socket
    res.end()
    res.once('finish', () => socket?.destroySoon())
    // Little waited in Node, but the kernel's buffer may be full of what a
    // client no longer reads, and then the last chunk never leaves: cut it.
    if (!socket) return
    const cut = setTimeout(() => socket.destroy(), END_GRACE_MS).unref()
    socket.once('close', () => clearTimeout(cut))
  }

  private cutIfTooSlow(): void {
    if (this.res.writableLength > this.bufferLimitBytes) this.end('too_slow')
  }
}
