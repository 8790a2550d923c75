// psyche train (TypeScript CLI core → ZeroMQ → worker) against a plain PyTorch loop, same model, batch
// (16 × 128 tokens, micro-batch 8), AdamW, threads — in one run, alternating A/B/A/B so machine noise hits both.
// Throughput is measured after `WARMUP` steps. The models: run templates, a dense Llama (tiny-demo), a dense
// Qwen3 (tiny-qwen3) and a DeepSeek-V3 mixture of experts (tiny-deepseek-v3); BENCH_TEMPLATES=a,b picks others.
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
const REPEATS = Number(process.env.BENCH_REPEATS ?? 3)
const TEMPLATES = (process.env.BENCH_TEMPLATES ?? 'tiny-demo,tiny-qwen3,tiny-deepseek-v3').split(',')

const corpus = await ensureDemoCorpus()
const rate = (seconds: number[], tokensPerStep: number) => (tokensPerStep * seconds.length) / seconds.reduce((a, b) => a + b, 0)

async function plain(template: string): Promise<{rate: number; parameters: number}> {
  const r = await execa(
    workerPython(),
    [
      join(projectRoot, 'bench', 'plain_train_loop.py'),
      '--model-config',
      join(projectRoot, 'templates', template, 'model', 'config.json'),
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
  return {rate: rate(out.step_seconds.slice(WARMUP), out.tokens_per_step), parameters: out.parameters}
}

async function psyche(template: string): Promise<number> {
  const plan = await resolveTrainPlan({template, optimizer: 'adamw', steps: STEPS, threads: THREADS, totalBatch: 16, microBatch: 8, evalBatches: 1})
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

const models: Record<string, {parameters: number; runs: {plain: number[]; psyche: number[]}; best: {plain: number; psyche: number}; ratio: number}> = {}
for (const template of TEMPLATES) {
  const runs = {plain: [] as number[], psyche: [] as number[]}
  let parameters = 0
  for (let i = 0; i < REPEATS; i++) {
    const p = await plain(template)
    parameters = p.parameters
    runs.plain.push(p.rate)
    runs.psyche.push(await psyche(template))
  }
  const best = {plain: Math.max(...runs.plain), psyche: Math.max(...runs.psyche)}
  models[template] = {parameters, runs, best, ratio: best.psyche / best.plain}
}
console.log(JSON.stringify({date: new Date().toISOString().slice(0, 10), cpu: cpus()[0]?.model, cores: cpus().length, threads: THREADS, steps: STEPS, models}, null, 2))
for (const [template, m] of Object.entries(models)) {
  console.log(`${template}: psyche train ${m.best.psyche.toFixed(0)} tok/s, plain PyTorch loop ${m.best.plain.toFixed(0)} tok/s → ${(100 * m.ratio).toFixed(1)}% (target ≥ 95%)`)
}
