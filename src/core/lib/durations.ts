// Durations in milliseconds, for settings that read as what they are
// (`[10 * SECOND, MINUTE, 5 * MINUTE]`) rather than as a count of zeros.

export const SECOND = 1000
export const MINUTE = 60 * SECOND
export const HOUR = 60 * MINUTE
