import Type, { type TSchema } from 'typebox'
// The one error type of the HTTP layer. Anything thrown that is not an
// HttpError becomes a 500 `internal_error` whose details stay in the log.
// Codes are the stable contract with clients; titles are for humans.

/** What a problem code stands for: a code always answers with the same status and title. */
export interface ProblemType {
  status: number
  title: string
  /** Extension members its bodies carry (RFC 9457 §3.2), for the OpenAPI document. */
  members?: Readonly<Record<string, TSchema>>
}

/** Every code a service may answer with, and what each stands for. */
export type ProblemTable = Readonly<Record<string, ProblemType>>

// Codes are declared once, by whoever owns them: core's below, the
// application's where it wires itself, each resource's unique constraints by
// its declaration. Each service joins those it has into its own table (its
// registry, src/registry.ts), which answers every HttpError it throws: no
// table is the process's, so two services in one process may differ.

/**
 * One table of `sources`; a code in two of them must mean the same thing there, else this throws (two owners disagree).
 */
export function problemTable(...sources: ProblemTable[]): ProblemTable {
  const table: Record<string, ProblemType> = {}
  for (const source of sources) {
    for (const [code, type] of Object.entries(source)) {
      if (!/^[a-z][a-z0-9_]*$/.test(code))
        throw new Error(`problem code "${code}": lower case letters, digits and _ only`)
      const known = table[code]
      if (known && (known.status !== type.status || known.title !== type.title)) {
        throw new Error(
          `problem code "${code}" is registered ` +
            `as ${known.status} "${known.title}", not ${type.status} "${type.title}"`,
        )
      }
      table[code] = { status: type.status, title: type.title }
    }
  }
  return Object.freeze(table)
}

/** Core's own codes: malformed requests, conditions, limits, the database, stopping. */
export const coreProblems: ProblemTable = {
  malformed_json: { status: 400, title: 'Malformed JSON' },
  invalid_parameter: { status: 400, title: 'Invalid query parameter' },
  unknown_parameter: { status: 400, title: 'Unknown query parameter' },
  invalid_request: { status: 400, title: 'Invalid request' },
  request_timeout: { status: 408, title: 'Request timeout' },
  headers_too_large: { status: 431, title: 'Request header fields too large' },
  not_found: { status: 404, title: 'Not found' },
  method_not_allowed: { status: 405, title: 'Method not allowed' },
  idempotency_key_in_use: { status: 409, title: 'Idempotency key in use' },
  precondition_failed: { status: 412, title: 'Precondition failed' },
  payload_too_large: { status: 413, title: 'Payload too large' },
  unsupported_media_type: { status: 415, title: 'Unsupported media type' },
  validation_failed: { status: 422, title: 'Validation failed' },
  not_batchable: {
    status: 422,
    title: 'Not an operation a batch may run',
    members: {
      operation: Type.Integer({
        minimum: 0,
        description: 'POST /batch, whatever the code: the index of the operation that failed (nothing was changed)',
      }),
    },
  },
  idempotency_key_reused: { status: 422, title: 'Idempotency key reused' },
  precondition_required: { status: 428, title: 'Precondition required' },
  rate_limited: { status: 429, title: 'Too many requests' },
  internal_error: { status: 500, title: 'Internal server error' },
  database_unavailable: { status: 503, title: 'Database unavailable' },
  shutting_down: { status: 503, title: 'Shutting down' },
}

/** A member of `errors`: a JSON Pointer into the body, or a query parameter's name. */
export interface FieldError {
  path: string
  message: string
}

/** An answer by its code: the service's problem table gives its status and title (a site names the code only). */
export class HttpError extends Error {
  constructor(
    readonly code: string,
    readonly detail: string,
    readonly options: {
      errors?: FieldError[]
      headers?: Record<string, string>
      /** Members of this problem type beyond the standard ones (RFC 9457 §3.2), such as a login's mfa_token. */
      extensions?: Readonly<Record<string, unknown>>
    } = {},
  ) {
    super(detail)
    this.name = 'HttpError'
  }
}

export const notFound = () => new HttpError('not_found', 'No resource at this address.')

/** 422 for request bodies; `errors` carries every field problem found. */
export function validationFailed(errors: FieldError[]): HttpError {
  const detail = errors.map((e) => `${e.path || '/'}: ${e.message}`).join('; ')
  return new HttpError('validation_failed', detail, { errors })
}

export function invalidParameter(
  name: string,
  message: string,
  code: 'invalid_parameter' | 'unknown_parameter' = 'invalid_parameter',
): HttpError {
  return new HttpError(code, `${name}: ${message}`, { errors: [{ path: name, message }] })
}

/**
 * The status and body of `err` by `problems`. A code the table lacks is a
 * programming error: it answers 500 `internal_error` (a table always has core's).
 */
export function problemAnswer(err: HttpError, problems: ProblemTable, instance: string, requestId: string) {
  const known = problems[err.code]
  const answered = known
    ? err
    : new HttpError('internal_error', `An unexpected error occurred; quote request id ${requestId} when reporting it.`)
  const type = known ?? problems.internal_error ?? coreProblems.internal_error!
  // `unknown`: the code is not in the table (a bug), answered as internal_error; the caller logs it.
  return {
    status: type.status,
    headers: answered.options.headers,
    body: problemBody(answered, type, instance, requestId),
    unknown: !known,
  }
}

function problemBody(err: HttpError, type: ProblemType, instance: string, requestId: string) {
  return {
    // First, so that no extension can stand in for a standard member.
    ...err.options.extensions,
    // A tag URI (RFC 4151): stable and unique without promising a web page.
    type: `tag:users-products-api,2026:${err.code}`,
    title: type.title,
    status: type.status,
    code: err.code,
    detail: err.detail,
    instance,
    request_id: requestId,
    ...(err.options.errors ? { errors: err.options.errors } : {}),
  }
}
