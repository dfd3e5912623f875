import { existsSync } from 'node:fs'
import { join } from 'node:path'

/**
 * The path of a program of a Debian package that `make test` installs
 * (nginx, PgBouncer): /usr/sbin first, where Debian puts daemons and which a
 * non-root PATH often lacks, then PATH. Throws, naming the package, when it
 * is not installed.
 */
export function installedProgram(name: string, debianPackage = name): string {
  const found = [`/usr/sbin/${name}`, ...(process.env.PATH ?? '').split(':').map((dir) => join(dir, name))].find((p) =>
    existsSync(p),
  )
  if (!found)
    throw new Error(
      `${name} is not installed: \`make test\` installs it (Debian ` +
        `package ${debianPackage}, as root); or run \`apt-get install ${debianPackage}\``,
    )
  return found
}
