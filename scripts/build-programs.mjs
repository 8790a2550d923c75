#!/usr/bin/env node
// `npm run build:programs`: compiles the Solana programs in programs/ to sBPF v3 shared objects (NAME.so; NAME.v0.so
// for clusters without v3) in programs/build/ (committed, so deploying and testing need no toolchain). It first writes the layout table's
// header, programs/include/psyche_layout.h (scripts/gen-layout.ts). Each program is C, compiled
// by Debian's clang-19 for the eBPF target and linked by programs/tools/sbpf-link.ts. Cached: a build is
// skipped when the hash of its inputs (sources, linker, flags; scripts/program-inputs.mjs) matches the recorded
// one. Options: --force (rebuild anyway), --check (only report whether the committed builds are current),
// --fixtures (also recompile the linker's test objects in test/fixtures/sbpf/).
import {spawnSync} from 'node:child_process'
import {mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, existsSync, renameSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {dirname, join} from 'node:path'
import {fileURLToPath} from 'node:url'
import {programInputsHash, PROGRAMS, CFLAGS} from './program-inputs.mjs'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const args = process.argv.slice(2)
const force = args.includes('--force')
const checkOnly = args.includes('--check')
const fixtures = args.includes('--fixtures')
const CLANG = process.env.PSYCHE_CLANG ?? 'clang-19'

function clangVersion() {
  const r = spawnSync(CLANG, ['--version'], {encoding: 'utf8'})
  return r.status === 0 ? r.stdout.split('\n')[0] : undefined
}

let failed = false
// The C header of the layout table (src/core/layout/layout-table.ts) comes first: the programs include it.
const gen = spawnSync(process.execPath, ['--import', 'tsx', join(root, 'scripts', 'gen-layout.ts'), ...(checkOnly ? ['--check'] : [])], {stdio: 'inherit', cwd: root})
if (gen.status !== 0) failed = true
const version = clangVersion()
if (version) console.log(`compiler: ${version}`)
if (fixtures) {
  if (!version) {
    console.error(`--fixtures needs ${CLANG} (apt-get install clang-19)`)
    process.exit(1)
  }
  const dir = join(root, 'test', 'fixtures', 'sbpf')
  for (const c of readdirSync(dir).filter((f) => f.endsWith('.c'))) {
    const r = spawnSync(CLANG, [...CFLAGS.filter((f) => f !== '-Werror'), '-c', join(dir, c), '-o', join(dir, c.replace(/\.c$/, '.o'))], {stdio: 'inherit'})
    if (r.status !== 0) failed = true
    else console.log(`test/fixtures/sbpf/${c.replace(/\.c$/, '.o')}`)
  }
}
for (const program of PROGRAMS) {
  const hash = programInputsHash(root, program)
  const so = join(root, 'programs', 'build', `${program.name}.so`)
  const hashFile = join(root, 'programs', 'build', `${program.name}.inputs`)
  const recorded = existsSync(hashFile) ? readFileSync(hashFile, 'utf8').trim() : ''
  const current = existsSync(so) && recorded === hash
  if (checkOnly) {
    console.log(`${program.name}: ${current ? 'up to date' : 'STALE (run npm run build:programs)'}`)
    if (!current) failed = true
    continue
  }
  if (current && !force) {
    console.log(`${program.name}: up to date (${so})`)
    continue
  }
  if (!version) {
    console.error(`${program.name}: sources changed but ${CLANG} is not installed (apt-get install clang-19); the committed ${so} is stale`)
    failed = true
    continue
  }
  const tmp = mkdtempSync(join(tmpdir(), 'psyche-program-'))
  try {
    const object = join(tmp, `${program.name}.o`)
    const cc = spawnSync(CLANG, [...CFLAGS, '-c', join(root, program.source), '-o', object], {stdio: 'inherit'})
    if (cc.status !== 0) throw new Error(`${CLANG} failed on ${program.source}`)
    // sBPF v3 (what a current cluster deploys), and v0 beside it for clusters without v3
    for (const [version, out] of [
      ['v3', so],
      ['v0', join(root, 'programs', 'build', `${program.name}.v0.so`)],
    ]) {
      const ld = spawnSync(process.execPath, ['--import', 'tsx', join(root, 'programs', 'tools', 'sbpf-link.ts'), '--sbpf', version, object, out], {stdio: 'inherit', cwd: root})
      if (ld.status !== 0) throw new Error(`sbpf-link failed on ${program.name} (${version})`)
    }
    writeFileSync(`${hashFile}.tmp`, `${hash}\n`)
    renameSync(`${hashFile}.tmp`, hashFile)
  } catch (error) {
    console.error(`${program.name}: ${error.message}`)
    failed = true
  } finally {
    rmSync(tmp, {recursive: true, force: true})
  }
}
process.exit(failed ? 1 : 0)
