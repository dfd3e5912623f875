import { execFileSync } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'

// What a process costs, read from Linux's /proc: CPU time (utime + stime of
// /proc/<pid>/stat, in clock ticks) and resident memory (/proc/<pid>/status).
// A server may be a tree of processes (the service with WORKERS=N: a primary
// and N workers): its cost is the sum over the tree (`processTree`).

const ticksPerSecond = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100
  } catch {
    return 100
  }
})()

/** CPU time in µs (user + system) the process has used so far, or undefined when it cannot be read. */
export function cpuMicros(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // The command name (field 2) may contain spaces and parentheses: count from the last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return ((Number(fields[11]) + Number(fields[12])) * 1e6) / ticksPerSecond
  } catch {
    return undefined
  }
}

/** A field of /proc/<pid>/status in kB (VmRSS, VmHWM), or undefined. */
export function statusKb(pid: number, field: 'VmRSS' | 'VmHWM'): number | undefined {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8')
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)
    return m ? Number(m[1]) : undefined
  } catch {
    return undefined
  }
}

/**
 * The process and its descendants, from /proc/<pid>/task/<tid>/children
 * (every thread's: a child belongs to the thread that forked it). A process
 * that has just exited is left out.
 */
export function processTree(pid: number): number[] {
  const out: number[] = []
  const visit = (p: number) => {
    out.push(p)
    let tasks: string[]
    try {
      tasks = readdirSync(`/proc/${p}/task`)
    } catch {
      return
    }
    for (const tid of tasks) {
      let children = ''
      try {
        children = readFileSync(`/proc/${p}/task/${tid}/children`, 'utf8')
      } catch {
        continue
      }
      for (const c of children.split(' ').filter(Boolean)) visit(Number(c))
    }
  }
  visit(pid)
  return out
}

/** A field of /proc/<pid>/status summed over the process tree, in kB, or undefined when the root is gone. */
export function treeStatusKb(pid: number, field: 'VmRSS' | 'VmHWM'): number | undefined {
  const own = statusKb(pid, field)
  if (own === undefined) return undefined
  return processTree(pid)
    .slice(1)
    .reduce((kb, p) => kb + (statusKb(p, field) ?? 0), own)
}

/** Samples VmRSS of the process tree (summed) every `everyMs` until stopped; returns the peak in MB. */
export function sampleRss(pid: number, everyMs = 100): { stop(): number } {
  let peak = treeStatusKb(pid, 'VmRSS') ?? 0
  const timer = setInterval(() => {
    const kb = treeStatusKb(pid, 'VmRSS')
    if (kb !== undefined && kb > peak) peak = kb
  }, everyMs)
  return {
    stop() {
      clearInterval(timer)
      const kb = treeStatusKb(pid, 'VmRSS')
      if (kb !== undefined && kb > peak) peak = kb
      return peak / 1024
    },
  }
}

/** CPU µs of a set of processes (PostgreSQL backends), by pid. */
export function cpuOf(pids: number[]): Map<number, number> {
  const out = new Map<number, number>()
  for (const pid of pids) {
    const us = cpuMicros(pid)
    if (us !== undefined) out.set(pid, us)
  }
  return out
}

/**
 * CPU used between two readings of a set of processes. A process that
 * appeared in between counts from zero (a backend the pool opened during the
 * run); one that went away is lost (rare: pools keep their connections).
 */
export function cpuBetween(before: Map<number, number>, after: Map<number, number>): number {
  let total = 0
  for (const [pid, us] of after) total += us - (before.get(pid) ?? 0)
  return total
}

/** CPU time of the whole machine so far, in µs summed over cores: busy (not idle or iowait) and in all (/proc/stat). */
export function machineCpu(): { busy: number; total: number } {
  const [, ...fields] = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/)
  // user nice system idle iowait irq softirq steal (guest time is already in user and nice)
  const t = fields.slice(0, 8).map(Number)
  const total = t.reduce((a, b) => a + b, 0)
  const idle = t[3]! + t[4]!
  const us = (ticks: number) => (ticks * 1e6) / ticksPerSecond
  return { busy: us(total - idle), total: us(total) }
}
