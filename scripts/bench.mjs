#!/usr/bin/env node
// `npm run bench`: runs every benchmark in bench/ (*.bench.ts with tsx, *_bench.py with the venv's
// Python), or only those whose name contains one of the given words: npm run bench -- distro train
import {spawnSync} from 'node:child_process'
import {readdirSync} from 'node:fs'
import {dirname, join} from 'node:path'
import {fileURLToPath} from 'node:url'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const filters = process.argv.slice(2)
const python = process.env.PSYCHE_PYTHON ?? join(root, '.venv', 'bin', 'python')
const benches = readdirSync(join(root, 'bench'))
  .filter((n) => n.endsWith('.bench.ts') || n.endsWith('_bench.py'))
  .filter((n) => filters.length === 0 || filters.some((f) => n.includes(f)))
  .sort()
let failed = 0
for (const name of benches) {
  console.log(`\n=== bench/${name}`)
  const path = join('bench', name)
  const [cmd, args] = name.endsWith('.ts') ? [process.execPath, ['--import', 'tsx', path]] : [python, [path]]
  const r = spawnSync(cmd, args, {cwd: root, stdio: 'inherit', env: {...process.env, PYTHONPATH: join(root, 'python')}})
  if (r.status !== 0) {
    failed++
    console.error(`bench/${name} failed (exit ${r.status})`)
  }
}
process.exit(failed ? 1 : 0)
