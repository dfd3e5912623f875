import { HttpError } from './problem.js'

// Entity tags (RFC 9110 §8.8.3) and the two conditional headers the API honours.

/** A strong validator from a row version: it changes with every write of the row. */
export const etagFor = (version: number | string) => `"v${version}"`

function listTags(header: string): string[] {
  return header
    .split(',')
    .map((t) => t.trim())
    .filter(Boolean)
}

/** If-None-Match uses the weak comparison: `W/"v1"` matches `"v1"`. */
export function etagMatches(ifNoneMatch: string | undefined, etag: string | undefined): boolean {
  if (!ifNoneMatch || !etag) return false
  return listTags(ifNoneMatch).some((tag) => tag === '*' || tag.replace(/^W\//, '') === etag)
}

/**
 * If-Match uses the strong comparison (RFC 9110 §13.1.1): a weak tag never
 * matches. Called with the row locked, so the check and the write that
 * follows see the same version. A mismatch is a 412 and nothing is written.
 */
export function checkIfMatch(ifMatch: string | undefined, currentVersion: number): void {
  const versions = ifMatchVersions(ifMatch)
  if (versions === undefined || versions.includes(currentVersion)) return
  throw new HttpError(
    'precondition_failed',
    'The resource has changed since it was read (If-Match does not match its ETag).',
    { headers: { etag: etagFor(currentVersion) } },
  )
}

/**
 * The row versions an If-Match header accepts (strong comparison: only our
 * own strong tags count): undefined when any does (no header, or `*`),
 * otherwise possibly none. checkIfMatch uses it, and so does a write that
 * checks If-Match in its own statement (src/core/resources/store.ts).
 */
export function ifMatchVersions(ifMatch: string | undefined): number[] | undefined {
  if (ifMatch === undefined) return undefined
  const tags = listTags(ifMatch)
  if (tags.includes('*')) return undefined
  return tags.flatMap((tag) => {
    const version = /^"v(0|[1-9][0-9]{0,14})"$/.exec(tag)?.[1]
    return version === undefined ? [] : [Number(version)]
  })
}
