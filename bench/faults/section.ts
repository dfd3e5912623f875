// What each module of bench/faults/ measures (its `measure()`): one table of
// figures, each beside its baseline from the same run, and a note on how they
// were taken. bench/faults.ts prints it and writes it into bench/README.md.
export interface FaultSection {
  title: string
  columns: string[]
  rows: string[][]
  note?: string
}
