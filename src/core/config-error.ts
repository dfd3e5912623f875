/** A setting that cannot work: start-up stops with this message, which names the variable to change. */
export class ConfigError extends Error {}
