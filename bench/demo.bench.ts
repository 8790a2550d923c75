// Does the demo learn? `npm run bench -- demo`: runs the demo exactly as `npm run demo` does (the package.json
// script's own `psyche testnet ...` arguments), then `psyche train` on the same config and the same number of
// tokens (one step per round: the same global batch), and compares the losses. Target (issue 14): the demo's
// final loss within 5 % of single-node `psyche train`, in about two minutes on the 2-core machine.
//
// Loss = the mean over the last LAST rounds (steps) of the training loss (in the demo: the mean of the clients'
// losses on their own share of the round's batch). BENCH_DEMO_ROUNDS overrides the demo's --rounds (both runs).
import {mkdtempSync, readFileSync, rmSync} from 'node:fs'
import {loadavg, tmpdir} from 'node:os'
import {join} from 'node:path'
import {execa} from 'execa'
import {projectRoot} from '../src/core/worker/python.js'

const LAST = 10
const demoScript = JSON.parse(readFileSync(join(projectRoot, 'package.json'), 'utf8')).scripts.demo as string
const testnetArgs = demoScript.slice(demoScript.indexOf('testnet')).split(/\s+/)
const arg = (name: string) => testnetArgs[testnetArgs.indexOf(name) + 1]
if (process.env.BENCH_DEMO_ROUNDS) testnetArgs[testnetArgs.indexOf('--rounds') + 1] = process.env.BENCH_DEMO_ROUNDS
const rounds = Number(arg('--rounds'))
const config = join(projectRoot, arg('--config'))
const psyche = join(projectRoot, 'bin', 'psyche.js')
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length

const load = {before: loadavg()[0]}
console.log(`demo: psyche ${testnetArgs.join(' ')} (1-min load ${load.before.toFixed(2)})`)
const t0 = performance.now()
const demo = await execa(process.execPath, [psyche, ...testnetArgs, '--json'], {cwd: projectRoot, reject: false})
const demoWall = (performance.now() - t0) / 1000
if (demo.exitCode !== 0) throw new Error(`the demo failed (exit ${demo.exitCode}):\n${demo.stdout.slice(-2000)}\n${demo.stderr.slice(-2000)}`)
// --json prints the summary object (indented) and nothing else
const summary = JSON.parse(demo.stdout.slice(demo.stdout.indexOf('{'))) as {
  rounds: {step: number; clients: Record<string, {loss: number | null}>; hashes_equal: boolean}[]
  rounds_without_exchange: number
  wall_seconds: number
}
const roundLoss = summary.rounds.map((r) => mean(Object.values(r.clients).flatMap((c) => (c.loss === null ? [] : [c.loss]))))
const demoLoss = mean(roundLoss.slice(-LAST))

const work = mkdtempSync(join(tmpdir(), 'psyche-demo-bench-'))
const metrics = join(work, 'metrics.jsonl')
const t1 = performance.now()
try {
  await execa(process.execPath, [psyche, 'train', '--config', join(config, 'state.toml'), '--steps', String(summary.rounds.length), '--metrics', metrics, '--json'], {
    cwd: projectRoot,
  })
  const trainWall = (performance.now() - t1) / 1000
  const steps = readFileSync(metrics, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l))
    .filter((l) => typeof l.loss === 'number')
  const trainLoss = mean(steps.slice(-LAST).map((s) => s.loss as number))
  const gap = (demoLoss - trainLoss) / trainLoss
  const report = {
    date: new Date().toISOString(),
    demo: {
      command: `psyche ${testnetArgs.join(' ')}`,
      rounds: summary.rounds.length,
      wall_seconds: demoWall,
      testnet_wall_seconds: summary.wall_seconds,
      first_loss: roundLoss[0],
      final_loss: demoLoss,
      hashes_equal: summary.rounds.at(-1)?.hashes_equal,
      rounds_without_exchange: summary.rounds_without_exchange,
    },
    train: {steps: steps.length, wall_seconds: trainWall, first_loss: steps[0].loss, final_loss: trainLoss},
    gap,
    load_1min: {before: load.before, after: loadavg()[0]},
  }
  console.log(JSON.stringify(report, null, 2))
  console.log(
    `demo: ${report.demo.rounds} rounds in ${demoWall.toFixed(0)} s, loss ${roundLoss[0].toFixed(3)} → ${demoLoss.toFixed(3)}; ` +
      `psyche train, same tokens: ${steps[0].loss.toFixed(3)} → ${trainLoss.toFixed(3)} in ${trainWall.toFixed(0)} s; ` +
      `gap ${(100 * gap).toFixed(1)} % (target within 5 %, ~2 minutes)`,
  )
} finally {
  rmSync(work, {recursive: true, force: true})
}
