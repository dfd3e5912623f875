import { withDeadline } from './lib/settled-by.js'
import { describeError, type Logger } from './log.js'

// Everything a service runs beside its requests (listeners, workers, the
// scheduler, the HTTP server itself) is a component, registered once when the
// service is created, started together, stopped together. Start goes in the
// order of registration and stop in the reverse (fastify's onClose hooks run
// that way), so a component may use, while it runs and while it stops, what
// was registered before it: the pool is registered first and ends last.

export interface Component {
  /** Names it in log lines (`component`). */
  readonly name: string
  /** Opens what it needs and starts its work; a throw fails start-up. Nothing may be opened before this. */
  start(): void | Promise<void>
  /**
   * Ends its work and closes what it holds, by `deadline` (a
   * performance.now() instant, maybe past already: then at once). Work still
   * under way then is cut, not waited for. Called whether or not `start`
   * was, or succeeded. A rejection is logged.
   */
  stop(deadline: number): void | Promise<void>
}

/** How long past the deadline the stops are waited for, all together, before the rest are only told to stop. */
const OVERRUN_MS = 500

export class Lifecycle {
  private readonly components: Component[] = []
  private stopping: Promise<void> | undefined
  /** The start of one component under way: a stop waits for it. */
  private starting: Promise<void> | undefined

  constructor(private readonly log: Logger) {}

  /** Adds a component, started after those registered before it and stopped before them. */
  register<C extends Component>(component: C): C {
    if (this.components.some((c) => c.name === component.name))
      throw new Error(`Lifecycle: two components are named ${component.name}`)
    this.components.push(component)
    return component
  }

  /** The components' names in the order they start. */
  get names(): string[] {
    return this.components.map((c) => c.name)
  }

  /**
   * Starts each component in registration order, each once its predecessor's
   * start resolved. When one fails, every component is stopped and the error
   * thrown; a stop meanwhile ends the start too (it rejects).
   */
  async start(): Promise<void> {
    for (const component of this.components) {
      if (this.stopping) break
      this.starting = Promise.resolve().then(() => component.start())
      try {
        await this.starting
      } catch (err) {
        this.starting = undefined
        await this.stop(performance.now())
        throw err
      }
      this.starting = undefined
      this.log.debug('component started', { component: component.name })
    }
    if (this.stopping) {
      await this.stopping
      throw new Error('Lifecycle: stopped while starting')
    }
  }

  /**
   * Stops every component in the reverse order, each given `deadline`; once
   * past it by OVERRUN_MS, a stop that has not resolved is left behind with
   * a warning. Never rejects; a second call joins the first.
   */
  stop(deadline: number): Promise<void> {
    this.stopping ??= this.stopAll(deadline)
    return this.stopping
  }

  private async stopAll(deadline: number): Promise<void> {
    const giveUpAt = deadline + OVERRUN_MS
    // A component starting now is stopped once its start is done, with the others.
    await this.starting?.catch(() => {})
    for (const component of [...this.components].reverse()) {
      const stopped = Promise.resolve()
        .then(() => component.stop(deadline))
        .then(
          () => true,
          (err: unknown) => {
            this.log.warn('stopping a component failed', { component: component.name, ...describeError(err) })
            return true
          },
        )
      const inTime = await withDeadline(stopped, giveUpAt - performance.now(), () => false)
      if (inTime) this.log.debug('component stopped', { component: component.name })
      else
        this.log.warn('a component did not stop by its deadline; the others stop without it', {
          component: component.name,
        })
    }
  }
}
