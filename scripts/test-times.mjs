// A node:test reporter that prints, once every file has run, the wall time each test file took, slowest first: the
// duration the runner gives the file itself (its process from start to end: start-up, imports and tests). When
// files run several at a time, each one's time includes waiting for the CPU the others use.
import {relative} from 'node:path'

export default async function* fileTimes(source) {
  const started = Date.now()
  const rows = []
  for await (const event of source) {
    const {file, name, nesting, details} = event.data ?? {}
    if (event.type === 'test:complete' && nesting === 0 && typeof file === 'string' && name === file) rows.push([relative(process.cwd(), file), (details?.duration_ms ?? 0) / 1000])
  }
  rows.sort((a, b) => b[1] - a[1])
  const wall = (Date.now() - started) / 1000
  yield `\n== time per test file (wall seconds, slowest first; ${rows.length} files in ${wall.toFixed(1)} s)\n`
  for (const [file, seconds] of rows) yield `${seconds.toFixed(1).padStart(7)}  ${file}\n`
}
