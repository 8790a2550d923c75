#!/usr/bin/env node
// Fails when the import graph of src/ has a cycle (dependency-cruiser, rules in .dependency-cruiser.cjs).
// Run by `npm test` (scripts/test.mjs) and `npm run lint`.
import {spawnSync} from 'node:child_process'
import {dirname, join} from 'node:path'
import {fileURLToPath} from 'node:url'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const bin = join(root, 'node_modules', '.bin', 'depcruise')
const r = spawnSync(bin, ['--config', '.dependency-cruiser.cjs', '--output-type', 'err', 'src'], {cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe']})
if (r.error) {
  process.stderr.write(`check-cycles: cannot run dependency-cruiser (${r.error.message}); run npm install\n`)
  process.exit(2)
}
process.stdout.write(r.stdout)
process.stderr.write(r.stderr)
if (r.status === 0) process.stdout.write('import cycles: none in src/\n')
process.exit(r.status ?? 1)
