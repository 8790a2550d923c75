// A node:test reporter that prints, once every file has run, the wall time each test file took, slowest first.
// A file's time runs from the runner's start of it (its first test:dequeue: the process is spawned) to its last
// report, so start-up and imports count; it holds whether files run one at a time or several at once.
import {relative} from 'node:path'

export default async function* fileTimes(source) {
  const started = Date.now()
  const first = new Map()
  const last = new Map()
  for await (const event of source) {
    const file = event.data?.file
    if (typeof file !== 'string') continue
    if (event.type === 'test:dequeue' && !first.has(file)) first.set(file, Date.now())
    last.set(file, Date.now())
  }
  const rows = [...last.entries()].map(([file, end]) => [relative(process.cwd(), file), (end - (first.get(file) ?? started)) / 1000])
  rows.sort((a, b) => b[1] - a[1])
  const wall = (Date.now() - started) / 1000
  yield `\n== time per test file (wall seconds, slowest first; ${rows.length} files in ${wall.toFixed(1)} s)\n`
  for (const [file, seconds] of rows) yield `${seconds.toFixed(1).padStart(7)}  ${file}\n`
}
