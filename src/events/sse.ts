// The Server-Sent Events wire format (HTML Living Standard, "Server-sent
// events", §9.2.5): fields are `name: value` lines, an event ends with a
// blank line, a line starting with `:` is a comment that clients ignore.
// Every value written here is one line: an id and a type by their form
// (digits; `subject.verb`, sql/007), and the data because JSON text escapes
// every line break inside strings and the serializer writes no others.

export const SSE_CONTENT_TYPE = 'text/event-stream'

/** One event: `id` is what the client sends back in Last-Event-ID to resume after it. */
export const sseEvent = (id: number, type: string, json: string): string =>
  `id: ${id}\nevent: ${type}\ndata: ${json}\n\n`

/** Keeps an idle connection from being closed by a proxy; clients ignore it. */
export const SSE_KEEP_ALIVE = ': keep-alive\n\n'

/** How long a client waits before reconnecting after the stream ends. */
export const sseRetry = (ms: number): string => `retry: ${ms}\n\n`
