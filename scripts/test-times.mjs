// A node:test reporter that prints, once every file has run, the wall time each test file took, slowest first.
// scripts/test.mjs runs the files one at a time (--test-concurrency=1) and the runner reports a file's tests as
// it ends, so a file's time is the time from the previous file's end to its own: start-up and imports included.
import {relative} from 'node:path'

export default async function* fileTimes(source) {
  const started = Date.now()
  const lastSeen = new Map()
  for await (const event of source) {
    const file = event.data?.file
    if (typeof file === 'string') lastSeen.set(file, Date.now())
  }
  const ends = [...lastSeen.entries()].sort((a, b) => a[1] - b[1])
  const rows = []
  let previous = started
  for (const [file, end] of ends) {
    rows.push([relative(process.cwd(), file), (end - previous) / 1000])
    previous = end
  }
  rows.sort((a, b) => b[1] - a[1])
  const total = rows.reduce((sum, [, s]) => sum + s, 0)
  yield `\n== time per test file (wall seconds, slowest first; ${rows.length} files, ${total.toFixed(1)} s)\n`
  for (const [file, seconds] of rows) yield `${seconds.toFixed(1).padStart(7)}  ${file}\n`
}
