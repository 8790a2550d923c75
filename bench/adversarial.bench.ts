// `npm run bench -- adversarial`: four DisTrO peers on the demo corpus (templates/tiny-demo model and data),
// each a real worker process, exchanging results in-process with the client's own defenses (validateResult,
// ResultIntake copy/replay checks, τemplar-style scoring by a verifier with the Scorer's moving averages and
// threshold). Measures (1) honest peers' score and index-overlap distributions, from which the thresholds are
// set, and (2) validation loss at equal steps, honest-only against 1 attacker of 4 for each attack.
// BENCH_ROUNDS (default 40) rounds of 16 sequences × 128 tokens. BENCH_ATTACKS (comma-separated, default all) picks
// the runs. Also times the verifier's scoring (score_results) against its own training of the round: the scoring cost.
// BENCH_PEERS (default 4) peers; BENCH_VERIFICATION_SAMPLE: the verifier (peer 0) scores the results the run's rule
// assigns it (coordinator/rules.ts assignedTrainers, verification_percent 100, this K; default the run's default), or
// with `all` every other peer's result (the rule before issue 25's bounded sample).
import {randomBytes} from 'node:crypto'
import {ensureDemoCorpus} from '../src/core/corpus.js'
import {openDataProvider} from '../src/core/data/index.js'
import {sha256Hex} from '../src/core/primitives/announcement.js'
import {resolveTrainPlan} from '../src/core/train/plan.js'
import {shuffleSeedFor} from '../src/core/train/single-node.js'
import {ResultIntake} from '../src/core/verify/intake.js'
import {validateResult, type ResultFormat} from '../src/core/verify/result.js'
import {indexOverlap, indexSample} from '../src/core/verify/copy.js'
import {roundScale, scoreOf, Scorer} from '../src/core/verify/score.js'
import {ModelWorker} from '../src/core/worker/model-worker.js'
import {nearCopy, randomWellFormed, signFlipped} from '../test/adversarial/forge.js'
import {assignedTrainers, DEFAULT_VERIFICATION_SAMPLE} from '../src/core/coordinator/rules.js'
import type {CoordinatorState, Round} from '../src/core/coordinator/types.js'

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 40)
const PEERS = Number(process.env.BENCH_PEERS ?? 4)
const SAMPLE = process.env.BENCH_VERIFICATION_SAMPLE === 'all' ? 'all' : Number(process.env.BENCH_VERIFICATION_SAMPLE ?? DEFAULT_VERIFICATION_SAMPLE)
/** What assignedTrainers reads of a run: its config (every peer verifies; K = SAMPLE). */
const RUN = {config: {verification_percent: 100, verification_sample: SAMPLE === 'all' ? undefined : SAMPLE}} as unknown as CoordinatorState
/** Round `step` as the rule sees it: every peer a trainer with batches, a seed per step. */
const roundOf = (step: number, roster: string[]): Round => ({
  step,
  height: step - 1,
  data_index: (step - 1) * PEERS * PER_PEER,
  batch_size: PEERS * PER_PEER,
  seed: sha256Hex(Buffer.from(`bench round ${step}`)),
  started_at: 0,
  roster,
  witnesses: [],
  accusations: [],
  excluded: [],
  complete_witnesses: 0,
})
const PER_PEER = 4
await ensureDemoCorpus()
const plan = await resolveTrainPlan({template: 'tiny-demo', optimizer: 'distro', threads: 1, device: 'cpu'})
const data = await openDataProvider(plan.data as never, {seqLen: plan.seqLen, baseDir: plan.dataBaseDir, shuffleSeed: shuffleSeedFor(1), wrap: true})
const EVAL_IDS = Array.from({length: 32}, (_, i) => 1_000_000 + i)
const evalTokens = await data.getSamples(EVAL_IDS)

type Attack = 'none' | 'garbage' | 'random' | 'sign_flip' | 'copy' | 'wrong_batches' | 'replay' | 'oversized'
const ALL_ATTACKS: Attack[] = ['none', 'garbage', 'random', 'sign_flip', 'copy', 'wrong_batches', 'replay', 'oversized']
const ATTACKS: Attack[] = process.env.BENCH_ATTACKS ? (process.env.BENCH_ATTACKS.split(',') as Attack[]) : ALL_ATTACKS
for (const a of ATTACKS) if (!ALL_ATTACKS.includes(a)) throw new Error(`BENCH_ATTACKS: unknown attack ${a}; one of ${ALL_ATTACKS.join(', ')}`)

async function startPeers(): Promise<{workers: ModelWorker[]; format: ResultFormat}> {
  const workers = await Promise.all(Array.from({length: PEERS}, () => ModelWorker.start({threads: 1, device: 'cpu', label: 'bench'})))
  let format: ResultFormat | undefined
  for (const w of workers) {
    if (plan.model.kind === 'dir') await w.load(plan.model.dir, 1)
    else await w.initFromConfig(plan.model.config, 1)
    const r = await w.configure({
      optimizer: plan.optimizer as Record<string, unknown>,
      lr_schedule: plan.lrSchedule as Record<string, unknown>,
      micro_batch: 4,
      delay_correction: true,
    })
    format = r.resultFormat
  }
  return {workers, format: format!}
}

interface RunResult {
  attack: Attack
  valLoss: number
  honestScores: number[]
  attackerScores: number[]
  overlaps: number[]
  /** The attacker's result's largest overlap with an honest result of its round (copies: near 1). */
  attackerOverlaps: number[]
  /** Raw gains (loss before − after) on the assigned and on the random batch, per scored result. */
  honestGains: [number, number][]
  attackerGains: [number, number][]
  detectedAt: number | null
  excludedResults: number
  /** Per round after the first: the verifier's (peer 0) own trainRound, and its score_results call with how many results it scored. */
  trainMs: number[]
  scoreMs: number[]
  scored: number[]
}

async function run(attack: Attack): Promise<RunResult> {
  const {workers, format} = await startPeers()
  const intake = new ResultIntake(format)
  const scorer = new Scorer()
  const ids = Array.from({length: PEERS}, (_, p) => `p${p}`)
  const attacker = attack === 'none' ? -1 : 3
  let previous: Uint8Array[] | undefined
  let firstAttackerResult: Uint8Array | undefined
  const out: RunResult = {
    attack,
    valLoss: NaN,
    honestScores: [],
    attackerScores: [],
    overlaps: [],
    attackerOverlaps: [],
    honestGains: [],
    attackerGains: [],
    detectedAt: null,
    excludedResults: 0,
    trainMs: [],
    scoreMs: [],
    scored: [],
  }
  let ejected = false
  try {
    for (let step = 1; step <= ROUNDS; step++) {
      const results: Uint8Array[] = []
      for (let p = 0; p < PEERS; p++) {
        const start = (step - 1) * PEERS * PER_PEER + p * PER_PEER
        let batch = Array.from({length: PER_PEER}, (_, i) => start + i)
        if (p === attacker && attack === 'wrong_batches') batch = batch.map((b) => b + 500_000)
        const tokens = await data.getSamples(batch)
        const t0 = performance.now()
        const r = await workers[p].trainRound(tokens, PER_PEER, step, previous ? {applyStep: step - 1, results: previous} : undefined)
        if (p === 0 && step > 1) out.trainMs.push(performance.now() - t0)
        let bytes: Uint8Array = r.result
        if (p === attacker) {
          firstAttackerResult ??= bytes
          if (attack === 'garbage') bytes = randomBytes(bytes.length)
          if (attack === 'random') bytes = randomWellFormed(bytes, format)
          if (attack === 'sign_flip') bytes = signFlipped(bytes, format)
          if (attack === 'copy') bytes = nearCopy(results[0], format)
          if (attack === 'replay') bytes = firstAttackerResult
          if (attack === 'oversized') bytes = Buffer.concat([bytes, Buffer.alloc(65_536)])
        }
        results.push(bytes)
      }
      // Index overlap before any filtering: honest pairs (the threshold's data), and the attacker's against honest results.
      const valid = results.map((b) => (validateResult(b, format).ok ? indexSample(b, format) : undefined))
      for (let i = 0; i < PEERS; i++) {
        for (let j = i + 1; j < PEERS; j++) {
          if (i === attacker || j === attacker || !valid[i] || !valid[j]) continue
          out.overlaps.push(indexOverlap(valid[i]!, valid[j]!))
        }
      }
      if (attacker >= 0 && valid[attacker]) {
        out.attackerOverlaps.push(Math.max(...valid.filter((v, i) => v && i !== attacker).map((v) => indexOverlap(valid[attacker]!, v!))))
      }
      // What every honest client does with the round's results: validate, then a verifier scores them.
      const accepted: {p: number; bytes: Uint8Array}[] = []
      for (const [p, bytes] of results.entries()) {
        const commitment = sha256Hex(bytes)
        const problem = !validateResult(bytes, format).ok ? 'invalid' : intake.bytes({client_id: ids[p], step, commitment}, bytes)
        if (problem !== undefined || (p === attacker && ejected)) {
          out.excludedResults++
          continue
        }
        accepted.push({p, bytes})
      }
      // The verifier (peer 0, a verifier of the next round) scores the other peers' results assigned to it.
      const mine = SAMPLE === 'all' ? new Set(ids.slice(1)) : new Set(assignedTrainers(RUN, roundOf(step + 1, ids), roundOf(step, ids), ids[0]))
      const scoredHere = accepted.filter((a) => mine.has(ids[a.p]))
      if (scoredHere.length > 0) {
        const batches = []
        for (const a of scoredHere) {
          const start = (step - 1) * PEERS * PER_PEER + a.p * PER_PEER
          batches.push({tokens: await data.getSamples(Array.from({length: PER_PEER}, (_, i) => start + i)), rows: PER_PEER})
        }
        const randomStart = 2_000_000 + step * 64
        batches.push({tokens: await data.getSamples(Array.from({length: PER_PEER}, (_, i) => randomStart + i)), rows: PER_PEER})
        const t0 = performance.now()
        const {before, after} = await workers[0].scoreResults(
          step,
          scoredHere.map((a) => a.bytes),
          batches,
        )
        if (step > 1) (out.scoreMs.push(performance.now() - t0), out.scored.push(scoredHere.length))
        const all = scoredHere.map((_, j) => ({assigned: {before: before[j], after: after[j]![0]}, random: {before: before[scoredHere.length], after: after[j]![1]}}))
        const scale = roundScale(all)
        for (const [j, a] of scoredHere.entries()) {
          const l = all[j]
          const score = scoreOf(l, scale)
          const gains: [number, number] = [l.assigned.before - l.assigned.after, l.random.before - l.random.after]
          scorer.add(ids[a.p], score)
          if (a.p === attacker) (out.attackerScores.push(score), out.attackerGains.push(gains))
          else (out.honestScores.push(score), out.honestGains.push(gains))
        }
      }
      if (attacker >= 0 && !ejected && scorer.lowScorers().includes(ids[attacker])) {
        ejected = true
        out.detectedAt = step
      }
      // The attacker's result of a round it is caught in is excluded (the coordinator excludes in-flight results).
      previous = accepted.filter((a) => !(ejected && a.p === attacker)).map((a) => a.bytes)
      if (ejected && accepted.some((a) => a.p === attacker)) out.excludedResults++
      const falsely = scorer.lowScorers().filter((id) => id !== ids[attacker])
      if (falsely.length) console.error(`${attack}: honest peers below the threshold at step ${step}: ${falsely.join(', ')}`)
    }
    await workers[0].applyResults(ROUNDS, previous ?? [])
    out.valLoss = (await workers[0].evaluate(evalTokens, EVAL_IDS.length)).loss
  } finally {
    await Promise.all(workers.map((w) => w.shutdown()))
  }
  return out
}

function quantiles(xs: number[]): string {
  if (xs.length === 0) return '—'
  const s = [...xs].sort((a, b) => a - b)
  const q = (f: number) => s[Math.min(s.length - 1, Math.floor(f * s.length))].toFixed(3)
  return `min ${s[0].toFixed(3)} · p5 ${q(0.05)} · median ${q(0.5)} · max ${s[s.length - 1].toFixed(3)} (n=${s.length})`
}

const rows: RunResult[] = []
for (const attack of ATTACKS) {
  const r = await run(attack)
  rows.push(r)
  console.error(
    `${attack}: validation loss ${r.valLoss.toFixed(4)}, detected at ${r.detectedAt ?? '—'}, honest scores ${quantiles(r.honestScores)}, attacker ${quantiles(r.attackerScores)}`,
  )
}
await data.close()
const base = rows[0].valLoss
console.log(
  JSON.stringify(
    {date: new Date().toISOString().slice(0, 10), rounds: ROUNDS, rows},
    (k, v) => (k.endsWith('Gains') ? undefined : Array.isArray(v) && typeof v[0] === 'number' && v.length > 8 ? quantiles(v) : v),
    2,
  ),
)
const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0)
const scoreMs = sum(rows.flatMap((r) => r.scoreMs))
const scoredResults = sum(rows.flatMap((r) => r.scored))
const trainMs = sum(rows.flatMap((r) => r.trainMs))
const roundsTimed = rows.flatMap((r) => r.trainMs).length
console.log(
  `\nScoring cost (verifier = peer 0, rounds 2..${ROUNDS}): ${(scoreMs / scoredResults).toFixed(0)} ms per scored result (${(scoredResults / roundsTimed).toFixed(1)} results per round, ${(scoreMs / roundsTimed).toFixed(0)} ms per round); its own training of a round ${(trainMs / roundsTimed).toFixed(0)} ms; scoring = ${((100 * scoreMs) / trainMs).toFixed(0)}% of that`,
)
console.log(`\nHonest peers' scores (all runs): ${quantiles(rows.flatMap((r) => r.honestScores))}`)
console.log(`Honest peers' index overlap (pairs of results, all runs): ${quantiles(rows.flatMap((r) => r.overlaps))}`)
for (const r of rows) if (r.attackerOverlaps.length) console.log(`${r.attack}: the attacker's largest overlap with an honest result: ${quantiles(r.attackerOverlaps)}`)
const raw = (g: [number, number][]) => g.map(([a, b]) => `${a.toExponential(2)}/${b.toExponential(2)}`).join(' ')
console.log(`\nRaw gains (assigned/random), honest: ${raw(rows.flatMap((r) => r.honestGains))}`)
for (const r of rows) if (r.attackerGains.length) console.log(`${r.attack} attacker gains: ${raw(r.attackerGains)}`)
console.log(
  `\n| attack (1 of ${PEERS} peers) | validation loss after ${ROUNDS} rounds | vs honest-only | attacker detected at round | attacker's results excluded | attacker's scores |`,
)
console.log('|---|---|---|---|---|---|')
for (const r of rows) {
  const rel = ((r.valLoss / base - 1) * 100).toFixed(2)
  console.log(
    `| ${r.attack === 'none' ? 'none (honest-only)' : r.attack} | ${r.valLoss.toFixed(4)} | ${r === rows[0] ? '—' : `${Number(rel) >= 0 ? '+' : ''}${rel}%`} | ${r.detectedAt ?? '—'} | ${r.excludedResults} | ${r.attack === 'none' ? '—' : quantiles(r.attackerScores)} |`,
  )
}
