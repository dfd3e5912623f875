/**
 * A setting that cannot work: start-up stops with this message, which names
 * the variable to change. It may carry several problems, one line each
 * (`problems`), so that an operator fixes every bad value in one go rather
 * than one per restart.
 */
export class ConfigError extends Error {
  readonly problems: readonly string[]

  constructor(problems: string | readonly string[]) {
    const lines = typeof problems === 'string' ? [problems] : problems
    super(lines.join('\n'))
    this.problems = lines
  }
}
