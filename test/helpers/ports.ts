import { connect, createServer } from 'node:net'

// Ports for the real servers the tests start themselves (nginx, PgBouncer),
// which must be told a port rather than taking one of the kernel's choosing.

/** A port free on 127.0.0.1 now (the kernel's pick; another process could take it before the caller binds it). */
export async function freePort(): Promise<number> {
  const [port] = await freePorts(1)
  return port!
}

/** `count` distinct ports free on 127.0.0.1 now (held together while chosen, so never one twice). */
export async function freePorts(count: number): Promise<number[]> {
  const servers = Array.from({ length: count }, () => createServer())
  await Promise.all(servers.map((server) => new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))))
  const ports = servers.map((server) => (server.address() as { port: number }).port)
  await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))))
  return ports
}

/** Thrown by a server program's start when one of its ports was taken before it could bind it. */
export class PortTaken extends Error {}

/**
 * A server program told its ports (nginx, PgBouncer, exim): `start` with `count` ports free now, and again with
 * others when it throws PortTaken, as it must when the program says so; another process may be given a port
 * between its choice and the program's bind. `start` must also make sure it is its program that listens there.
 */
export async function onFreePorts<T>(count: number, start: (ports: number[]) => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await start(await freePorts(count))
    } catch (err) {
      if (!(err instanceof PortTaken) || attempt === 3) throw err
    }
  }
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
