// What of a URL may be written to a log or shown in a record: its scheme,
// host and port. A path or query string often carries a credential (a
// receiver's `?token=`, a signed link), and logs and records are read by
// more people, for longer, than the URL was meant for.

/**
 * `scheme://host[:port]` of `raw` (resolved against `base` when relative), or undefined when it names no such origin.
 */
export function urlOrigin(raw: string, base?: string | URL): string | undefined {
  let url: URL
  try {
    url = new URL(raw, base)
  } catch {
    return undefined
  }
  // `origin` is "null" for schemes without one (data:, javascript:, mailto:): nothing of those is safe to show.
  return url.origin === 'null' ? undefined : url.origin
}
