import assert from 'node:assert/strict'
import {spawnSync} from 'node:child_process'
import {cpSync, mkdirSync, readFileSync, rmSync, symlinkSync, utimesSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {test} from 'node:test'
import {sourceStamp} from '../../scripts/build.mjs'
import {projectRoot} from '../../src/core/worker/python.js'
import {tempDir} from '../helpers.js'

test('the source stamp changes when a file under src/ is edited, touched, added or removed', () => {
  const tmp = tempDir()
  try {
    mkdirSync(join(tmp.path, 'commands'))
    writeFileSync(join(tmp.path, 'commands', 'a.ts'), 'export const a = 1\n')
    writeFileSync(join(tmp.path, 'b.ts'), 'export const b = 1\n')
    const stamp = sourceStamp(tmp.path)
    assert.equal(sourceStamp(tmp.path), stamp, 'the stamp is stable')
    assert.match(stamp, /^b\.ts 19 \d+\ncommands\/a\.ts 19 \d+\n$/)
    utimesSync(join(tmp.path, 'b.ts'), new Date(), new Date(Date.now() + 5000))
    const touched = sourceStamp(tmp.path)
    assert.notEqual(touched, stamp, 'a new mtime')
    writeFileSync(join(tmp.path, 'commands', 'c.ts'), '')
    const added = sourceStamp(tmp.path)
    assert.notEqual(added, touched, 'a new file')
    rmSync(join(tmp.path, 'commands', 'c.ts'))
    assert.equal(sourceStamp(tmp.path), touched, 'the file removed again')
  } finally {
    tmp.cleanup()
  }
})

// A copy of the package (its own src/, bin/, scripts/build.mjs; node_modules, templates and python linked: the
// support table reads python/psyche_worker/architectures.json): build it, and
// check that bin/psyche.js runs dist/ while it matches src/, and the sources as soon as one of them changes.
test('bin/psyche.js runs the compiled dist/ only while it matches src/', () => {
  const tmp = tempDir()
  try {
    const pkg = tmp.path
    for (const p of ['src', 'bin', 'package.json', 'tsconfig.json', 'tsconfig.build.json']) cpSync(join(projectRoot, p), join(pkg, p), {recursive: true})
    mkdirSync(join(pkg, 'scripts'))
    cpSync(join(projectRoot, 'scripts', 'build.mjs'), join(pkg, 'scripts', 'build.mjs'))
    for (const p of ['node_modules', 'templates', 'python']) symlinkSync(join(projectRoot, p), join(pkg, p))
    const cli = (...args: string[]) => spawnSync(process.execPath, [join(pkg, 'bin', 'psyche.js'), ...args], {cwd: pkg, encoding: 'utf8', env: {...process.env, NO_COLOR: '1'}})

    const build = spawnSync(process.execPath, [join(pkg, 'scripts', 'build.mjs'), '--quiet'], {cwd: pkg, encoding: 'utf8'})
    assert.equal(build.status, 0, build.stderr)
    const manifestPath = join(pkg, 'dist', 'oclif.manifest.json')
    const manifest = JSON.parse(readFileSync(manifestPath, 'utf8'))
    assert.deepEqual(manifest.commands.status.relativePath, ['commands', 'status.js'], 'commands load from dist/commands')
    assert.ok(Object.keys(manifest.commands).length >= 20, 'every command is in the manifest')
    // Mark the build's help text, to see which of the two the CLI runs.
    manifest.commands.status.summary = 'COMPILED BUILD'
    writeFileSync(manifestPath, JSON.stringify(manifest))

    const upToDate = spawnSync(process.execPath, [join(pkg, 'scripts', 'build.mjs'), '--if-stale'], {cwd: pkg, encoding: 'utf8'})
    assert.equal(upToDate.status, 0, upToDate.stderr)
    assert.match(upToDate.stderr, /dist\/ is up to date/, 'setup does not rebuild a fresh dist/')
    const fresh = cli('status', '--help')
    assert.equal(fresh.status, 0, fresh.stderr)
    assert.match(fresh.stdout, /COMPILED BUILD/, 'a fresh dist/ is what runs')
    // Paths relative to the package root resolve from dist/ as from src/: init finds the templates.
    const init = cli('init', join(pkg, 'run'), '--template', 'tiny-demo')
    assert.equal(init.status, 0, init.stderr)
    assert.match(readFileSync(join(pkg, 'run', 'state.toml'), 'utf8'), /\[config\]/)

    // An edit in src/ (here only a new mtime) makes the build stale: the sources run, with their own help text.
    const source = join(pkg, 'src', 'commands', 'status.ts')
    utimesSync(source, new Date(), new Date(Date.now() + 10_000))
    const stale = cli('status', '--help')
    assert.equal(stale.status, 0, stale.stderr)
    assert.doesNotMatch(stale.stdout, /COMPILED BUILD/, 'a stale dist/ is not run')
    assert.match(stale.stdout, /one-shot summary of a run/)
  } finally {
    tmp.cleanup()
  }
})
