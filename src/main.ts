import { pickCommand, usage, UsageError, type Commands } from './cli.js'

// The process's entry: `node dist/main.js [command]`. Each command loads
// what it needs when it runs (the service for serve, migrate and admin,
// src/start.ts; a small client for the image's health check, which runs
// every few seconds and must not pay for loading the service).

/** Every command (src/cli.ts). A new one is an entry here. */
const commands: Commands = {
  serve: {
    summary: 'apply pending migrations, then serve the API until SIGTERM or SIGINT',
    run: async () => (await import('./start.js')).start('serve', []),
  },
  migrate: {
    summary: 'apply pending migrations (sql/) and exit',
    run: async () => (await import('./start.js')).start('migrate', []),
  },
  admin: {
    args: '<email>',
    summary:
      'create an admin, or give an admin a new password (from ADMIN_PASSWORD or standard input; without either, one ' +
      'is generated and printed)',
    // It says itself why a second argument is refused: a password there would show in ps.
    maxArgs: Infinity,
    failure: 'Cannot create the admin',
    run: async (args) => {
      // Never a default address: an admin nobody asked for, with a password printed to whoever ran this.
      if (!args[0] && !process.env.ADMIN_EMAIL)
        throw new UsageError(
          'admin needs the e-mail of the admin to create or reset: admin <email> (make admin EMAIL=…)',
        )
      await (await import('./start.js')).start('admin', args)
    },
  },
  healthcheck: {
    args: '[--ready]',
    summary:
      'ask this service, where its configuration says it listens, for liveness (or readiness): exit 0 healthy, 1 ' +
      "not; no database (the image's HEALTHCHECK)",
    // It checks its own argument, and exits 1 on a bad one: Docker reserves 2.
    maxArgs: Infinity,
    run: async (args) => process.exit(await (await import('./healthcheck.js')).healthcheckCommand(args, process.env)),
  },
  help: { summary: 'print this help', run: async () => void process.stdout.write(usage(commands)) },
}

async function main(): Promise<void> {
  const { command, args } = pickCommand(commands, process.argv.slice(2))
  try {
    await command.run(args)
  } catch (err) {
    if (err instanceof UsageError) throw err
    await (await import('./start.js')).exitCannotStart(err, command.failure)
  }
}

main().catch(async (err: unknown) => {
  if (err instanceof UsageError) {
    process.stderr.write(`${err.message}\n\n${usage(commands)}`)
    process.exit(2)
  }
  await (await import('./start.js')).exitCannotStart(err)
})
