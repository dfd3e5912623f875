import { DatabaseBusy } from '../db/admission.js'
import { classifyDatabaseError } from '../db/errors.js'
import { HttpError } from './problem.js'

// The database layer's errors as problems: every one is a 503
// database_unavailable, and Retry-After says when a retry may succeed.

const unavailable = (detail: string, retryAfter: string) =>
  new HttpError('database_unavailable', detail, { headers: { 'retry-after': retryAfter } })

/** The answer to work database admission refused or gave up on. */
export function busyProblem(err: DatabaseBusy): HttpError {
  return err.reason === 'refused'
    ? unavailable('The database is not keeping up with the requests waiting for it; retry shortly.', '1')
    : unavailable(
        `The request could not be completed ` +
          `within ${err.deadlineMs / 1000} s: the database is not answering; retry shortly.`,
        '5',
      )
}

/** The answer to an error of the database itself (classifyDatabaseError); undefined for any other error. */
export function failureProblem(err: unknown): HttpError | undefined {
  switch (classifyDatabaseError(err)) {
    case 'unavailable':
      return unavailable('The database is unavailable; retry shortly.', '5')
    case 'deadlock':
    case 'serialization':
      return unavailable('The request collided with a concurrent change and was rolled back; retry it.', '1')
    case undefined:
      return undefined
  }
}
