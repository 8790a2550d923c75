// The GPU path, measured (issue 14): `npm run bench -- gpu`.
//
//  1. tokens/s of `psyche train` (TypeScript core → ZeroMQ → worker, AdamW, --precision auto = bf16 on CUDA)
//     against a plain PyTorch loop (bench/plain_train_loop.py: bf16 autocast, fused AdamW, same batches'
//     shape), for the llama2-20m template and a ~1.1B-parameter Llama (templates/llama-1b, TinyLlama's shape);
//  2. DisTrO on the device (bench/gpu_distro.py): compress (produce) and decompress (decode; apply) in GB/s of
//     fp32 gradient, and the share of a DisTrO client's step spent in DisTrO;
//  3. a 2-client testnet on one GPU (both workers on cuda:0), llama2-20m, DisTrO.
//
// Targets: psyche train ≥ 95 % of the plain loop; DisTrO < 5 % of a step at 1B.
// Without CUDA it prints "no CUDA device: skipped" and exits 0. `--device cpu --tiny` runs the same code on the
// tiny-demo model on CPU with a handful of steps (test/bench/gpu-bench.test.ts runs it, so the script cannot rot).
// `--json` prints only the JSON summary. BENCH_GPU_STEPS / BENCH_GPU_ROUNDS override the step and round counts,
// BENCH_GPU_REPEATS the alternating runs of each loop, BENCH_GPU_MODELS (names, comma-separated) the models, BENCH_GPU_PARTS (train,distro,testnet: all by default) what runs
// (bench/gpu-check.sh runs the DisTrO part itself and carries no CLI for the testnet).
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {execa} from 'execa'
import {ensureDemoCorpus} from '../src/core/corpus.js'
import {resolveTrainPlan} from '../src/core/train/plan.js'
import {runSingleNode} from '../src/core/train/single-node.js'
import {projectRoot, pythonEnv, workerPython} from '../src/core/worker/python.js'

const argv = process.argv.slice(2)
const option = (name: string): string | undefined => {
  const i = argv.indexOf(name)
  return i >= 0 ? argv[i + 1] : undefined
}
const tiny = argv.includes('--tiny')
const jsonOnly = argv.includes('--json')
const device = option('--device') ?? 'cuda'
const say = (line: string) => {
  if (!jsonOnly) console.log(line)
}

interface ModelCase {
  name: string
  config: string
  seqLen: number
  batch: number
  microBatch: number
  steps: number
  warmup: number
}

const template = (name: string) => join(projectRoot, 'templates', name, 'model', 'config.json')
const steps = (n: number) => Number(process.env.BENCH_GPU_STEPS ?? n)
const MODELS: ModelCase[] = tiny
  ? [{name: 'tiny-demo', config: template('tiny-demo'), seqLen: 32, batch: 4, microBatch: 4, steps: steps(6), warmup: 2}]
  : [
      {name: 'llama2-20m', config: template('llama2-20m'), seqLen: 1024, batch: 32, microBatch: 16, steps: steps(40), warmup: 5},
      {name: 'llama-1b', config: template('llama-1b'), seqLen: 1024, batch: 8, microBatch: 4, steps: steps(20), warmup: 4},
    ]
const ONLY = process.env.BENCH_GPU_MODELS?.split(',')
const CASES = ONLY ? MODELS.filter((m) => ONLY.includes(m.name)) : MODELS
const TESTNET = tiny ? {model: 'tiny-demo', rounds: Number(process.env.BENCH_GPU_ROUNDS ?? 2)} : {model: 'llama2-20m', rounds: Number(process.env.BENCH_GPU_ROUNDS ?? 20)}
const REPEATS = Number(process.env.BENCH_GPU_REPEATS ?? (tiny ? 1 : 2))
const PARTS = new Set((process.env.BENCH_GPU_PARTS ?? 'train,distro,testnet').split(','))
const THREADS = tiny ? 1 : undefined

async function python(script: string, args: string[]): Promise<Record<string, any>> {
  const r = await execa(workerPython(), [join(projectRoot, 'bench', script), ...args], {env: pythonEnv()})
  return JSON.parse(String(r.stdout).trim().split('\n').at(-1)!)
}

const probe = JSON.parse(
  String(
    (
      await execa(
        workerPython(),
        [
          '-c',
          'import json, torch; c = torch.cuda.is_available(); print(json.dumps({"cuda": c, "name": torch.cuda.get_device_name(0) if c else None, "torch": torch.__version__}))',
        ],
        {env: pythonEnv()},
      )
    ).stdout,
  ),
) as {cuda: boolean; name: string | null; torch: string}
if (device.startsWith('cuda') && !probe.cuda) {
  console.log('no CUDA device: skipped (bench/gpu.bench.ts needs a GPU; `--device cpu --tiny` runs its code path on CPU)')
  process.exit(0)
}

const corpus = await ensureDemoCorpus()
const rate = (seconds: number[], tokensPerStep: number) => (tokensPerStep * seconds.length) / seconds.reduce((a, b) => a + b, 0)

async function plainLoop(m: ModelCase): Promise<number> {
  const out = await python('plain_train_loop.py', [
    '--model-config',
    m.config,
    '--tokens',
    join(corpus.trainDir, '000.bin'),
    '--steps',
    String(m.steps),
    '--total-batch',
    String(m.batch),
    '--micro-batch',
    String(m.microBatch),
    '--seq-len',
    String(m.seqLen),
    '--device',
    device,
    '--precision',
    device.startsWith('cuda') ? 'bf16' : 'fp32',
    ...(THREADS ? ['--threads', String(THREADS)] : []),
  ])
  return rate(out.step_seconds.slice(m.warmup), out.tokens_per_step)
}

async function psycheTrain(m: ModelCase, metricsPath: string): Promise<{tokensPerSecond: number; firstLoss: number; lastLoss: number}> {
  const plan = await resolveTrainPlan({
    config: join(projectRoot, 'templates', 'tiny-demo', 'state.toml'),
    model: join(m.config, '..'),
    optimizer: 'adamw',
    steps: m.steps,
    totalBatch: m.batch,
    microBatch: m.microBatch,
    seqLen: m.seqLen,
    device,
    precision: 'auto',
    threads: THREADS,
    evalBatches: 1,
  })
  const summary = await runSingleNode(plan, {metricsPath})
  const lines = readFileSync(metricsPath, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l))
    .filter((l) => typeof l.step === 'number' && typeof l.elapsed_seconds === 'number')
  // wall time from the end of step `warmup` to the end of the last step: every overhead between steps counts
  const span = lines.at(-1).elapsed_seconds - lines[m.warmup - 1].elapsed_seconds
  return {tokensPerSecond: ((lines.length - m.warmup) * lines[0].tokens) / span, firstLoss: summary.firstLoss, lastLoss: summary.lastLoss}
}

/** A run directory for the testnet: the demo run (DisTrO, demo corpus) with the given model template. */
function testnetRunDir(model: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'psyche-gpu-bench-'))
  const state = readFileSync(join(projectRoot, 'templates', 'tiny-demo', 'state.toml'), 'utf8')
    .replace(/^run_id = .*$/m, 'run_id = "gpu-bench"')
    .replace(/^data_location = .*$/m, `data_location = { Local = ${JSON.stringify(corpus.trainDir)} }`)
    .replace(/^path = "model"$/m, `path = ${JSON.stringify(join(projectRoot, 'templates', model, 'model'))}`)
  if (!state.includes(corpus.trainDir) || !state.includes(join('templates', model, 'model'))) throw new Error('testnet run config: the demo state.toml changed shape')
  writeFileSync(join(dir, 'state.toml'), state)
  return dir
}

async function testnetPart(): Promise<void> {
  const runDir = testnetRunDir(TESTNET.model)
  try {
    // imported here: the libp2p stack loads only when the testnet runs
    const {runTestnet} = await import('../src/core/testnet/index.js')
    const summary = await runTestnet({clients: 2, config: runDir, rounds: TESTNET.rounds, threads: THREADS ?? 4, timeout: tiny ? 300 : 900})
    const losses = summary.rounds.flatMap((r) => Object.values(r.clients).map((c) => c.loss)).filter((l): l is number => l !== null)
    const last = summary.rounds.at(-1)
    const testnet = {
      model: TESTNET.model,
      clients: 2,
      rounds: summary.rounds.length,
      ended: summary.ended,
      wall_seconds: summary.wall_seconds,
      seconds_per_round: summary.wall_seconds / Math.max(1, summary.rounds.length),
      first_loss: losses[0] ?? null,
      last_loss: losses.at(-1) ?? null,
      hashes_equal: last?.hashes_equal ?? false,
      rounds_without_exchange: summary.rounds_without_exchange,
      // peers' results applied, summed over clients and rounds: > 0 only if the clients exchanged work
      results_applied: summary.rounds.reduce((n, r) => n + Object.values(r.clients).reduce((m, c) => m + (c.peers_applied ?? 0), 0), 0),
      result_bytes_per_round: summary.result_bytes_per_round,
    }
    report.testnet = testnet
    say(
      `testnet, 2 clients on one ${report.device}: ${testnet.rounds} rounds (${testnet.ended}) in ${testnet.wall_seconds.toFixed(1)} s, ` +
        `loss ${testnet.first_loss?.toFixed(3)} → ${testnet.last_loss?.toFixed(3)}, hashes equal: ${testnet.hashes_equal}, rounds without exchange: ${testnet.rounds_without_exchange}`,
    )
    if (summary.ended !== 'rounds' && summary.ended !== 'finished') process.exitCode = 1
  } finally {
    rmSync(runDir, {recursive: true, force: true})
  }
}

const work = mkdtempSync(join(tmpdir(), 'psyche-gpu-bench-metrics-'))
const report: Record<string, unknown> = {
  date: new Date().toISOString(),
  device: probe.cuda && device.startsWith('cuda') ? probe.name : 'cpu',
  torch: probe.torch,
  tiny,
  train: [] as unknown[],
  distro: [] as unknown[],
}
try {
  for (const m of CASES) {
    if (!PARTS.has('train')) break
    const runs = {plain: [] as number[], psyche: [] as number[]}
    let losses = {first: NaN, last: NaN}
    for (let i = 0; i < REPEATS; i++) {
      runs.plain.push(await plainLoop(m))
      const p = await psycheTrain(m, join(work, `${m.name}-${i}.jsonl`))
      runs.psyche.push(p.tokensPerSecond)
      losses = {first: p.firstLoss, last: p.lastLoss}
    }
    const best = {plain: Math.max(...runs.plain), psyche: Math.max(...runs.psyche)}
    const row = {model: m.name, seq_len: m.seqLen, batch: m.batch, micro_batch: m.microBatch, steps: m.steps, runs, best, ratio: best.psyche / best.plain, loss: losses}
    ;(report.train as unknown[]).push(row)
    say(
      `${m.name}: psyche train ${best.psyche.toFixed(0)} tok/s, plain loop ${best.plain.toFixed(0)} tok/s → ${(100 * row.ratio).toFixed(1)} % (target ≥ 95 %); loss ${losses.first.toFixed(3)} → ${losses.last.toFixed(3)}`,
    )
  }
  for (const m of CASES) {
    if (!PARTS.has('distro')) break

    const d = await python('gpu_distro.py', [
      '--model-config',
      m.config,
      '--device',
      device,
      '--seq-len',
      String(m.seqLen),
      '--batch',
      String(m.batch),
      '--micro-batch',
      String(m.microBatch),
      ...(tiny ? ['--warmup', '1', '--repeats', '2', '--threads', '1'] : []),
    ])
    ;(report.distro as unknown[]).push({model: m.name, ...d})
    say(
      `${m.name}: DisTrO compress ${d.compress_gb_per_s.toFixed(2)} GB/s, decode ${d.decode_gb_per_s.toFixed(2)} GB/s, decode+apply ${d.decompress_apply_gb_per_s.toFixed(2)} GB/s; ` +
        `share of a step ${Object.entries(d.distro_share as Record<string, number>)
          .map(([n, share]) => `${(100 * share).toFixed(1)} % (${n} results)`)
          .join(', ')} (target < 5 % at 1B)`,
    )
  }

  if (PARTS.has('testnet')) await testnetPart()
} finally {
  rmSync(work, {recursive: true, force: true})
}
console.log(JSON.stringify(report, null, jsonOnly ? 0 : 2))
