// The one error type of the HTTP layer. Anything thrown that is not an
// HttpError becomes a 500 `internal_error` whose details stay in the log.
// Codes are the stable contract with clients; titles are for humans.

/** What a problem code stands for: a code always answers with the same status and title. */
export interface ProblemType {
  status: number
  title: string
}

// Codes are declared once, by whoever owns them: core's below, the
// application's where it wires itself, each resource's unique constraints by
// its declaration. The table is the process's, like a route table: it only
// grows, and a code registered again must mean the same thing.
const registered = new Map<string, ProblemType>()

/** Registers codes; again with the same status and title is a no-op, with another one throws (two owners disagree). */
export function registerProblems(types: Readonly<Record<string, ProblemType>>): void {
  for (const [code, type] of Object.entries(types)) {
    if (!/^[a-z][a-z0-9_]*$/.test(code)) throw new Error(`problem code "${code}": lower case letters, digits and _ only`)
    const known = registered.get(code)
    if (known && (known.status !== type.status || known.title !== type.title)) {
      throw new Error(`problem code "${code}" is registered as ${known.status} "${known.title}", not ${type.status} "${type.title}"`)
    }
    if (!known) registered.set(code, { status: type.status, title: type.title })
  }
}

function problemType(code: string): ProblemType {
  const type = registered.get(code)
  if (!type) throw new Error(`problem code "${code}" is not registered`)
  return type
}

/** Core's own codes: malformed requests, conditions, limits, the database, stopping. */
export const coreProblems: Readonly<Record<string, ProblemType>> = {
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
  idempotency_key_reused: { status: 422, title: 'Idempotency key reused' },
  precondition_required: { status: 428, title: 'Precondition required' },
  rate_limited: { status: 429, title: 'Too many requests' },
  internal_error: { status: 500, title: 'Internal server error' },
  database_unavailable: { status: 503, title: 'Database unavailable' },
  shutting_down: { status: 503, title: 'Shutting down' },
}
registerProblems(coreProblems)

/** A member of `errors`: a JSON Pointer into the body, or a query parameter's name. */
export interface FieldError {
  path: string
  message: string
}

export class HttpError extends Error {
  /** The status of the code (registerProblems): a site names the code only. */
  readonly status: number

  constructor(
    readonly code: string,
    readonly detail: string,
    readonly options: { errors?: FieldError[]; headers?: Record<string, string> } = {},
  ) {
    super(detail)
    this.name = 'HttpError'
    this.status = problemType(code).status
  }
}

export const notFound = () => new HttpError('not_found', 'No resource at this address.')

/** 422 for request bodies; `errors` carries every field problem found. */
export function validationFailed(errors: FieldError[]): HttpError {
  const detail = errors.map((e) => `${e.path || '/'}: ${e.message}`).join('; ')
  return new HttpError('validation_failed', detail, { errors })
}

export function invalidParameter(name: string, message: string, code: 'invalid_parameter' | 'unknown_parameter' = 'invalid_parameter'): HttpError {
  return new HttpError(code, `${name}: ${message}`, { errors: [{ path: name, message }] })
}

export function problemBody(err: HttpError, instance: string, requestId: string) {
  return {
    // A tag URI (RFC 4151): stable and unique without promising a web page.
    type: `tag:users-products-api,2026:${err.code}`,
    title: problemType(err.code).title,
    status: err.status,
    code: err.code,
    detail: err.detail,
    instance,
    request_id: requestId,
    ...(err.options.errors ? { errors: err.options.errors } : {}),
  }
}
