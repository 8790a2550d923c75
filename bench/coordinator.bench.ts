// Coordinator cost with 256, 1,000 and 10,000 clients: a tick that changes nothing, each phase
// transition (epoch start, first round, round → round), accepting a witness proof and a health
// check, and the helpers clients call. The core is pure, so one state can be ticked many times.
import {cpus} from 'node:os'
import {
  applyEvent,
  assignBatches,
  batchRangeFor,
  buildWitnessProof,
  createCoordinator,
  selectWitnesses,
  serializeState,
  type CoordinatorEvent,
  type CoordinatorState,
} from '../src/core/coordinator/index.js'
import type {CoordinatorConfig, LLMConfig} from '../src/core/config/index.js'

const config: CoordinatorConfig = {
  warmup_time: 10,
  cooldown_time: 5,
  epoch_time: 100_000,
  max_round_train_time: 30,
  round_witness_time: 2,
  min_clients: 1,
  init_min_clients: 1,
  witness_nodes: 0,
  verification_percent: 0,
  global_batch_size_start: 20_000,
  global_batch_size_end: 20_000,
  global_batch_size_warmup_tokens: 0,
  total_steps: 1_000_000,
  waiting_for_members_extra_time: 1,
}
const llm: LLMConfig = {
  architecture: 'HfLlama',
  data_type: 'Pretraining',
  max_seq_len: 2048,
  cold_start_warmup_steps: 0,
  checkpoint: {Hub: {repo_id: 'org/model'}},
  data_location: {Server: '127.0.0.1:20001'},
  lr_schedule: {Constant: {base_lr: 1e-4, warmup_steps: 0, warmup_init_lr: 0}},
  optimizer: {AdamW: {betas: [0.9, 0.95], weight_decay: 0, eps: 1e-8}},
}

function must(state: CoordinatorState, event: CoordinatorEvent, now: number): CoordinatorState {
  const r = applyEvent(state, event, now)
  if (r.error) throw new Error(`${event.type}: ${r.error.message}`)
  return r.state
}

/** Milliseconds per call: median and max over `reps` calls of `fn` (after one warm-up call). */
function time(reps: number, fn: () => unknown): {median: number; max: number; first: number} {
  let t = performance.now()
  fn()
  const first = performance.now() - t
  const samples: number[] = []
  for (let i = 0; i < reps; i++) {
    t = performance.now()
    fn()
    samples.push(performance.now() - t)
  }
  samples.sort((a, b) => a - b)
  return {median: samples[Math.floor(reps / 2)], max: samples[reps - 1], first}
}

const fmt = (ms: number) => (ms < 0.1 ? `${(ms * 1000).toFixed(0)} µs` : `${ms.toFixed(2)} ms`)
const rows: string[][] = []

for (const n of [256, 1_000, 10_000]) {
  const ids = Array.from({length: n}, (_, i) => `client-${i.toString().padStart(5, '0')}-${'x'.repeat(44)}`)
  let s = createCoordinator({run_id: 'bench', run_state: 'WaitingForMembers', config, model: {LLM: llm}}, {now: 0})
  const joinTime = time(0, () => {
    for (const id of ids) s = must(s, {type: 'join', id}, 0)
  }).first
  const waiting = s
  const epochStart = time(20, () => applyEvent(waiting, {type: 'tick'}, 5_000))
  const warm = applyEvent(waiting, {type: 'tick'}, 5_000).state
  const firstRound = time(20, () => applyEvent(warm, {type: 'tick'}, 20_000))
  let train = applyEvent(warm, {type: 'tick'}, 20_000).state
  const idle = time(200, () => applyEvent(train, {type: 'tick'}, 21_000))

  const round = train.epoch.round!
  const seen = [...assignBatches(train)].map(([id, range]) => ({id, range, commitment: Buffer.alloc(32, 1)}))
  const proof = buildWitnessProof(train.config, round, seen)
  const witnesses = selectWitnesses(train)
  const witnessEvent = time(20, () => applyEvent(train, {type: 'witness', from: witnesses[witnesses.length - 1], step: round.step, proof}, 21_000))
  for (const w of witnesses) train = must(train, {type: 'witness', from: w, step: round.step, proof}, 21_000)
  const inWitness = train.run_state === 'RoundWitness' ? train : must(train, {type: 'tick'}, 60_000)
  const at = inWitness.run_state_start + config.round_witness_time * 1000
  const roundTransition = time(20, () => applyEvent(inWitness, {type: 'tick'}, at))
  const second = applyEvent(inWitness, {type: 'tick'}, at).state
  const health = time(20, () => applyEvent(second, {type: 'health_check', from: ids[0], accused: [ids[1]]}, at))

  const assignAll = time(5, () => assignBatches({...second, epoch: {...second.epoch, round: {...second.epoch.round!}}}))
  const rangeOne = time(50, () => batchRangeFor(second, ids[n - 1]))
  const select = time(5, () => selectWitnesses({...second, epoch: {...second.epoch, round: {...second.epoch.round!}}}))
  const serialized = serializeState(second)
  const ser = time(10, () => serializeState(second))

  rows.push([
    n.toLocaleString('en-US'),
    fmt(idle.median),
    `${fmt(roundTransition.median)} (max ${fmt(roundTransition.max)})`,
    fmt(epochStart.median),
    fmt(firstRound.median),
    fmt(witnessEvent.median),
    fmt(health.median),
    fmt(assignAll.median),
    fmt(rangeOne.median),
    fmt(select.median),
    `${fmt(ser.median)} / ${(serialized.length / 1024).toFixed(0)} KiB`,
    fmt(joinTime / n),
  ])
}

const header = [
  'clients',
  'tick (no change)',
  'round → round tick',
  'epoch start tick',
  'first round tick',
  'witness proof',
  'health check',
  'assignBatches (all)',
  'batchRangeFor (one)',
  'selectWitnesses',
  'serialize / size',
  'join (each)',
]
console.log(`coordinator bench: ${cpus()[0]?.model ?? 'unknown CPU'}, ${cpus().length} cores, node ${process.version}`)
console.log(`| ${header.join(' | ')} |`)
console.log(`| ${header.map(() => '---').join(' | ')} |`)
for (const row of rows) console.log(`| ${row.join(' | ')} |`)
