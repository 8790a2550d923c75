// How fast the CLI answers: `psyche --help`, and `psyche status` against a live coordinator (`psyche server run`
// on 127.0.0.1, the tiny-demo run waiting for members), each started REPEATS times as a user starts it
// (node bin/psyche.js), wall time from spawn to exit. Once with the compiled dist/ (what `npm run setup` builds),
// once from the TypeScript sources through tsx (PSYCHE_FROM_SOURCE=1: what every start cost before dist/).
// Targets (issue 24): --help ≤ 0.4 s, status ≤ 0.6 s.
import {spawnSync} from 'node:child_process'
import {mkdtempSync, rmSync} from 'node:fs'
import {loadavg, tmpdir} from 'node:os'
import {join} from 'node:path'
import {createInterface} from 'node:readline'
import {execa} from 'execa'
import {projectRoot} from '../src/core/worker/python.js'

const REPEATS = Number(process.env.BENCH_REPEATS ?? 15)
const cli = join(projectRoot, 'bin', 'psyche.js')
const sorted = (xs: number[]) => [...xs].sort((a, b) => a - b)
const median = (xs: number[]) => sorted(xs)[Math.floor(xs.length / 2)]!
const p90 = (xs: number[]) => sorted(xs)[Math.min(xs.length - 1, Math.floor(xs.length * 0.9))]!

const build = spawnSync(process.execPath, [join(projectRoot, 'scripts', 'build.mjs'), '--if-stale', '--quiet'], {stdio: 'inherit'})
if (build.status !== 0) throw new Error('scripts/build.mjs failed')

const tmp = mkdtempSync(join(tmpdir(), 'psyche-bench-cli-'))
const run = (args: string[], env: Record<string, string> = {}) => {
  const started = performance.now()
  const r = spawnSync(process.execPath, [cli, ...args], {encoding: 'utf8', env: {...process.env, NO_COLOR: '1', ...env}})
  const seconds = (performance.now() - started) / 1000
  if (r.status !== 0) throw new Error(`psyche ${args.join(' ')}: exit ${r.status}\n${r.stderr}`)
  return seconds
}
run(['init', join(tmp, 'run'), '--template', 'tiny-demo'])
const server = execa(process.execPath, [cli, 'server', 'run', '--state', join(tmp, 'run', 'state.toml'), '--host', '127.0.0.1', '--server-port', '0', '--no-relay', '--json'], {
  reject: false,
  env: {NO_COLOR: '1'},
})
try {
  const port: number = JSON.parse(await new Promise<string>((resolve) => createInterface({input: server.stdout!}).once('line', resolve))).port
  const load = loadavg()[0]!.toFixed(2)
  const rows: string[] = []
  for (const [label, env] of [
    ['compiled (dist/)', {}],
    ['from source (tsx)', {PSYCHE_FROM_SOURCE: '1'}],
  ] as const) {
    for (const [what, args] of [
      ['psyche --help', ['--help']],
      ['psyche status', ['status', '--server-addr', `127.0.0.1:${port}`]],
    ] as const) {
      run([...args], env) // warm the file cache
      const times = Array.from({length: REPEATS}, () => run([...args], env))
      rows.push(`| ${what} | ${label} | ${median(times).toFixed(2)} s | ${sorted(times)[0]!.toFixed(2)} s | ${p90(times).toFixed(2)} s |`)
    }
  }
  console.log(`1-min load average before: ${load}; ${REPEATS} starts each\n`)
  console.log(`| command | CLI | median | min | p90 |\n|---|---|---|---|---|\n${rows.join('\n')}`)
} finally {
  server.kill('SIGINT')
  await server
  rmSync(tmp, {recursive: true, force: true})
}
