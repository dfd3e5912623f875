import { createHook } from 'node:async_hooks'

// What a piece of code leaves open: every timer and every socket, server,
// pipe or file watcher created while a ledger is on, with the stack that
// created it, and whether it has been closed since. Timers count whether
// unref'd or not (process.getActiveResourcesInfo() does not list unref'd
// ones), so a forgotten unref'd interval shows too.

const KINDS = new Set([
  'Timeout',
  'TCPWRAP',
  'TCPSERVERWRAP',
  'TLSWRAP',
  'PIPEWRAP',
  'PIPESERVERWRAP',
  'STATWATCHER',
  'FSEVENTWRAP',
  'UDPWRAP',
])

export interface HandleLedger {
  /** Handles created since `openLedger` and not closed yet: kind and where it was created. */
  open(): Array<{ kind: string; createdAt: string }>
  off(): void
}

export function openLedger(): HandleLedger {
  const live = new Map<number, { kind: string; createdAt: string }>()
  const hook = createHook({
    init(asyncId, kind) {
      if (!KINDS.has(kind)) return
      const stack = (new Error().stack ?? '')
        .split('\n')
        .slice(2)
        .filter((line) => !line.includes('node:internal') && !line.includes('node:async_hooks'))
      live.set(asyncId, {
        kind,
        createdAt: stack
          .slice(0, 4)
          .map((l) => l.trim())
          .join(' < '),
      })
    },
    destroy(asyncId) {
      live.delete(asyncId)
    },
  }).enable()
  return { open: () => [...live.values()], off: () => void hook.disable() }
}

/** process.getActiveResourcesInfo() as counts per kind. */
export function activeResources(): Record<string, number> {
  const counts: Record<string, number> = {}
  for (const kind of process.getActiveResourcesInfo()) counts[kind] = (counts[kind] ?? 0) + 1
  return counts
}
