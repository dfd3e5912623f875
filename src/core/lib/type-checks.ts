/** True when A and B are the same type, false otherwise. */
export type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false

/** Compiles only when its argument is `true`: a check of types that leaves nothing at run time. */
export type Holds<T extends true> = T
