// Which of a few known names a mistyped one was meant to be: a misspelt
// environment variable (src/config-names.ts) or command (src/cli.ts).

/**
 * Edits (insert, delete, replace, swap two neighbours) that turn `a` into
 * `b`: the optimal string alignment distance, so that a transposition such
 * as MIGRTAE for MIGRATE counts as one slip, not two.
 */
export function editDistance(a: string, b: string): number {
  const rows: number[][] = Array.from({ length: a.length + 1 }, (_, i) => [i, ...Array<number>(b.length).fill(0)])
  for (let j = 1; j <= b.length; j++) rows[0]![j] = j
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1
      let d = Math.min(rows[i - 1]![j]! + 1, rows[i]![j - 1]! + 1, rows[i - 1]![j - 1]! + cost)
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d = Math.min(d, rows[i - 2]![j - 2]! + 1)
      rows[i]![j] = d
    }
  }
  return rows[a.length]![b.length]!
}

/**
 * How many slips a name of this length may hold and still be taken for it:
 * two, but one for names of four letters or fewer, where two edits reach
 * unrelated words (HOME is two from HOST).
 */
export const slipsAllowed = (name: string): number => (name.length <= 4 ? 1 : 2)

/**
 * The known name `name` is a slip away from (the nearest; the first of equals), or undefined when none is near enough.
 */
export function closestName(name: string, known: Iterable<string>): string | undefined {
  let best: { name: string; distance: number } | undefined
  for (const candidate of known) {
    const distance = editDistance(name, candidate)
    if (distance > 0 && distance <= slipsAllowed(candidate) && (!best || distance < best.distance))
      best = { name: candidate, distance }
  }
  return best?.name
}
