// The benchmark's settings come from BENCH_* environment variables; each is
// checked when read, and a bad value stops the run with a message naming it.

const env = process.env

export function fail(message: string): never {
  console.error(message)
  process.exit(2)
}

export function intSetting(name: string, fallback: number, min = 1): number {
  const raw = env[name]
  if (raw === undefined || raw === '') return fallback
  const value = Number(raw)
  if (!Number.isInteger(value) || value < min)
    fail(`${name}: must be an integer of at least ${min} (got ${JSON.stringify(raw)})`)
  return value
}

export function oneOf<T extends string>(name: string, values: readonly T[], fallback: T): T {
  const raw = env[name]
  if (raw === undefined || raw === '') return fallback
  if (!(values as readonly string[]).includes(raw))
    fail(`${name}: must be one of ${values.join(', ')} (got ${JSON.stringify(raw)})`)
  return raw as T
}

/** A comma-separated list of counts (connections, clients); `off` too when `offAllowed`. */
export function countsSetting(name: string, fallback: number[], offAllowed = false): number[] {
  const raw = env[name]
  if (raw === undefined || raw === '') return fallback
  if (offAllowed && raw === 'off') return []
  const counts = raw.split(',').map(Number)
  if (!counts.every((n) => Number.isInteger(n) && n >= 1))
    fail(`${name}: comma-separated counts${offAllowed ? ', or off' : ''} (got ${JSON.stringify(raw)})`)
  return counts
}
