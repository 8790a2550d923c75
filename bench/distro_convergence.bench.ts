// DisTrO against AdamW at equal tokens on the demo corpus (templates/tiny-demo, 300 steps × 16 × 128
// tokens): final train loss (mean of the last 20 steps) and validation loss on 32 held-out sequences,
// for AdamW on one node, DisTrO with 1 and 4 simulated peers (the batch split among the peers), and SparseLoCo.
// Loss numbers do not depend on machine load; the wall times do.
import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {resolveTrainPlan, type TrainFlags} from '../src/core/train/plan.js'
import {runSingleNode} from '../src/core/train/single-node.js'
import {projectRoot} from '../src/core/worker/python.js'

const THREADS = Number(process.env.BENCH_THREADS ?? 2)
// AdamW's best base LR on this setup from a small sweep (3e-3 beat 5e-3); DisTrO uses the template's 5e-3
const variants: {name: string; flags: TrainFlags}[] = [
  {name: 'AdamW, 1 node', flags: {optimizer: 'adamw', lr: 3e-3}},
  {name: 'DisTrO, 1 peer', flags: {optimizer: 'distro'}},
  {name: 'DisTrO, 4 simulated peers', flags: {optimizer: 'distro', simulatePeers: 4}},
  // τemplar's settings (H = 30): 10 rounds of 30 inner steps on 16 sequences each, the same 300 × 16 sequences
  {name: 'SparseLoCo H = 30, 4 simulated peers', flags: {optimizer: 'sparseloco', simulatePeers: 4, steps: 10}},
]
// BENCH_ONLY: run the variants whose name contains it (the others' rows are in bench/README.md)
const only = process.env.BENCH_ONLY

const rows = []
for (const v of variants.filter((x) => !only || x.name.includes(only))) {
  const plan = await resolveTrainPlan({...v.flags, threads: THREADS, evalBatches: 32})
  const metricsPath = join(projectRoot, '.cache', 'bench', `convergence-${rows.length}.jsonl`)
  const s = await runSingleNode(plan, {metricsPath})
  const losses = readFileSync(metricsPath, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l).loss as number)
  const last = losses.slice(-20) // SparseLoCo's 10 rounds: all of them
  const trainLoss = last.reduce((a, b) => a + b, 0) / last.length
  rows.push({
    name: v.name,
    steps: s.steps,
    tokens: s.tokens,
    trainLoss,
    valLoss: s.valLoss!,
    wallSeconds: s.wallSeconds,
    bytesPerPeerStep: s.distro?.resultBytes,
    compression: s.distro?.compression,
  })
  console.error(`${v.name}: train ${trainLoss.toFixed(3)}, validation ${s.valLoss!.toFixed(3)}`)
}
const base = rows[0].valLoss // the first row run (AdamW unless BENCH_ONLY leaves it out)
console.log(JSON.stringify({date: new Date().toISOString().slice(0, 10), rows}, null, 2))
console.log('\n| run | tokens | train loss (last 20 steps) | validation loss | vs AdamW | bytes / peer / step | vs dense fp32 |')
console.log('|---|---|---|---|---|---|---|')
for (const r of rows) {
  const rel = ((r.valLoss / base - 1) * 100).toFixed(1)
  console.log(
    `| ${r.name} | ${r.tokens.toLocaleString('en-US')} | ${r.trainLoss.toFixed(3)} | ${r.valLoss.toFixed(3)} | ${r === rows[0] ? '—' : `${Number(rel) >= 0 ? '+' : ''}${rel}%`} | ${r.bytesPerPeerStep ? Math.round(r.bytesPerPeerStep).toLocaleString('en-US') : '—'} | ${r.compression ? `${Math.round(r.compression)}× smaller` : '—'} |`,
  )
}
