import Format from 'typebox/format'

/** Whether a string is of a format (ISO 4217 currency codes, say). */
export type FormatCheck = (value: string) => boolean

/**
 * Registers string formats with TypeBox, whose format table is the
 * process's: the same check again is a no-op, another check under a name
 * already taken throws (two declarations disagree on what it means).
 */
export function registerFormats(formats: Readonly<Record<string, FormatCheck>>): void {
  for (const [name, check] of Object.entries(formats)) {
    if (!Format.Has(name)) Format.Set(name, check)
    else if (Format.Get(name) !== check) throw new Error(`string format "${name}" is registered already with another check`)
  }
}
