// The one error type of the HTTP layer. Anything thrown that is not an
// HttpError becomes a 500 `internal_error` whose details stay in the log.
// Codes are the stable contract with clients; titles are for humans.

export const problemTitles = {
  malformed_json: 'Malformed JSON',
  invalid_parameter: 'Invalid query parameter',
  unknown_parameter: 'Unknown query parameter',
  invalid_request: 'Invalid request',
  unauthorized: 'Authentication required',
  invalid_token: 'Invalid credential',
  invalid_credentials: 'Invalid e-mail or password',
  forbidden: 'Forbidden',
  insufficient_scope: 'Insufficient scope',
  current_password_required: 'Current password required',
  not_found: 'Not found',
  method_not_allowed: 'Method not allowed',
  email_taken: 'E-mail address already in use',
  sku_taken: 'SKU already in use',
  last_admin: 'The last admin cannot be removed',
  api_key_limit: 'Too many API keys',
  idempotency_key_in_use: 'Idempotency key in use',
  precondition_failed: 'Precondition failed',
  payload_too_large: 'Payload too large',
  unsupported_media_type: 'Unsupported media type',
  validation_failed: 'Validation failed',
  idempotency_key_reused: 'Idempotency key reused',
  precondition_required: 'Precondition required',
  rate_limited: 'Too many requests',
  too_many_login_attempts: 'Too many login attempts',
  internal_error: 'Internal server error',
  database_unavailable: 'Database unavailable',
  shutting_down: 'Shutting down',
} as const

export type ProblemCode = keyof typeof problemTitles

/** A member of `errors`: a JSON Pointer into the body, or a query parameter's name. */
export interface FieldError {
  path: string
  message: string
}

export class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly code: ProblemCode,
    readonly detail: string,
    readonly options: { errors?: FieldError[]; headers?: Record<string, string> } = {},
  ) {
    super(detail)
    this.name = 'HttpError'
  }
}

export const notFound = () => new HttpError(404, 'not_found', 'No resource at this address.')

/** 422 for request bodies; `errors` carries every field problem found. */
export function validationFailed(errors: FieldError[]): HttpError {
  const detail = errors.map((e) => `${e.path || '/'}: ${e.message}`).join('; ')
  return new HttpError(422, 'validation_failed', detail, { errors })
}

export function invalidParameter(name: string, message: string, code: 'invalid_parameter' | 'unknown_parameter' = 'invalid_parameter'): HttpError {
  return new HttpError(400, code, `${name}: ${message}`, { errors: [{ path: name, message }] })
}

export function problemBody(err: HttpError, instance: string, requestId: string) {
  return {
    // A tag URI (RFC 4151): stable and unique without promising a web page.
    type: `tag:users-products-api,2026:${err.code}`,
    title: problemTitles[err.code],
    status: err.status,
    code: err.code,
    detail: err.detail,
    instance,
    request_id: requestId,
    ...(err.options.errors ? { errors: err.options.errors } : {}),
  }
}
