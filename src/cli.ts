import { relative } from 'node:path'
import { closestName } from './core/lib/closest-name.js'

// The command line: `node dist/main.js [command] [arguments]`. The commands
// are one table (src/main.ts), from which come the help, the refusal of a
// command that does not exist, and the dispatch: a new command is an entry
// there and nothing else. Settings are never arguments; they are
// environment variables (docs/operations.md),
// read the same way by every command.

export interface Command {
  /** Its arguments as the help shows them, e.g. `<email>` or `[--ready]`; none when absent. */
  args?: string
  /** What it does, in a line. */
  summary: string
  /** How many arguments it takes at most (default 0); a command that checks its own says Infinity. */
  maxArgs?: number
  /** How each line saying why it failed begins, e.g. "Cannot create the admin"; "Cannot start" when absent. */
  failure?: string
  run(args: string[]): Promise<void>
}

export type Commands = Record<string, Command>

/** The command run when none is named. */
export const DEFAULT_COMMAND = 'serve'

/** A command line that means nothing to the table: the process exits 2 (a usage error), having started nothing. */
export class UsageError extends Error {}

/** The command `argv` (the arguments after the script) names, and its arguments; `--help` and `-h` are `help`. */
export function pickCommand(
  commands: Commands,
  argv: readonly string[],
): { name: string; command: Command; args: string[] } {
  const [first, ...args] = argv
  const name = first === undefined ? DEFAULT_COMMAND : first === '--help' || first === '-h' ? 'help' : first
  const command = Object.hasOwn(commands, name) ? commands[name] : undefined
  if (!command) {
    const near = closestName(name, Object.keys(commands))
    throw new UsageError(`unknown command "${name}"${near ? `; did you mean ${near}?` : ''}`)
  }
  const most = command.maxArgs ?? 0
  if (args.length > most)
    throw new UsageError(
      `${name} takes ${most === 0 ? 'no arguments' : `at most ${most}`}, ` +
        `not ${args.map((a) => JSON.stringify(a)).join(' ')}`,
    )
  return { name, command, args }
}

/** The help: how to run it, the commands, where the settings are described. */
export function usage(commands: Commands, script = process.argv[1] ?? 'dist/main.js'): string {
  const program = `node ${relative(process.cwd(), script) || script}`
  const rows = Object.entries(commands).map(
    ([name, c]) =>
      [
        `${name}${c.args ? ` ${c.args}` : ''}`,
        `${c.summary}${name === DEFAULT_COMMAND ? ' (the default: no command)' : ''}`,
      ] as const,
  )
  const width = Math.max(...rows.map(([left]) => left.length))
  return [
    `Usage: ${program} [command]`,
    '',
    'Commands:',
    ...rows.map(([left, right]) => `  ${left.padEnd(width)}  ${right}`),
    '',
    'Settings are environment variables (a secret also as <NAME>_FILE), checked at start-up;',
    'docs/operations.md, "Configuration", lists them.',
    '',
  ].join('\n')
}
