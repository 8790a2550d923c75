// psyche train (TypeScript CLI core → ZeroMQ → worker) against a plain PyTorch loop, same model
// (templates/tiny-demo), batch (16 × 128 tokens, micro-batch 8), AdamW, threads — in one run, alternating
// A/B/A/B so machine noise hits both. Throughput is measured after `WARMUP` steps.
import {readFileSync} from 'node:fs'
import {cpus} from 'node:os'
import {join} from 'node:path'
import {execa} from 'execa'
import {ensureDemoCorpus} from '../src/core/corpus.js'
import {resolveTrainPlan} from '../src/core/train/plan.js'
import {runSingleNode} from '../src/core/train/single-node.js'
import {projectRoot, pythonEnv, workerPython} from '../src/core/worker/python.js'

const STEPS = Number(process.env.BENCH_STEPS ?? 60)
const WARMUP = 5
const THREADS = Number(process.env.BENCH_THREADS ?? 2)
const REPEATS = 3

const corpus = await ensureDemoCorpus()
const rate = (seconds: number[], tokensPerStep: number) => (tokensPerStep * seconds.length) / seconds.reduce((a, b) => a + b, 0)

async function plain(): Promise<number> {
  const r = await execa(
    workerPython(),
    [
      join(projectRoot, 'bench', 'plain_train_loop.py'),
      '--model-config',
      join(projectRoot, 'templates', 'tiny-demo', 'model', 'config.json'),
      '--tokens',
      join(corpus.trainDir, '000.bin'),
      '--steps',
      String(STEPS),
      '--threads',
      String(THREADS),
    ],
    {env: pythonEnv()},
  )
  const out = JSON.parse(String(r.stdout))
  return rate(out.step_seconds.slice(WARMUP), out.tokens_per_step)
}

async function psyche(): Promise<number> {
  const plan = await resolveTrainPlan({optimizer: 'adamw', steps: STEPS, threads: THREADS, totalBatch: 16, microBatch: 8, evalBatches: 1})
  const metricsPath = join(projectRoot, '.cache', 'bench', 'train-metrics.jsonl')
  await runSingleNode(plan, {metricsPath})
  const lines = readFileSync(metricsPath, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l))
  // wall time between the end of step WARMUP-1 and the end of the last step: includes every overhead
  // of the TypeScript side (batch fetch, ZeroMQ, JSON header) between steps, not just the worker's compute
  const span = lines.at(-1).elapsed_seconds - lines[WARMUP - 1].elapsed_seconds
  return ((lines.length - WARMUP) * lines[0].tokens) / span
}

const results = {plain: [] as number[], psyche: [] as number[]}
for (let i = 0; i < REPEATS; i++) {
  results.plain.push(await plain())
  results.psyche.push(await psyche())
}
const best = {plain: Math.max(...results.plain), psyche: Math.max(...results.psyche)}
console.log(
  JSON.stringify(
    {
      date: new Date().toISOString().slice(0, 10),
      cpu: cpus()[0]?.model,
      cores: cpus().length,
      threads: THREADS,
      steps: STEPS,
      runs: results,
      best,
      ratio: best.psyche / best.plain,
    },
    null,
    2,
  ),
)
console.log(`psyche train: ${best.psyche.toFixed(0)} tok/s, plain PyTorch loop: ${best.plain.toFixed(0)} tok/s → ${((100 * best.psyche) / best.plain).toFixed(1)}% (target ≥ 95%)`)
