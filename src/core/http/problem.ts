// The one error type of the HTTP layer. Anything thrown that is not an
// HttpError becomes a 500 `internal_error` whose details stay in the log.
// Codes are the stable contract with clients; titles are for humans.

/** Every problem code with its status and title: a code always answers with the same status. */
export const problems = {
  malformed_json: { status: 400, title: 'Malformed JSON' },
  invalid_parameter: { status: 400, title: 'Invalid query parameter' },
  unknown_parameter: { status: 400, title: 'Unknown query parameter' },
  invalid_request: { status: 400, title: 'Invalid request' },
  request_timeout: { status: 408, title: 'Request timeout' },
  headers_too_large: { status: 431, title: 'Request header fields too large' },
  unauthorized: { status: 401, title: 'Authentication required' },
  invalid_token: { status: 401, title: 'Invalid credential' },
  invalid_credentials: { status: 401, title: 'Invalid e-mail or password' },
  forbidden: { status: 403, title: 'Forbidden' },
  insufficient_scope: { status: 403, title: 'Insufficient scope' },
  current_password_required: { status: 403, title: 'Current password required' },
  not_found: { status: 404, title: 'Not found' },
  method_not_allowed: { status: 405, title: 'Method not allowed' },
  email_taken: { status: 409, title: 'E-mail address already in use' },
  sku_taken: { status: 409, title: 'SKU already in use' },
  last_admin: { status: 409, title: 'The last admin cannot be removed' },
  api_key_limit: { status: 409, title: 'Too many API keys' },
  idempotency_key_in_use: { status: 409, title: 'Idempotency key in use' },
  precondition_failed: { status: 412, title: 'Precondition failed' },
  payload_too_large: { status: 413, title: 'Payload too large' },
  unsupported_media_type: { status: 415, title: 'Unsupported media type' },
  validation_failed: { status: 422, title: 'Validation failed' },
  idempotency_key_reused: { status: 422, title: 'Idempotency key reused' },
  precondition_required: { status: 428, title: 'Precondition required' },
  rate_limited: { status: 429, title: 'Too many requests' },
  too_many_login_attempts: { status: 429, title: 'Too many login attempts' },
  internal_error: { status: 500, title: 'Internal server error' },
  database_unavailable: { status: 503, title: 'Database unavailable' },
  shutting_down: { status: 503, title: 'Shutting down' },
  too_many_streams: { status: 503, title: 'Too many event streams' },
} as const

export type ProblemCode = keyof typeof problems

/** A member of `errors`: a JSON Pointer into the body, or a query parameter's name. */
export interface FieldError {
  path: string
  message: string
}

export class HttpError extends Error {
  /** The status of the code (`problems`): a site names the code only. */
  readonly status: number

  constructor(
    readonly code: ProblemCode,
    readonly detail: string,
    readonly options: { errors?: FieldError[]; headers?: Record<string, string> } = {},
  ) {
    super(detail)
    this.name = 'HttpError'
    this.status = problems[code].status
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
    title: problems[err.code].title,
    status: err.status,
    code: err.code,
    detail: err.detail,
    instance,
    request_id: requestId,
    ...(err.options.errors ? { errors: err.options.errors } : {}),
  }
}
