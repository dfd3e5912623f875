// The figures of several workers as one Prometheus exposition: each worker's
// series get a `worker` label, and each family keeps one HELP and TYPE with
// the samples of every worker under them (the format forbids a family split
// in two).

/** The expositions of workers (src/core/metrics.ts renders each), as one. */
export function mergeExpositions(parts: ReadonlyArray<{ worker: number; text: string }>): string {
  const families = new Map<string, { header: string[]; samples: string[] }>()
  for (const { worker, text } of parts) {
    let family: { header: string[]; samples: string[] } | undefined
    for (const line of text.split('\n')) {
      if (line === '') continue
      const comment = /^# (HELP|TYPE) (\S+) (.*)$/.exec(line)
      if (comment) {
        const [, kind, name, rest] = comment as unknown as [string, string, string, string]
        family = families.get(name)
        if (!family) families.set(name, (family = { header: [], samples: [] }))
        if (family.header.length < 2)
          family.header.push(
            kind === 'HELP' ? `# HELP ${name} ${rest} One series per worker process (label worker).` : line,
          )
        continue
      }
      family?.samples.push(labelled(line, worker))
    }
  }
  return [...families.values()].flatMap((f) => [...f.header, ...f.samples]).join('\n') + '\n'
}

/** A sample line with `worker="n"` as its first label. */
export function labelled(sample: string, worker: number): string {
  const name = /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(sample)![0]
  const rest = sample.slice(name.length)
  return rest.startsWith('{') ? `${name}{worker="${worker}",${rest.slice(1)}` : `${name}{worker="${worker}"}${rest}`
}

/**
 * The primary's own family: how often each worker slot was replaced after its
 * process died, since the service started. A worker's own figures restart
 * from zero with its replacement; this one says that it happened.
 */
export function workerRestarts(restarts: ReadonlyMap<number, number>, workers: number): string {
  const name = 'worker_restarts_total'
  const lines = [
    `# HELP ${name} Worker processes the primary replaced after they died, per worker slot, since the service started.`,
    `# TYPE ${name} counter`,
  ]
  for (let n = 1; n <= workers; n++) lines.push(`${name}{worker="${n}"} ${restarts.get(n) ?? 0}`)
  return lines.join('\n') + '\n'
}
