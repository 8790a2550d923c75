#!/usr/bin/env node
// `npm test`: the TypeScript tests (node:test, every test/**/*.test.ts, listed explicitly because
// Node 20 neither globs nor finds .ts files) and the Python tests (pytest python/tests), then one
// combined closing line, after the lint (formatting and import cycles). Usage: node scripts/test.mjs [--only ts|py|lint] [test files...]
import {spawnSync} from 'node:child_process'
import {readdirSync, statSync} from 'node:fs'
import {dirname, join, relative} from 'node:path'
import {fileURLToPath} from 'node:url'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const args = process.argv.slice(2)
const onlyIndex = args.indexOf('--only')
const only = onlyIndex >= 0 ? args.splice(onlyIndex, 2)[1] : undefined
const python = process.env.PSYCHE_PYTHON ?? join(root, '.venv', 'bin', 'python')
const env = {...process.env, NO_COLOR: '1', FORCE_COLOR: '0'}

function findTests(dir) {
  const out = []
  for (const name of readdirSync(dir)) {
    const path = join(dir, name)
    if (statSync(path).isDirectory()) out.push(...findTests(path))
    else if (name.endsWith('.test.ts')) out.push(relative(root, path))
  }
  return out.sort()
}

let passed = 0
let failed = 0
let skipped = 0
let ok = true

// `npm run lint` (prettier, ruff check, ruff format, and no import cycle in src/): with the full suite, or `--only lint`.
if ((only === undefined && args.length === 0) || only === 'lint') {
  const r = spawnSync(process.execPath, [join(root, 'scripts', 'lint.mjs')], {cwd: root, env, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit']})
  process.stdout.write(r.stdout ?? '')
  if (r.status === 0) passed += 1
  else {
    failed += 1
    ok = false
  }
}

if (only !== 'ts' && only !== 'lint') {
  const pyFiles = args.filter((a) => a.endsWith('.py'))
  const r = spawnSync(python, ['-m', 'pytest', '-q', '-p', 'no:cacheprovider', ...(pyFiles.length ? pyFiles : ['python/tests'])], {
    cwd: root,
    env,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
    maxBuffer: 1 << 28,
  })
  process.stdout.write(r.stdout ?? '')
  const last = (r.stdout ?? '').trim().split('\n').pop() ?? ''
  passed += Number(/(\d+) passed/.exec(last)?.[1] ?? 0)
  failed += Number(/(\d+) failed/.exec(last)?.[1] ?? 0) + Number(/(\d+) errors?/.exec(last)?.[1] ?? 0)
  if (r.status !== 0) ok = false
}

if (only !== 'py' && only !== 'lint') {
  const tsFiles = args.filter((a) => a.endsWith('.ts'))
  const files = tsFiles.length ? tsFiles : findTests(join(root, 'test'))
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--test', '--test-reporter=spec', '--test-concurrency=1', ...files], {
    cwd: root,
    env,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
    maxBuffer: 1 << 28,
  })
  process.stdout.write(r.stdout ?? '')
  passed += Number(/ℹ pass (\d+)/.exec(r.stdout ?? '')?.[1] ?? 0)
  failed += Number(/ℹ fail (\d+)/.exec(r.stdout ?? '')?.[1] ?? 0)
  skipped += Number(/ℹ skipped (\d+)/.exec(r.stdout ?? '')?.[1] ?? 0)
  if (r.status !== 0) ok = false
  if (files.length === 0) ok = false
}

if (passed === 0) ok = false
// Skipped tests say why in their output (e.g. test/net without network namespaces); the closing line counts them.
console.log(`\ntests: ${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}`)
process.exit(ok ? 0 : 1)
