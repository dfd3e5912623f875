import type { IncomingMessage } from 'node:http'
import type { LogFields } from '../log.js'
import type { AnyRoute, HandlerContext } from './route.js'

/** A request as the application's stages see it. */
export interface StageRequest {
  readonly req: IncomingMessage
  /** The client's address, as TRUST_PROXY allows it to be known; read once per request. */
  client(): string
}

/**
 * The stages the application hands the pipeline (src/core/http/pipeline.ts):
 * who calls, how often, and whether it may (authentication, rate limits,
 * authorization). Core knows nothing of credentials or access: it runs
 * `check` once the route matched, before the request's input is read, and
 * asks the guard for what the answer, the handler and the log line need of
 * it. `State` is the guard's record of one request, made by `open` and kept
 * by the pipeline for the request's life, so that an answer refused halfway
 * through the checks still carries what they found (rate figures).
 */
export interface RequestGuard<State> {
  /** A request's record before any check. */
  open(): State
  /**
   * A route anyone may call with no check at all: it looks at no credential, and is still served while the service
   * drains (the probes).
   */
  isPublic(route: AnyRoute): boolean
  /**
   * Refuses by throwing a problem (HttpError), or by a promise that rejects
   * with one; records on `state` what it found. Undefined when it is done at
   * once (nothing to wait for: no promise on the hot path of a public route).
   */
  check(state: State, request: StageRequest, route: AnyRoute, params: Record<string, string>): Promise<void> | undefined
  /**
   * An operation of a batch, by the caller `check` admitted for the batch: it counts against the caller's rate
   * window (unless `counted`: the batch's own request stood for it) and the operation's route's access is checked.
   */
  admitOperation(
    state: State,
    request: StageRequest,
    route: AnyRoute,
    params: Record<string, string>,
    counted: boolean,
  ): void
  /** Sets the application's members of the handler's context (ContextExtensions, src/app-context.ts). */
  extend(ctx: HandlerContext<unknown, unknown>, state: State): void
  /**
   * Whom an Idempotency-Key belongs to: a stable name of the authenticated caller, or undefined when anonymous (the key
   * is then the address's).
   */
  caller(state: State): string | undefined
  /** Adds the headers every answer carries, errors included (rate figures). */
  answerHeaders(state: State, headers: Record<string, string>): void
  /** Adds what the request's log line says of the caller. */
  logFields(state: State, fields: LogFields): void
}
