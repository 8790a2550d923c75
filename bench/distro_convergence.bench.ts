// DisTrO and SparseLoCo against AdamW at equal tokens on the demo corpus (templates/tiny-demo's model and data):
// BENCH_STEPS inner steps (default 1,200) × 16 sequences × 128 tokens for every row, the same data order and
// initialisation. Final train loss (mean of the last 60 inner steps: SparseLoCo's last 60 / H rounds) and validation
// loss on 32 held-out sequences, for AdamW on one node, DisTrO with 1 and 4 simulated peers (each step's batch split
// among the peers), and SparseLoCo with 4 simulated peers (templates/tiny-sparseloco: a round is H inner steps), with
// its results applied at once and one round late (--simulate-delay, as clients on a network apply them).
// Every row's Cosine schedule counts inner steps and ends at BENCH_STEPS. Loss numbers do not depend on machine load;
// the wall times do.
//
//   BENCH_STEPS=N          inner steps per row (a multiple of the SparseLoCo H)
//   BENCH_ONLY=PATTERN     only the rows whose name matches PATTERN, a regular expression (a word: the rows that contain
//                          it; 'peers$': not the one round late row). The others' rows are in bench/README.md
//   BENCH_THREADS=N        the worker's threads (default 2)
//   BENCH_ADAMW_LR=X       AdamW's base LR (default 3e-3, the best of a sweep)
//   BENCH_ADAMW='{"betas": [0.9, 0.99]}'   merged into AdamW's settings (real config fields only)
// SparseLoCo's settings are the template's; a sweep overrides them (real config fields only):
//   BENCH_SPARSELOCO='{"outer_lr": 0.7, "inner_steps": 20, ...}'   merged into [model.LLM.optimizer.SparseLoCo]
//   BENCH_SPARSELOCO_LR=X, BENCH_SPARSELOCO_WARMUP=N               the inner Cosine schedule's base_lr / warmup_steps
//   BENCH_SPARSELOCO_PEERS=N                                       simulated clients (default 4, the issue's)
import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import type {LrSchedule, OptimizerConfig} from '../src/core/config/index.js'
import {resolveTrainPlan, type TrainFlags, type TrainPlan} from '../src/core/train/plan.js'
import {runSingleNode} from '../src/core/train/single-node.js'
import {projectRoot} from '../src/core/worker/python.js'

const THREADS = Number(process.env.BENCH_THREADS ?? 2)
const STEPS = Number(process.env.BENCH_STEPS ?? 1200)
/** The run seed: the data order (and anything else random) derives from it; rerun with others to see the spread. */
const SEED = Number(process.env.BENCH_SEED ?? 0)
const BATCH = 16 // sequences per inner step (the templates' global batch)
const PEERS = Number(process.env.BENCH_SPARSELOCO_PEERS ?? 4)
const TRAIN_TAIL = 60 // inner steps the train loss is averaged over
const overrides = JSON.parse(process.env.BENCH_SPARSELOCO ?? '{}') as Record<string, unknown>
const adamwOverrides = JSON.parse(process.env.BENCH_ADAMW ?? '{}') as Record<string, unknown>
const envNumber = (name: string): number | undefined => (process.env[name] === undefined ? undefined : Number(process.env[name]))

type SparseLoCoTable = Extract<OptimizerConfig, {SparseLoCo: unknown}>['SparseLoCo']
type Cosine = Extract<LrSchedule, {Cosine: unknown}>['Cosine']

/** The plan's Cosine schedule ending at `total` inner steps, with optional base LR (scaling final_lr along) and warmup. */
function cosine(plan: TrainPlan, total: number, baseLr?: number, warmup?: number): LrSchedule {
  if (!('Cosine' in plan.lrSchedule)) throw new Error(`${plan.configPath}: the bench expects a Cosine schedule`)
  const c: Cosine = {...plan.lrSchedule.Cosine, total_steps: total}
  if (baseLr !== undefined) c.final_lr = (c.final_lr * baseLr) / c.base_lr
  if (baseLr !== undefined) c.base_lr = baseLr
  if (warmup !== undefined) c.warmup_steps = warmup
  return {Cosine: c}
}

interface Variant {
  name: string
  flags: TrainFlags
  /** SparseLoCo: its settings with the sweep's overrides. */
  sparseloco?: boolean
}
const variants: Variant[] = [
  // AdamW's best base LR at 1,200 steps from a sweep (bench/README.md); DisTrO uses the template's 5e-3
  {name: 'AdamW, 1 node', flags: {optimizer: 'adamw', lr: envNumber('BENCH_ADAMW_LR') ?? 3e-3}},
  {name: 'DisTrO, 1 peer', flags: {optimizer: 'distro'}},
  {name: 'DisTrO, 4 simulated peers', flags: {optimizer: 'distro', simulatePeers: 4}},
  {name: `SparseLoCo, ${PEERS} simulated peers`, flags: {template: 'tiny-sparseloco', simulatePeers: PEERS}, sparseloco: true},
  // the network path's one-round delay (each client's next inner steps start before the round's results are applied)
  {name: `SparseLoCo, ${PEERS} simulated peers, one round late`, flags: {template: 'tiny-sparseloco', simulatePeers: PEERS, simulateDelay: true}, sparseloco: true},
]
const only = process.env.BENCH_ONLY

const rows = []
for (const v of variants.filter((x) => !only || new RegExp(only).test(x.name))) {
  let plan = await resolveTrainPlan({...v.flags, threads: THREADS, evalBatches: 32, seed: SEED})
  let h = 1
  if (v.sparseloco) {
    if (!('SparseLoCo' in plan.optimizer)) throw new Error(`${plan.configPath}: not a SparseLoCo run`)
    const base = plan.optimizer.SparseLoCo
    const table = {...base, ...overrides, inner: {...base.inner, ...((overrides.inner as object) ?? {})}} as SparseLoCoTable
    h = table.inner_steps
    // a round trains H global batches: batch ids [r·16H, (r+1)·16H), the same sequences as 16H steps of the others
    plan = {...plan, optimizer: {SparseLoCo: table}, totalBatch: BATCH * h, microBatch: Math.min(plan.microBatch, BATCH * h)}
    plan.lrSchedule = cosine(plan, STEPS, envNumber('BENCH_SPARSELOCO_LR'), envNumber('BENCH_SPARSELOCO_WARMUP'))
  } else {
    plan.lrSchedule = cosine(plan, STEPS)
    if ('AdamW' in plan.optimizer) plan = {...plan, optimizer: {AdamW: {...plan.optimizer.AdamW, ...adamwOverrides}}}
  }
  if (plan.totalBatch !== BATCH * h) throw new Error(`${v.name}: global batch ${plan.totalBatch}, expected ${BATCH * h}`)
  if (STEPS % h) throw new Error(`BENCH_STEPS=${STEPS} is not a multiple of SparseLoCo's H = ${h}`)
  plan.steps = STEPS / h
  const metricsPath = join(projectRoot, '.cache', 'bench', `convergence-${process.pid}-${rows.length}.jsonl`)
  const s = await runSingleNode(plan, {metricsPath})
  const losses = readFileSync(metricsPath, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l).loss as number)
  const last = losses.slice(-Math.max(1, Math.round(TRAIN_TAIL / h)))
  const trainLoss = last.reduce((a, b) => a + b, 0) / last.length
  const resultBytes = s.distro?.resultBytes
  rows.push({
    name: v.name,
    innerSteps: STEPS,
    rounds: s.steps,
    tokens: s.tokens,
    trainLoss,
    valLoss: s.valLoss!,
    wallSeconds: s.wallSeconds,
    bytesPerPeerRound: resultBytes,
    bytesPerToken: resultBytes === undefined ? undefined : (resultBytes * s.steps) / s.tokens,
    compression: s.distro?.compression,
    optimizer: plan.optimizer,
    lrSchedule: plan.lrSchedule,
  })
  console.error(`${v.name}: train ${trainLoss.toFixed(3)}, validation ${s.valLoss!.toFixed(3)}, ${s.wallSeconds.toFixed(0)} s`)
}
const base = rows[0].valLoss // the first row run (AdamW unless BENCH_ONLY leaves it out)
console.log(JSON.stringify({date: new Date().toISOString().slice(0, 10), threads: THREADS, rows}, null, 2))
console.log('\n| run | tokens | rounds | inner steps | train loss | validation loss | vs first row | bytes / peer / round | bytes / peer / token | wall |')
console.log('|---|---|---|---|---|---|---|---|---|---|')
for (const r of rows) {
  const rel = ((r.valLoss / base - 1) * 100).toFixed(1)
  console.log(
    `| ${r.name} | ${r.tokens.toLocaleString('en-US')} | ${r.rounds.toLocaleString('en-US')} | ${r.innerSteps.toLocaleString('en-US')} | ${r.trainLoss.toFixed(3)} | ${r.valLoss.toFixed(3)} | ${r === rows[0] ? '—' : `${Number(rel) >= 0 ? '+' : ''}${rel} %`} | ${r.bytesPerPeerRound ? Math.round(r.bytesPerPeerRound).toLocaleString('en-US') : '—'} | ${r.bytesPerToken ? r.bytesPerToken.toFixed(3) : '—'} | ${r.wallSeconds.toFixed(0)} s |`,
  )
}
