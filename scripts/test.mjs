#!/usr/bin/env node
// `npm test` and `npm run test:all`: the lint (formatting, import cycles), the Python tests (pytest python/tests)
// and the TypeScript tests (node:test), then one combined closing line: `tests: N passed, N failed, N skipped`.
//
// The TypeScript test files are classified in test/tiers.mjs. `npm test` runs the quick tiers (unit tests, the
// in-process simulation, one multi-process smoke run); `--all` (npm run test:all, CI) runs every tier. A test file
// that test/tiers.mjs does not list, or lists twice or under no known tier, stops the run before anything starts.
//
// In-process files (tiers unit, sim) run PSYCHE_TEST_CONCURRENCY (default 2) at a time, the others one at a time; each
// group prints every file's time (scripts/test-times.mjs).
//
// Usage: node scripts/test.mjs [--all] [--tier NAME[,NAME]] [--only ts|py|lint] [test files...]
//   test files given by name run whatever their tier (Node 20 neither globs nor finds .ts files itself).
import {spawnSync} from 'node:child_process'
import {existsSync, readdirSync, statSync} from 'node:fs'
import {dirname, join, relative} from 'node:path'
import {fileURLToPath} from 'node:url'
import {quickTiers, tiers} from '../test/tiers.mjs'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const args = process.argv.slice(2)
function option(name) {
  const i = args.indexOf(name)
  return i >= 0 ? args.splice(i, 2)[1] : undefined
}
function flag(name) {
  const i = args.indexOf(name)
  if (i >= 0) args.splice(i, 1)
  return i >= 0
}
const only = option('--only')
const tierOption = option('--tier')
const all = flag('--all')
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

/** Problems with test/tiers.mjs against the test files on disk; empty when every file has exactly one tier. */
function classificationProblems() {
  const problems = []
  const tierOf = new Map()
  for (const [tier, files] of Object.entries(tiers)) {
    for (const file of files) {
      if (tierOf.has(file)) problems.push(`${file} is listed twice in test/tiers.mjs (${tierOf.get(file)} and ${tier})`)
      tierOf.set(file, tier)
      if (!existsSync(join(root, file))) problems.push(`${file} is listed in test/tiers.mjs (${tier}) but does not exist`)
    }
  }
  for (const file of findTests(join(root, 'test'))) {
    if (!tierOf.has(file)) problems.push(`${file} has no tier: add it to test/tiers.mjs (${Object.keys(tiers).join(', ')})`)
  }
  for (const tier of quickTiers) if (!(tier in tiers)) problems.push(`test/tiers.mjs: the quick tier ${tier} is not defined`)
  return problems
}

const problems = classificationProblems()
if (problems.length > 0) {
  for (const p of problems) console.error(`test tiers: ${p}`)
  console.log(`\ntests: 0 passed, ${problems.length} failed`)
  process.exit(1)
}

let selectedTiers = all ? Object.keys(tiers) : quickTiers
if (tierOption !== undefined) {
  selectedTiers = tierOption.split(',')
  const unknown = selectedTiers.filter((t) => !(t in tiers))
  if (unknown.length > 0) {
    console.error(`--tier: no tier ${unknown.join(', ')} (tiers: ${Object.keys(tiers).join(', ')})`)
    process.exit(2)
  }
}

let passed = 0
let failed = 0
let skipped = 0
let ok = true
const explicitFiles = args.length > 0

// `npm run lint` (prettier, ruff check, ruff format, and no import cycle in src/): with a whole tier, or `--only lint`.
if ((only === undefined && !explicitFiles && tierOption === undefined) || only === 'lint') {
  const r = spawnSync(process.execPath, [join(root, 'scripts', 'lint.mjs')], {cwd: root, env, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit']})
  process.stdout.write(r.stdout ?? '')
  if (r.status === 0) passed += 1
  else {
    failed += 1
    ok = false
  }
}

const pyFiles = args.filter((a) => a.endsWith('.py'))
if (only === 'py' || (only === undefined && (pyFiles.length > 0 || (!explicitFiles && tierOption === undefined)))) {
  const r = spawnSync(python, ['-m', 'pytest', '-q', '-rs', '-p', 'no:cacheprovider', ...(pyFiles.length ? pyFiles : ['python/tests'])], {
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
  skipped += Number(/(\d+) skipped/.exec(last)?.[1] ?? 0)
  if (r.status !== 0) ok = false
}

const tsFiles = args.filter((a) => a.endsWith('.ts'))
if (only === 'ts' || (only === undefined && (tsFiles.length > 0 || !explicitFiles))) {
  const files = explicitFiles ? tsFiles : selectedTiers.flatMap((t) => tiers[t])
  if (files.length === 0) ok = false
  // The in-process tiers (unit, sim) mostly wait (timers, sockets, a peer's heartbeat, a fetch's backoff) rather than
  // compute, so their files run PSYCHE_TEST_CONCURRENCY (default 2) at a time. Multi-process runs (smoke, e2e, net,
  // ...) time real rounds and run one at a time, after them.
  const concurrency = Math.max(1, Number(process.env.PSYCHE_TEST_CONCURRENCY ?? 2) || 1)
  const inProcess = new Set([...tiers.unit, ...tiers.sim])
  const groups = [
    {files: files.filter((f) => inProcess.has(f)), concurrency, what: 'in process'},
    {files: files.filter((f) => !inProcess.has(f)), concurrency: 1, what: 'multi-process'},
  ].filter((g) => g.files.length > 0)
  for (const group of groups) {
    const what = explicitFiles ? 'the files given' : `tiers ${selectedTiers.join(', ')}`
    console.log(`\n== node:test, ${what}, ${group.what}: ${group.files.length} files, ${group.concurrency} at a time`)
    const r = spawnSync(
      process.execPath,
      [
        '--import',
        'tsx',
        '--test',
        '--test-reporter=spec',
        '--test-reporter-destination=stdout',
        `--test-reporter=${join(root, 'scripts', 'test-times.mjs')}`,
        '--test-reporter-destination=stdout',
        `--test-concurrency=${group.concurrency}`,
        ...group.files,
      ],
      {cwd: root, env, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], maxBuffer: 1 << 28},
    )
    process.stdout.write(r.stdout ?? '')
    passed += Number(/ℹ pass (\d+)/.exec(r.stdout ?? '')?.[1] ?? 0)
    // A cancelled test (its file or suite timed out, or a hook failed) did not pass: it counts as failed.
    failed += Number(/ℹ fail (\d+)/.exec(r.stdout ?? '')?.[1] ?? 0) + Number(/ℹ cancelled (\d+)/.exec(r.stdout ?? '')?.[1] ?? 0)
    skipped += Number(/ℹ skipped (\d+)/.exec(r.stdout ?? '')?.[1] ?? 0)
    if (r.status !== 0) ok = false
  }
}

if (passed === 0) ok = false
// Skipped tests say why in their output (pytest's -rs lines; node:test's `# SKIP` reasons); the closing line counts them.
console.log(`\ntests: ${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}`)
process.exit(ok ? 0 : 1)
