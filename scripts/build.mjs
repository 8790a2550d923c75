#!/usr/bin/env node
// Compiles src/ to JavaScript in dist/ (tsc, no type check: `npm run typecheck` does that) and writes the
// oclif command manifest, so that bin/psyche.js starts without compiling TypeScript and loads only the
// command it runs. dist/ mirrors src/ at the same depth, so paths relative to the package root (python/,
// templates/, programs/) resolve the same from either. A stamp of the sources (every file's path, size and
// mtime) is written last; bin/psyche.js runs dist/ only while the stamp matches src/, and otherwise runs the
// sources through tsx, so an edit in src/ is never shadowed by an old build.
//
// Usage: node scripts/build.mjs [--if-stale] [--quiet]. The build goes to a temporary directory that replaces
// dist/ at the end, so a CLI started meanwhile sees either the old complete build or none (and then uses tsx).
import {spawnSync} from 'node:child_process'
import {existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync} from 'node:fs'
import {dirname, join, relative} from 'node:path'
import {fileURLToPath, pathToFileURL} from 'node:url'

export const root = join(dirname(fileURLToPath(import.meta.url)), '..')
export const distDir = join(root, 'dist')
export const stampName = '.src-stamp'

/** One line per file under src/: relative path, size, mtime in ms. Cheap (stat only), run at every CLI start. */
export function sourceStamp(dir = join(root, 'src')) {
  const lines = []
  const walk = (d) => {
    for (const entry of readdirSync(d, {withFileTypes: true})) {
      const path = join(d, entry.name)
      if (entry.isDirectory()) walk(path)
      else {
        const s = statSync(path)
        lines.push(`${relative(dir, path)} ${s.size} ${Math.trunc(s.mtimeMs)}`)
      }
    }
  }
  walk(dir)
  return lines.sort().join('\n') + '\n'
}

/** True when dist/ holds a complete build of the current src/. */
export function distIsFresh() {
  try {
    return readFileSync(join(distDir, stampName), 'utf8') === sourceStamp()
  } catch {
    return false
  }
}

/** The package.json the compiled CLI loads: the same, with commands found in dist/commands (relative to dist/). */
export function distPjson() {
  const pjson = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'))
  return {...pjson, oclif: {...pjson.oclif, commands: './commands'}}
}

export async function build({quiet = false} = {}) {
  const say = (msg) => {
    if (!quiet) process.stderr.write(`[build] ${msg}\n`)
  }
  const started = Date.now()
  const stamp = sourceStamp()
  const tmp = join(root, `.dist-build-${process.pid}`)
  rmSync(tmp, {recursive: true, force: true})
  mkdirSync(tmp, {recursive: true})
  try {
    const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc')
    if (!existsSync(tsc)) throw new Error('typescript is not installed (npm ci installs it)')
    const r = spawnSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.build.json'), '--outDir', tmp], {cwd: root, encoding: 'utf8'})
    if (r.status !== 0) throw new Error(`tsc failed (exit ${r.status}):\n${r.stdout}${r.stderr}`)
    // The manifest: oclif reads every command's flags and help from it instead of importing all commands.
    const manifest = spawnSync(process.execPath, [fileURLToPath(import.meta.url), '--manifest', tmp], {cwd: root, encoding: 'utf8'})
    if (manifest.status !== 0) throw new Error(`writing the oclif manifest failed:\n${manifest.stderr}`)
    writeFileSync(join(tmp, stampName), stamp)
    const old = `${distDir}.old-${process.pid}`
    if (existsSync(distDir)) renameSync(distDir, old)
    renameSync(tmp, distDir)
    rmSync(old, {recursive: true, force: true})
    say(`compiled src/ to dist/ in ${((Date.now() - started) / 1000).toFixed(1)} s`)
  } finally {
    rmSync(tmp, {recursive: true, force: true})
  }
  if (sourceStamp() !== stamp) say('src/ changed during the build; the CLI runs the sources until the next build')
}

async function writeManifest(dir) {
  const {Config, settings} = await import('@oclif/core')
  settings.enableAutoTranspile = false
  const config = await Config.load({root: dir, pjson: distPjson()})
  const manifest = config.rootPlugin.manifest
  const ids = Object.keys(manifest.commands)
  const missing = config.rootPlugin.commandIDs.filter((id) => !ids.includes(id))
  if (ids.length === 0 || missing.length > 0) throw new Error(`commands that did not load: ${missing.join(', ') || 'all'}`)
  for (const id of ids) {
    const c = manifest.commands[id]
    if (!c.relativePath || c.isESM === undefined) throw new Error(`command ${id} has no module path in the manifest`)
  }
  writeFileSync(join(dir, 'oclif.manifest.json'), JSON.stringify(manifest))
}

if (process.argv[1] && pathToFileURL(process.argv[1]).href === import.meta.url) {
  const args = process.argv.slice(2)
  if (args[0] === '--manifest') {
    await writeManifest(args[1])
  } else if (args.includes('--if-stale') && distIsFresh()) {
    if (!args.includes('--quiet')) process.stderr.write('[build] dist/ is up to date\n')
  } else {
    try {
      await build({quiet: args.includes('--quiet')})
    } catch (error) {
      process.stderr.write(`[build] ${error.message}\n`)
      process.exit(1)
    }
  }
}
