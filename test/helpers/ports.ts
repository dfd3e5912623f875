import { connect, createServer } from 'node:net'

// Ports for the real servers the tests start themselves (nginx, PgBouncer),
// which must be told a port rather than taking one of the kernel's choosing.

/** A port free on 127.0.0.1 now (the kernel's pick; another process could take it before the caller binds it). */
export async function freePort(): Promise<number> {
  const server = createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as { port: number }
  await new Promise((resolve) => server.close(resolve))
  return port
}

/**
 * A port below the kernel's ephemeral range (32768 and up), for a service
 * told its port that binds it some time after the choice: no socket of
 * another test, bound to port 0 or connecting out, can be given it meanwhile
 * (`freePort`'s pick can be, and was, on a busy machine).
 */
export const portBelowEphemeral = () => 20_000 + Math.floor(Math.random() * 12_000)

/** Whether something accepts TCP connections on 127.0.0.1:`port`. */
export function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1')
    socket.once('connect', () => (socket.destroy(), resolve(true)))
    socket.once('error', () => resolve(false))
  })
}
