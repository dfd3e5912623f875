import type { ServerResponse } from 'node:http'
import { SSE_KEEP_ALIVE } from './sse.js'

// One client of GET /events/stream: its response, the types it wants, and
// how far it has got. Writes never queue without bound: live events are
// written as they come, and a client that lets more than `bufferLimitBytes`
// wait in Node is disconnected (it resumes from its last id); catch-up
// events are written at the client's pace, waiting for 'drain'.

export type StreamEnd = 'client_closed' | 'too_slow' | 'shutdown' | 'database_error'

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

  constructor(
    readonly res: ServerResponse,
    readonly requestId: string,
    /** The event types wanted; every type when undefined. */
    readonly types: ReadonlySet<string> | undefined,
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
   * Ends the stream. Cleanly (the chunked body's last chunk, then FIN) when
   * nothing is waiting to be sent, so the client sees a complete answer and
   * reconnects; at once when data is still waiting, since a client that does
   * not read would hold the connection (and a server's drain) open for as
   * long as it likes.
   */
  end(why: StreamEnd): void {
    if (this.closed) return
    this.ended = why
    const { res } = this
    if (why === 'too_slow' || res.writableLength > 0) return void res.destroy()
    // Taken now: the response lets go of its socket when it finishes.
    const socket = res.socket
    res.end()
    res.once('finish', () => socket?.destroySoon())
  }

  private cutIfTooSlow(): void {
    if (this.res.writableLength > this.bufferLimitBytes) this.end('too_slow')
  }
}
