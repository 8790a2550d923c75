#!/usr/bin/env node
// `npm run lint`: prettier --check (TypeScript and scripts), ruff check and ruff format --check (Python),
// the import-cycle and layer check, and knip (no unused files, exports or dependencies). Runs every check, then exits non-zero if any failed.
import {spawnSync} from 'node:child_process'
import {dirname, join} from 'node:path'
import {fileURLToPath} from 'node:url'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const ruff = join(root, '.venv', 'bin', 'ruff')
const checks = [
  [
    'prettier',
    join(root, 'node_modules', '.bin', 'prettier'),
    ['--check', 'src/**/*.ts', 'test/**/*.ts', 'bench/**/*.ts', 'scripts/**/*.mjs', 'test/**/*.mjs', 'programs/**/*.ts'],
  ],
  ['ruff check', ruff, ['check']],
  ['ruff format', ruff, ['format', '--check']],
  ['import cycles', process.execPath, [join(root, 'scripts', 'check-cycles.mjs')]],
  // Unused files, exports, types and dependencies (knip.json: the entry points are the commands, scripts, tests and benches).
  ['unused code', join(root, 'node_modules', '.bin', 'knip'), ['--no-progress']],
]
const failed = []
for (const [name, cmd, args] of checks) {
  process.stdout.write(`\n== ${name}\n`)
  const r = spawnSync(cmd, args, {cwd: root, stdio: 'inherit'})
  if (r.error) process.stderr.write(`${name}: cannot run ${cmd}: ${r.error.message} (run npm run setup)\n`)
  if (r.status !== 0) failed.push(name)
}
process.stdout.write(`\nlint: ${failed.length === 0 ? 'all checks passed' : `failed: ${failed.join(', ')}`}\n`)
process.exit(failed.length === 0 ? 0 : 1)
