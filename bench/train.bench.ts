// psyche train (TypeScript CLI core → ZeroMQ → worker) against a plain PyTorch loop, same model, batch
// (16 × 128 tokens, micro-batch 8), AdamW, threads (the worker's thread environment for both) — in one run,
// alternating A/B/A/B so machine noise hits both. Throughput is measured after `WARMUP` steps, two ways: tokens per
// wall second, and tokens per CPU second (every thread of the plain loop's process; the worker's and this process's
// for psyche), which a machine shared with other work disturbs far less than wall time. Each psyche run is paired
// with the plain run just before it, and the median of the pairs' ratios is reported with the best of each. The
// models: run templates, a dense Llama (tiny-demo), a dense Qwen3 (tiny-qwen3) and a DeepSeek-V3 mixture of experts
// (tiny-deepseek-v3); BENCH_TEMPLATES=a,b picks others.
import {readFileSync, readdirSync} from 'node:fs'
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
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const threadEnv = {OMP_NUM_THREADS: String(THREADS), MKL_NUM_THREADS: String(THREADS)}

interface Rates {
  wall: number
  cpu: number
}

async function plain(template: string): Promise<Rates & {parameters: number}> {
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
    {env: pythonEnv(threadEnv)},
  )
  const out = JSON.parse(String(r.stdout))
  return {wall: rate(out.step_seconds.slice(WARMUP), out.tokens_per_step), cpu: rate(out.step_cpu_seconds.slice(WARMUP), out.tokens_per_step), parameters: out.parameters}
}

/** CPU seconds (user + system, every thread) of this process's Python children: the worker (Linux /proc). */
function workerCpuSeconds(): number {
  let ticks = 0
  for (const pid of readdirSync('/proc').filter((n) => /^\d+$/.test(n))) {
    let stat: string
    try {
      stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    } catch {
      continue // exited
    }
    const comm = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'))
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ') // fields[0] is the state (field 3)
    if (Number(fields[1]) === process.pid && comm.startsWith('python')) ticks += Number(fields[11]) + Number(fields[12]) // utime, stime
  }
  return ticks / 100 // USER_HZ
}
const ownCpuSeconds = () => {
  const u = process.cpuUsage()
  return (u.user + u.system) / 1e6
}

async function psyche(template: string): Promise<Rates> {
  const plan = await resolveTrainPlan({template, optimizer: 'adamw', steps: STEPS, threads: THREADS, totalBatch: 16, microBatch: 8, evalBatches: 1})
  const metricsPath = join(projectRoot, '.cache', 'bench', 'train-metrics.jsonl')
  // CPU seconds at the end of step WARMUP-1 and of the last step, read as each step's metrics arrive
  const cpu: number[] = []
  await runSingleNode(plan, {
    metricsPath,
    events: {
      onStep: (m) => {
        if (m.step === WARMUP - 1 || m.step === STEPS - 1) cpu.push(workerCpuSeconds() + ownCpuSeconds())
      },
    },
  })
  const lines = readFileSync(metricsPath, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l))
  // wall time between the end of step WARMUP-1 and the end of the last step: includes every overhead
  // of the TypeScript side (batch fetch, ZeroMQ, JSON header) between steps, not just the worker's compute
  const span = lines.at(-1).elapsed_seconds - lines[WARMUP - 1].elapsed_seconds
  const tokens = (lines.length - WARMUP) * lines[0].tokens
  return {wall: tokens / span, cpu: tokens / (cpu[1] - cpu[0])}
}

type Runs = {plain: number[]; psyche: number[]}
const models: Record<string, {parameters: number; wall: Runs; cpu: Runs; best: {plain: number; psyche: number}; ratio: number; pairedRatio: {wall: number; cpu: number}}> = {}
for (const template of TEMPLATES) {
  const wall: Runs = {plain: [], psyche: []}
  const cpu: Runs = {plain: [], psyche: []}
  let parameters = 0
  for (let i = 0; i < REPEATS; i++) {
    const p = await plain(template)
    parameters = p.parameters
    const q = await psyche(template)
    wall.plain.push(p.wall)
    wall.psyche.push(q.wall)
    cpu.plain.push(p.cpu)
    cpu.psyche.push(q.cpu)
  }
  const best = {plain: Math.max(...wall.plain), psyche: Math.max(...wall.psyche)}
  const paired = (runs: Runs) => median(runs.psyche.map((r, i) => r / runs.plain[i]))
  models[template] = {parameters, wall, cpu, best, ratio: best.psyche / best.plain, pairedRatio: {wall: paired(wall), cpu: paired(cpu)}}
}
console.log(JSON.stringify({date: new Date().toISOString().slice(0, 10), cpu: cpus()[0]?.model, cores: cpus().length, threads: THREADS, steps: STEPS, models}, null, 2))
for (const [template, m] of Object.entries(models)) {
  console.log(
    `${template}: psyche train ${m.best.psyche.toFixed(0)} tok/s, plain PyTorch loop ${m.best.plain.toFixed(0)} tok/s → ${(100 * m.ratio).toFixed(1)}% (best of each); ` +
      `median of pairs ${(100 * m.pairedRatio.wall).toFixed(1)}% per wall second, ${(100 * m.pairedRatio.cpu).toFixed(1)}% per CPU second (target ≥ 95%)`,
  )
}
