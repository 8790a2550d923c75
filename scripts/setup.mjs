#!/usr/bin/env node
// First-use set-up for `npm run demo`, `npm test` and `npm run bench`: Node dependencies and the
// project's Python venv (.venv) with pinned packages. Idempotent: a stamp records what was installed,
// so a second run only checks and returns. Uses Node built-ins only (it may run before `npm ci`).
import {spawnSync} from 'node:child_process'
import {createHash} from 'node:crypto'
import {existsSync, readFileSync, writeFileSync, rmSync} from 'node:fs'
import {dirname, join} from 'node:path'
import {fileURLToPath} from 'node:url'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const quiet = process.argv.includes('--quiet')
const say = (msg) => {
  if (!quiet) process.stderr.write(`[setup] ${msg}\n`)
}

function sha256(path) {
  return createHash('sha256').update(readFileSync(path)).digest('hex')
}

function run(cmd, args, what) {
  say(`${what}: ${cmd} ${args.join(' ')}`)
  const started = Date.now()
  const result = spawnSync(cmd, args, {cwd: root, stdio: ['ignore', 'inherit', 'inherit'], env: {...process.env, PIP_DISABLE_PIP_VERSION_CHECK: '1'}})
  if (result.error || result.status !== 0) {
    process.stderr.write(`[setup] failed: ${what} (${result.error?.message ?? `exit ${result.status}`})\n`)
    process.exit(1)
  }
  say(`${what}: done in ${((Date.now() - started) / 1000).toFixed(1)} s`)
}

// --- Node dependencies -------------------------------------------------------------------------
const lock = join(root, 'package-lock.json')
const nodeStamp = join(root, 'node_modules', '.psyche-lock.sha256')
const lockHash = existsSync(lock) ? sha256(lock) : ''
if (!existsSync(nodeStamp) || readFileSync(nodeStamp, 'utf8') !== lockHash) {
  run('npm', [existsSync(lock) ? 'ci' : 'install', '--no-audit', '--no-fund'], 'installing Node dependencies')
  writeFileSync(nodeStamp, lockHash)
}

// --- The compiled CLI (dist/) ---------------------------------------------------------------------
// bin/psyche.js runs dist/ while it matches src/ and the TypeScript sources through tsx otherwise.
{
  const args = [join(root, 'scripts', 'build.mjs'), '--if-stale', ...(quiet ? ['--quiet'] : [])]
  const r = spawnSync(process.execPath, args, {cwd: root, stdio: ['ignore', 'inherit', 'inherit']})
  if (r.status !== 0) say('could not compile the CLI; it runs from the TypeScript sources (slower to start)')
}

// --- Python venv -------------------------------------------------------------------------------
if (process.env.PSYCHE_PYTHON) {
  say(`using PSYCHE_PYTHON=${process.env.PSYCHE_PYTHON}; not managing .venv`)
} else {
  const venv = join(root, '.venv')
  const python = join(venv, 'bin', 'python')
  const requirements = join(root, 'python', 'requirements.txt')
  const pyStamp = join(venv, '.psyche-requirements.sha256')
  const reqHash = sha256(requirements)
  if (!existsSync(pyStamp) || readFileSync(pyStamp, 'utf8') !== reqHash) {
    if (!existsSync(python)) {
      const base = process.env.PYTHON ?? 'python3'
      const version = spawnSync(base, ['-c', 'import sys; print("%d.%d" % sys.version_info[:2])'], {encoding: 'utf8'})
      if (version.status !== 0) {
        process.stderr.write(`[setup] failed: no Python found as '${base}' (set PYTHON to a Python ≥ 3.10)\n`)
        process.exit(1)
      }
      const [major, minor] = version.stdout.trim().split('.').map(Number)
      if (major < 3 || (major === 3 && minor < 10)) {
        process.stderr.write(`[setup] failed: ${base} is Python ${version.stdout.trim()}; psyche's worker needs ≥ 3.10\n`)
        process.exit(1)
      }
      rmSync(venv, {recursive: true, force: true})
      run(base, ['-m', 'venv', venv], 'creating the Python venv (.venv)')
    }
    run(python, ['-m', 'pip', 'install', '--progress-bar', quiet ? 'off' : 'on', '-r', requirements], 'installing pinned Python packages (torch, transformers, pyzmq, ...)')
    writeFileSync(pyStamp, reqHash)
  }
}
// --- Chromium (the dashboard's browser test) ------------------------------------------------------
// Debian's chromium package, driven by playwright-core. Installed with apt when missing; where that cannot
// work (not root, no apt, no network) we say why and go on: the dashboard test then skips with that reason.
const chromium = '/usr/bin/chromium'
if (!existsSync(chromium) && !process.env.PSYCHE_SKIP_CHROMIUM) {
  const why =
    process.platform !== 'linux'
      ? 'not Linux'
      : typeof process.getuid === 'function' && process.getuid() !== 0
        ? 'not root (run: sudo apt-get install chromium)'
        : spawnSync('apt-get', ['--version'], {stdio: 'ignore'}).status !== 0
          ? 'no apt-get'
          : undefined
  if (why) {
    say(`skipping chromium (${chromium} missing, ${why}); the dashboard's browser test will be skipped`)
  } else {
    say('installing chromium with apt (for the dashboard test)')
    const env = {...process.env, DEBIAN_FRONTEND: 'noninteractive'}
    const update = spawnSync('apt-get', ['update'], {stdio: ['ignore', 'ignore', 'inherit'], env})
    const install = update.status === 0 ? spawnSync('apt-get', ['install', '-y', '--no-install-recommends', 'chromium'], {stdio: ['ignore', 'ignore', 'inherit'], env}) : update
    if (install.status !== 0 || !existsSync(chromium)) say(`could not install chromium (apt-get exit ${install.status}); the dashboard's browser test will be skipped`)
  }
}

// --- System packages for the multi-host tests (test/net): iproute2 (ip, tc) and nftables (nft) ----
// Installed with apt when missing and we may (root, Debian/Ubuntu); otherwise test/net skips with the reason.
const missingTools = ['ip', 'tc', 'nft'].filter((tool) => spawnSync('sh', ['-c', `command -v ${tool}`], {stdio: 'ignore'}).status !== 0)
if (missingTools.length > 0) {
  const isRoot = typeof process.getuid === 'function' && process.getuid() === 0
  const hasApt = spawnSync('sh', ['-c', 'command -v apt-get'], {stdio: 'ignore'}).status === 0
  if (isRoot && hasApt) {
    const env = {...process.env, DEBIAN_FRONTEND: 'noninteractive'}
    say(`installing iproute2 and nftables for the multi-host tests (missing: ${missingTools.join(', ')})`)
    spawnSync('apt-get', ['update', '-qq'], {stdio: 'ignore', env})
    const r = spawnSync('apt-get', ['install', '-y', '-qq', '--no-install-recommends', 'iproute2', 'nftables'], {stdio: ['ignore', 'ignore', 'inherit'], env})
    if (r.status !== 0) say('could not install iproute2/nftables: the multi-host tests (test/net) will be skipped')
  } else {
    say(`${missingTools.join(', ')} not installed (needs root and apt): the multi-host tests (test/net) will be skipped`)
  }
}
say('ready')
